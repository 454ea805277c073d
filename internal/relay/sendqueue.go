package relay

import (
	"sync"
	"time"
)

// sendQueue holds a connection's outgoing messages in the order they were
// queued: live deliveries and replies to the client's own requests.
//
// Two costs it avoids, both paid by every idle connection before: channels
// sized for the worst case (1,024 live and 256 reply slots, about 30 KB
// allocated up front) and a writer goroutine parked for the connection's
// whole life (its stack). The slice grows with use, and a writer runs only
// while there is something to write.
type sendQueue struct {
	mu      sync.Mutex
	pending []queued
	// live counts the live deliveries queued and not yet written: the
	// slow-client bound applies to them only, so a long history being
	// read never counts against it.
	live int
	// liveBytes is what those deliveries hold: a stalled client pins the
	// events queued for it, up to 256 KB each.
	liveBytes int
	// writing is set while a writer goroutine runs; draining once the
	// relay shuts down (the writer then flushes and closes 1001); closed
	// when the connection ended (nothing is queued any more).
	writing, draining, closed bool
	// spare is an emptied batch kept for reuse, so a busy connection does
	// not allocate a slice per batch.
	spare []queued
}

type queued struct {
	// msg is the message, or, for an event sent under subID, the event's
	// JSON (a live event's shared by every subscriber): the writer wraps it
	// in its envelope only when writing.
	msg   []byte
	subID string
	reply bool // a reply: its bytes count against the reply budget
	// queuedAt is when a live delivery was queued (monoNow), for the
	// queue-to-socket histogram.
	queuedAt int64
}

// monoEpoch anchors monoNow.
var monoEpoch = time.Now()

// monoNow is a monotonic clock reading in nanoseconds: cheaper to keep per
// queued message than a time.Time.
func monoNow() int64 { return int64(time.Since(monoEpoch)) }

// keepSpare is the largest batch capacity kept for reuse; a larger batch,
// after a burst, is left to the collector.
const keepSpare = 64

// pushLive queues a live delivery unless limit live deliveries are
// already waiting, or it would take those waiting past limitBytes (one
// delivery alone is always taken); startWriter reports whether the caller
// must start the writer. A delivery to a connection that ended is dropped
// as if written.
func (q *sendQueue) pushLive(m queued, limit, limitBytes int) (ok, startWriter bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.closed {
		return true, false
	}
	if q.live >= limit || q.live > 0 && q.liveBytes+len(m.msg) > limitBytes {
		return false, false
	}
	q.live++
	q.liveBytes += len(m.msg)
	q.pending = append(q.pending, m)
	return true, q.claimWriter()
}

// pushReply queues a reply whose bytes the caller reserved; ok is false
// when the connection ended (the caller gives the bytes back).
func (q *sendQueue) pushReply(m queued) (ok, startWriter bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.closed {
		return false, false
	}
	m.reply = true
	q.pending = append(q.pending, m)
	return true, q.claimWriter()
}

// drain marks the queue draining; startWriter as for the pushes.
func (q *sendQueue) drain() (startWriter bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.closed || q.draining {
		return false
	}
	q.draining = true
	return q.claimWriter()
}

// claimWriter makes the caller responsible for starting the writer when
// none runs (q.mu held).
func (q *sendQueue) claimWriter() bool {
	if q.writing {
		return false
	}
	q.writing = true
	return true
}

// take hands the writer everything queued, in order, and takes back the
// previous batch for reuse. With nothing queued it ends the writer's run
// (done), telling it whether the relay is draining.
func (q *sendQueue) take(prev []queued) (batch []queued, done, draining bool) {
	clear(prev) // the messages are written; do not keep them reachable
	q.mu.Lock()
	defer q.mu.Unlock()
	if cap(prev) <= keepSpare && cap(prev) > cap(q.spare) {
		q.spare = prev[:0]
	}
	if len(q.pending) == 0 || q.closed {
		q.writing = false
		return nil, true, q.draining && !q.closed
	}
	batch, q.pending, q.spare = q.pending, q.spare, nil
	return batch, false, false
}

// wroteFirst records that the first message queued, a live delivery, was
// written by the goroutine that queued it (finished: all of it; else the
// socket holds back its tail). keepWriting tells it to start the writer:
// more was queued meanwhile, the tail waits, or the relay is draining.
// A queue closed meanwhile already counted the message as left.
func (q *sendQueue) wroteFirst(finished bool) (keepWriting bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.closed {
		q.writing = false
		return false
	}
	q.live--
	q.liveBytes -= len(q.pending[0].msg)
	n := copy(q.pending, q.pending[1:])
	q.pending[n] = queued{}
	q.pending = q.pending[:n]
	if n > 0 || !finished || q.draining {
		return true
	}
	q.writing = false
	return false
}

// written records that a live delivery of size bytes left the queue.
func (q *sendQueue) written(size int) {
	q.mu.Lock()
	q.live--
	q.liveBytes -= size
	q.mu.Unlock()
}

// close stops queueing and returns what was never taken.
func (q *sendQueue) close() []queued {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.closed = true
	left := q.pending
	q.pending, q.spare = nil, nil
	return left
}
