package media

import (
	"context"
	"runtime"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"
)

// With every place taken by a removal that has not finished, one more
// waits for a place before it runs; once one finishes it runs, and no
// more than blobRemovalsInFlight ever run at once.
// Mutation killed: places without a bound (the extra removal runs while
// every other is still held: one more than the bound at once).
func TestBlobRemovalsInFlightAreBounded(t *testing.T) {
	t.Parallel()
	b := newBlobRemovals()
	var running, peak atomic.Int32
	entered := make(chan struct{}, 2*blobRemovalsInFlight)
	release := make(chan struct{}, 2*blobRemovalsInFlight)
	held := func(context.Context) {
		n := running.Add(1)
		for p := peak.Load(); n > p && !peak.CompareAndSwap(p, n); p = peak.Load() {
		}
		entered <- struct{}{}
		<-release
		running.Add(-1)
	}
	for range blobRemovalsInFlight {
		b.start(held)
	}
	for range blobRemovalsInFlight {
		<-entered
	}
	extraStarted := make(chan struct{})
	go func() { b.start(held); close(extraStarted) }()
	// Either the extra removal waits for a place or it ran: whichever
	// comes first says which.
	for {
		b.mu.Lock()
		waiting := b.waiting
		b.mu.Unlock()
		if waiting == 1 || len(entered) > 0 {
			break
		}
		runtime.Gosched()
	}
	require.Empty(t, entered, "a removal ran while %d others held every place", blobRemovalsInFlight)
	require.EqualValues(t, blobRemovalsInFlight, running.Load())

	release <- struct{}{}
	<-extraStarted
	<-entered
	for range blobRemovalsInFlight {
		release <- struct{}{}
	}
	require.NoError(t, b.wait(context.Background()))
	require.EqualValues(t, 0, running.Load())
	require.EqualValues(t, blobRemovalsInFlight, peak.Load())
}

// A removal still running when wait's context ends is abandoned: its
// context ends, and wait says so; one started later runs on a fresh one.
// Mutation killed: wait returning without ending the removals' context
// (the held removal never sees its context end).
func TestBlobRemovalsAbandonedWhenWaitEnds(t *testing.T) {
	t.Parallel()
	b := newBlobRemovals()
	sawEnd := make(chan error, 1)
	entered := make(chan struct{})
	b.start(func(ctx context.Context) {
		close(entered)
		<-ctx.Done()
		sawEnd <- ctx.Err()
	})
	<-entered
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	require.ErrorIs(t, b.wait(ctx), context.Canceled)
	require.ErrorIs(t, <-sawEnd, context.Canceled)
	require.NoError(t, b.wait(context.Background()))

	ran := make(chan error, 1)
	b.start(func(ctx context.Context) { ran <- ctx.Err() })
	require.NoError(t, <-ran, "a removal after the abandon runs on a live context")
	require.NoError(t, b.wait(context.Background()))
}
