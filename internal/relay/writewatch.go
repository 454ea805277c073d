package relay

import (
	"sync/atomic"
	"time"
)

// writeWatch closes a connection whose batch write outlives the write
// timeout (a client that stopped reading, its socket buffers full).
//
// A timer reset at the start of every batch and stopped at its end costs
// two operations on the runtime's timer heap per batch; fanning one event
// out to 1,000 subscribers is 1,000 batches of one message each. Instead a
// batch records when it began, and the one timer per connection is armed
// only when none is pending: when it fires, a batch still running that
// began less than a timeout ago moves it to that batch's deadline, and an
// idle connection lets it lapse until the next batch arms it again. A
// batch is still cut off one timeout after it began.
type writeWatch struct {
	timeout time.Duration
	now     func() int64          // monoNow, or a test's clock
	arm     func(d time.Duration) // fire after d
	expire  func()                // a batch outlived the timeout
	started atomic.Int64          // when the running batch began, as now() + 1; 0 between batches
	armed   atomic.Bool           // a fire is pending
}

// begin marks the start of a batch.
func (w *writeWatch) begin() {
	w.started.Store(w.now() + 1)
	if !w.armed.Load() && w.armed.CompareAndSwap(false, true) {
		w.arm(w.timeout)
	}
}

// end marks the end of the batch.
func (w *writeWatch) end() { w.started.Store(0) }

// fire runs when the timer goes off.
func (w *writeWatch) fire() {
	started := w.started.Load()
	if started == 0 {
		w.lapse()
		return
	}
	if left := w.timeout - time.Duration(w.now()+1-started); left > 0 {
		w.arm(left)
		return
	}
	w.expire()
}

// lapse lets the timer go while no batch runs.
func (w *writeWatch) lapse() {
	w.armed.Store(false)
	// A batch that began since fire found none saw the timer still
	// pending and did not arm it: arm it now.
	if w.started.Load() != 0 && w.armed.CompareAndSwap(false, true) {
		w.arm(w.timeout)
	}
}
