package main

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// Once a publisher's presigned supply runs low, the refill signs one chunk
// per request, not the whole shortfall: sixteen publishers topping up
// together spent a second of both cores signing inside the timed run.
// Mutation killed: a refill that fills the supply back to its capacity
// (late would be 301 here, not refillChunk).
func TestRefillSignsOneChunkAtATime(t *testing.T) {
	t.Parallel()
	s, err := newSigner()
	require.NoError(t, err)
	src, err := newEventSource(eventSpec{signer: s, runID: "refill", contentBytes: 64, prefill: 400, budget: 1000})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	src.start(ctx)

	// 301 taken leaves 99, below a quarter of 400: exactly one refill asked.
	for range 301 {
		_, ok := src.take(ctx)
		require.True(t, ok)
	}
	require.Eventually(t, func() bool { return src.late.Load() == refillChunk }, time.Minute, time.Millisecond)
	time.Sleep(50 * time.Millisecond)
	require.EqualValues(t, refillChunk, src.late.Load(), "one request, one chunk")
	require.Len(t, src.out, 99+refillChunk)
}
