package relay_test

import (
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/buzzrelay/buzz/internal/relaytest"
)

// peakHeapDuring samples the Go heap in use while fn runs and returns its
// peak above what was in use before.
func peakHeapDuring(fn func()) (grew uint64) {
	base := heapInUse()
	var (
		peak atomic.Uint64
		stop atomic.Bool
		wg   sync.WaitGroup
	)
	wg.Go(func() {
		var m runtime.MemStats
		for !stop.Load() {
			runtime.ReadMemStats(&m)
			if m.HeapInuse > peak.Load() {
				peak.Store(m.HeapInuse)
			}
			time.Sleep(5 * time.Millisecond)
		}
	})
	fn()
	stop.Store(true)
	wg.Wait()
	return max(peak.Load(), base) - base
}

// A catch-up after a lost subscription holds a batch of the gap's events
// at a time, not the whole gap: up to 10,000 events of up to 256 KB each,
// read at once, in every relay process at once when Redis returns (or in
// the one Redis disconnected for lagging behind a flood of large events),
// was gigabytes. Not parallel: it measures the process's heap.
// Mutation killed: reading the gap in one statement (its 60 MB of events
// are all held at once).
func TestCatchUpHoldsABatchOfTheGapAtATime(t *testing.T) {
	r := relaytest.Start(t)
	subscriber := r.Dial(t, r.Host)
	subscriber.Auth(nil)
	// A live subscription makes the community one to catch up on; it
	// matches none of the gap's events, so only the catch-up holds them.
	subscriber.Send("REQ", "live", map[string]any{"kinds": []int{7}, "limit": 0})
	subscriber.Expect("EOSE")

	const events, size = 300, 200_000
	// Stored straight into the database, as other processes would.
	_, err := r.Pool.Exec(t.Context(), `INSERT INTO events (community_id, id, pubkey, created_at, kind, tags, content, sig)
		SELECT $1, sha256(int8send(i) || $2::bytea), '\x`+strings.Repeat("ab", 32)+`', now() - i * interval '1 ms',
		       1, '[]', repeat('x', $3), '\x`+strings.Repeat("cd", 64)+`'
		FROM generate_series(1, $4::int) i`, r.CommunityID, r.CommunityID[:], size, events)
	require.NoError(t, err)

	now := time.Now()
	var replayed int
	grew := peakHeapDuring(func() {
		replayed, err = r.Server.CatchUp(t.Context(), now.Add(-time.Minute), now)
	})
	require.NoError(t, err)
	require.Equal(t, events, replayed, "every event of the gap is handed on")
	t.Logf("the catch-up of %d MB of events grew the heap by %.1f MB at most", events*size>>20, float64(grew)/(1<<20))
	require.Less(t, grew, uint64(20<<20), "the catch-up held more than a batch of the gap's events at once")
	subscriber.ExpectSilence(100*time.Millisecond, "the subscription matched none of them")
}
