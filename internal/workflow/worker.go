package workflow

import (
	"context"
	"time"

	"github.com/google/uuid"
)

// Worker limits. The hand-off only speeds up the first step: a run that
// does not fit is found by the poll, so the channel stays small.
const (
	handoffCapacity = 64
	claimErrorSleep = time.Second
)

// WorkerOptions are a worker's settings.
type WorkerOptions struct {
	// MaxInFlight is how many runs one worker executes at once.
	MaxInFlight int
	// Poll is how often an idle worker looks for due runs (delays ending,
	// runs created by another process, leases expired).
	Poll time.Duration
}

// Defaults for WorkerOptions left zero (the relay's configuration sets them).
const (
	DefaultMaxInFlight = 100
	DefaultPoll        = time.Second
)

// Worker runs an Engine: claimed runs from hand-offs (runs this process
// just created) and from the poll, at most MaxInFlight at a time.
type Worker struct {
	engine  *Engine
	opts    WorkerOptions
	handoff chan uuid.UUID
}

// NewWorker returns a worker over e.
func NewWorker(e *Engine, opts WorkerOptions) *Worker {
	if opts.MaxInFlight <= 0 {
		opts.MaxInFlight = DefaultMaxInFlight
	}
	if opts.Poll <= 0 {
		opts.Poll = DefaultPoll
	}
	return &Worker{engine: e, opts: opts, handoff: make(chan uuid.UUID, handoffCapacity)}
}

// Offer hands committed run ids to the worker without blocking; ids that
// do not fit are left to the poll. Call it only after the transaction that
// created the runs committed. A nil Worker takes nothing.
func (w *Worker) Offer(ids []uuid.UUID) {
	if w == nil {
		return
	}
	for _, id := range ids {
		select {
		case w.handoff <- id:
		default:
			return
		}
	}
}

// Run executes runs until ctx ends, then waits for the runs in flight.
// Runs in flight finish their current step on shutdown (their context is
// detached), so a step is never cut between its effect and its record.
func (w *Worker) Run(ctx context.Context) {
	done := make(chan struct{}, w.opts.MaxInFlight)
	inflight := 0
	execCtx := context.WithoutCancel(ctx)
	start := func(claims []Claimed) {
		for _, c := range claims {
			inflight++
			go func() {
				defer func() { done <- struct{}{} }()
				w.engine.execute(execCtx, ctx.Done(), c)
			}()
		}
	}
	poll := time.NewTimer(0)
	defer poll.Stop()
	for {
		free := w.opts.MaxInFlight - inflight
		var pollC <-chan time.Time
		var handoffC <-chan uuid.UUID
		if free > 0 {
			pollC, handoffC = poll.C, w.handoff
		}
		select {
		case <-ctx.Done():
			for ; inflight > 0; inflight-- {
				<-done
			}
			return
		case <-done:
			inflight--
		case <-pollC:
			claims, err := w.engine.ClaimDue(ctx, free)
			switch {
			case err != nil:
				if ctx.Err() == nil {
					w.engine.log.Error("workflow run poll failed", "err", err)
				}
				poll.Reset(claimErrorSleep)
			case len(claims) > 0:
				start(claims)
				poll.Reset(0)
			default:
				poll.Reset(w.opts.Poll)
			}
		case id := <-handoffC:
			ids := []uuid.UUID{id}
			for len(ids) < free {
				select {
				case more := <-w.handoff:
					ids = append(ids, more)
					continue
				default:
				}
				break
			}
			claims, err := w.engine.ClaimByID(ctx, ids)
			if err != nil {
				w.engine.log.Debug("workflow hand-off claim failed", "ids", len(ids), "err", err)
			}
			start(claims)
		}
	}
}
