package workflow

import (
	"context"
	"errors"
	"time"
)

// DefaultStepTimeout is the deadline of a step whose definition sets no
// timeout_secs.
const DefaultStepTimeout = 300 * time.Second

// errStepTimeout is the cause a step's context is cancelled with when its
// deadline passes.
var errStepTimeout = errors.New("workflow step deadline passed")

// stepDeadline bounds the work of one step: its transaction (database
// reads and writes, lock waits included) and, for call_webhook, the HTTP
// call. Waits that hold nothing (a delay, an approval) are not steps at
// work: the run is parked unclaimed, and only the transaction that parks
// it runs under the deadline.
//
// The limit is known only once the step's definition is loaded inside the
// transaction, so the context is cancellable from the start and armed
// then, measured from the step's start. It counts real elapsed time, like
// the HTTP client's own timeout: it bounds work in flight, not scheduled
// time, so it does not follow the engine's injectable clock.
type stepDeadline struct {
	ctx    context.Context
	cancel context.CancelCauseFunc
	start  time.Time
	timer  *time.Timer
	stepID string
	limit  time.Duration
}

func startStep(parent context.Context) *stepDeadline {
	ctx, cancel := context.WithCancelCause(parent)
	return &stepDeadline{ctx: ctx, cancel: cancel, start: time.Now()}
}

// arm starts the countdown for step stepID with its limit.
// A step transaction run again arms it again, still from the step's start.
func (d *stepDeadline) arm(stepID string, limit time.Duration) {
	if d.timer != nil {
		d.timer.Stop()
	}
	d.stepID, d.limit = stepID, limit
	d.timer = time.AfterFunc(d.remaining(), func() { d.cancel(errStepTimeout) })
}

// remaining is the time left before the deadline.
func (d *stepDeadline) remaining() time.Duration {
	return max(d.limit-time.Since(d.start), 0)
}

// expired reports whether the deadline cut the step short.
func (d *stepDeadline) expired() bool { return errors.Is(context.Cause(d.ctx), errStepTimeout) }

func (d *stepDeadline) failure() *runFailure {
	return fail(CodeStepTimeout, "step %s did not finish within its timeout of %s", d.stepID, d.limit)
}

// stop releases the timer and the context once the step is over.
func (d *stepDeadline) stop() {
	if d.timer != nil {
		d.timer.Stop()
	}
	d.cancel(nil)
}

// timeoutOf is a step's deadline: its timeout_secs, else the engine's
// default.
func (e *Engine) timeoutOf(s *Step) time.Duration {
	if s.TimeoutSecs > 0 {
		return time.Duration(s.TimeoutSecs) * time.Second
	}
	return e.stepTimeout
}
