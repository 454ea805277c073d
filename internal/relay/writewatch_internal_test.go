package relay

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// fakeWatch is a writeWatch on a clock the test moves, recording every
// arming and expiry instead of running a timer.
type fakeWatch struct {
	writeWatch
	clock   int64
	arms    []time.Duration
	expired int
}

func newFakeWatch(timeout time.Duration) *fakeWatch {
	f := &fakeWatch{}
	f.timeout = timeout
	f.now = func() int64 { return f.clock }
	f.arm = func(d time.Duration) { f.arms = append(f.arms, d) }
	f.expire = func() { f.expired++ }
	return f
}

func (f *fakeWatch) at(d time.Duration) *fakeWatch { f.clock = int64(d); return f }

// Batches in a row arm the timer once; when it fires it moves to the
// running batch's own deadline, and cuts that batch off once it has run a
// whole timeout.
// Mutations killed: arming on every batch; expiring without looking at
// when the running batch began; re-arming for a whole timeout instead of
// what is left of the batch's.
func TestWriteWatchFollowsTheRunningBatch(t *testing.T) {
	t.Parallel()
	w := newFakeWatch(10 * time.Second)
	w.at(0).begin()
	w.end()
	w.at(time.Second).begin() // still running when the timer fires
	require.Equal(t, []time.Duration{10 * time.Second}, w.arms, "armed once for both batches")
	w.at(10 * time.Second).fire()
	require.Zero(t, w.expired, "the running batch began 9 s ago")
	require.Equal(t, []time.Duration{10 * time.Second, time.Second}, w.arms, "moved to that batch's deadline")
	w.at(11 * time.Second).fire()
	require.Equal(t, 1, w.expired, "a whole timeout after the batch began")
}

// A timer that fires between batches lapses, and the next batch arms it
// again.
// Mutations killed: the timer re-armed while idle; a lapsed timer never
// armed again (the next stuck batch would never be cut off).
func TestWriteWatchLapsesWhileIdleAndRearms(t *testing.T) {
	t.Parallel()
	w := newFakeWatch(10 * time.Second)
	w.at(0).begin()
	w.end()
	w.at(10 * time.Second).fire()
	require.Equal(t, []time.Duration{10 * time.Second}, w.arms, "not re-armed while idle")
	w.at(12 * time.Second).begin()
	require.Equal(t, []time.Duration{10 * time.Second, 10 * time.Second}, w.arms, "the next batch arms it")
	w.at(22 * time.Second).fire()
	require.Equal(t, 1, w.expired)
}

// A batch that begins while a firing timer is lapsing is still watched.
// Mutation killed: the lapse not checking for a batch begun meanwhile.
func TestWriteWatchBatchBegunDuringALapseIsWatched(t *testing.T) {
	t.Parallel()
	w := newFakeWatch(10 * time.Second)
	w.at(0).begin()
	w.end()
	// fire finds no batch running; before it lapses, a batch begins and,
	// seeing the timer still pending, does not arm it.
	w.at(10 * time.Second)
	require.Zero(t, w.started.Load())
	w.begin()
	require.Len(t, w.arms, 1)
	w.lapse()
	require.Equal(t, []time.Duration{10 * time.Second, 10 * time.Second}, w.arms, "armed for the batch begun meanwhile")
	w.at(20 * time.Second).fire()
	require.Equal(t, 1, w.expired)
}
