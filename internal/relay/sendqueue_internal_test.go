package relay

import (
	"encoding/binary"
	"math"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// Pushers racing a writer that runs only while there is something to
// write: every message is written exactly once, each pusher's messages in
// its order, never by two writers at once, and none is left queued without
// a writer.
// Mutations killed: take not ending the writer's run under the lock (a
// push that sees a running writer which then exits strands its message:
// the wait times out); claimWriter starting a writer while one runs (two
// writers at once); take handing out a batch twice (a duplicate).
func TestSendQueueOneWriterNothingStranded(t *testing.T) {
	t.Parallel()
	const pushers, each = 8, 2000
	var q sendQueue
	var mu sync.Mutex
	got := make([][]uint32, pushers)
	var running, maxRunning, written atomic.Int32
	var writer func()
	writer = func() {
		n := running.Add(1)
		for m := maxRunning.Load(); n > m && !maxRunning.CompareAndSwap(m, n); m = maxRunning.Load() {
		}
		defer running.Add(-1)
		var batch []queued
		for {
			var done bool
			batch, done, _ = q.take(batch)
			if done {
				return
			}
			for _, m := range batch {
				p, i := binary.BigEndian.Uint32(m.msg), binary.BigEndian.Uint32(m.msg[4:])
				mu.Lock()
				got[p] = append(got[p], i)
				mu.Unlock()
				written.Add(1)
				if !m.reply {
					q.written(len(m.msg))
				}
			}
		}
	}
	var wg sync.WaitGroup
	for p := range pushers {
		wg.Go(func() {
			for i := range each {
				msg := binary.BigEndian.AppendUint32(binary.BigEndian.AppendUint32(nil, uint32(p)), uint32(i))
				var start bool
				if i%2 == 0 {
					_, start = q.pushReply(queued{msg: msg})
				} else {
					var ok bool
					ok, start = q.pushLive(queued{msg: msg}, pushers*each, math.MaxInt)
					require.True(t, ok)
				}
				if start {
					go writer()
				}
			}
		})
	}
	wg.Wait()
	require.Eventually(t, func() bool { return written.Load() == pushers*each }, 30*time.Second, time.Millisecond,
		"messages stranded without a writer")
	require.EqualValues(t, 1, maxRunning.Load(), "never two writers at once")
	for p := range pushers {
		require.Len(t, got[p], each)
		for i, v := range got[p] {
			require.EqualValues(t, i, v, "pusher %d's messages out of order", p)
		}
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	require.Zero(t, q.live, "every live delivery accounted for")
}
