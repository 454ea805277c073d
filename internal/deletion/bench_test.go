package deletion_test

import (
	"context"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/buzzrelay/buzz/internal/db"
	"github.com/buzzrelay/buzz/internal/dbtest"
	"github.com/buzzrelay/buzz/internal/deletion"
	"github.com/buzzrelay/buzz/internal/media"
)

// vmHWM is the process's peak resident set (kB), from /proc.
func vmHWM() int64 {
	raw, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return -1
	}
	for _, line := range strings.Split(string(raw), "\n") {
		if rest, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			n, _ := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(rest), "kB")), 10, 64)
			return n
		}
	}
	return -1
}

// peakHeap samples the Go heap while fn runs.
func peakHeap(fn func()) (peak uint64) {
	var stop atomic.Bool
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		var m runtime.MemStats
		for !stop.Load() {
			runtime.ReadMemStats(&m)
			if m.HeapInuse > peak {
				peak = m.HeapInuse
			}
			time.Sleep(20 * time.Millisecond)
		}
	}()
	fn()
	stop.Store(true)
	wg.Wait()
	return peak
}

func insertEvents(b *testing.B, pool *pgxpool.Pool, community uuid.UUID, n int) {
	b.Helper()
	const step = 100000
	for from := 0; from < n; from += step {
		to := min(from+step, n)
		_, err := pool.Exec(context.Background(), `INSERT INTO events (community_id, id, pubkey, created_at, kind, tags, content, sig)
			SELECT $1, sha256(int8send(i) || $4::bytea), '\x`+strings.Repeat("ab", 32)+`', '2026-01-01T00:00:00Z'::timestamptz + i * interval '1 ms',
			       1, '[]', 'message number ' || i, '\x`+strings.Repeat("cd", 64)+`'
			FROM generate_series($2::bigint, $3::bigint - 1) i`, community, from, to, community[:])
		require.NoError(b, err)
	}
}

// Deleting a community of 10,001 objects and 1,000,000 events, and ones of
// 10,001 and 100,001 objects without events (to compare peak heap against
// the object count).
// Run: go run ./internal/dbtest/withcluster -- go test -run '^$' -bench BenchmarkDeleteCommunity -benchtime 1x ./internal/deletion/
func BenchmarkDeleteCommunity(b *testing.B) {
	for _, size := range []struct{ objects, events int }{{10001, 1000000}, {10001, 0}, {100001, 0}} {
		b.Run(fmt.Sprintf("objects=%d/events=%d", size.objects, size.events), func(b *testing.B) {
			for i := 0; i < b.N; i++ {
				b.StopTimer()
				ctx := context.Background()
				pool := dbtest.Pool(b)
				q := db.New(pool)
				host := fmt.Sprintf("bench-%d.test", i)
				row, err := q.CommunityCreate(ctx, host)
				require.NoError(b, err)
				dir, err := os.MkdirTemp("/dev/shm", "buzz-bench-")
				if err != nil {
					dir = b.TempDir()
				}
				defer os.RemoveAll(dir)
				writeUploadRecordsB(b, dir, row.ID, size.objects)
				insertEvents(b, pool, row.ID, size.events)
				_, err = pool.Exec(ctx, "ANALYZE events")
				require.NoError(b, err)
				store, err := media.NewFSStore(dir)
				require.NoError(b, err)
				req, err := deletion.Submit(ctx, pool, store, host, "bench", "")
				require.NoError(b, err)
				_, err = deletion.Approve(ctx, pool, req.ID, "bench", "")
				require.NoError(b, err)
				runtime.GC()
				b.StartTimer()
				start := time.Now()
				var out deletion.Outcome
				heap := peakHeap(func() {
					out, err = deletion.NewExecutor(deletion.Options{Pool: pool, Store: store, Config: deletion.DefaultConfig()}).Run(ctx, req.ID)
				})
				elapsed := time.Since(start)
				b.StopTimer()
				require.NoError(b, err)
				require.Equal(b, deletion.StageRetentionPending, out.Stage)
				b.ReportMetric(elapsed.Seconds(), "s/deletion")
				b.ReportMetric(float64(heap)/(1<<20), "peak-heap-MB")
				b.ReportMetric(float64(vmHWM())/1024, "process-peak-RSS-MB")
			}
		})
	}
}

func writeUploadRecordsB(b *testing.B, dir string, community uuid.UUID, n int) {
	b.Helper()
	for i := 0; i < n; i++ {
		p := fmt.Sprintf("%s/_uploads/%s/%064x", dir, community, i)
		require.NoError(b, os.MkdirAll(p, 0o750))
		require.NoError(b, os.WriteFile(p+"/01J00000000000000000000000.json", []byte(`{"pubkey":"x"}`), 0o600))
	}
}

// The write fence's cost on ingest: events a second, one transaction per
// event (an event row and a mention row, as the write spine does), four
// writers, with the fence triggers and then with them disabled, same run.
// Run: go run ./internal/dbtest/withcluster -- go test -run '^$' -bench BenchmarkFenceIngestCost -benchtime 20000x ./internal/deletion/
func BenchmarkFenceIngestCost(b *testing.B) {
	ctx := context.Background()
	pool := dbtest.Pool(b)
	q := db.New(pool)
	row, err := q.CommunityCreate(ctx, "ingest.test")
	require.NoError(b, err)
	var seq atomic.Int64
	ingest := func(b *testing.B) {
		b.SetParallelism(2) // with GOMAXPROCS 2: four writers
		start := time.Now()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				i := seq.Add(1)
				tx, err := pool.Begin(ctx)
				if err != nil {
					b.Error(err)
					return
				}
				_, err = tx.Exec(ctx, `INSERT INTO events (community_id, id, pubkey, created_at, kind, tags, content, sig)
					VALUES ($1, sha256(int8send($2::bigint)), '\x`+strings.Repeat("ab", 32)+`', now(), 1, '[]', 'hello', '\x`+strings.Repeat("cd", 64)+`')`, row.ID, i)
				if err == nil {
					_, err = tx.Exec(ctx, `INSERT INTO event_mentions (community_id, pubkey_hex, event_id, event_created_at, event_kind)
						VALUES ($1, $3, sha256(int8send($2::bigint)), now(), 1)`, row.ID, i, strings.Repeat("ef", 32))
				}
				if err == nil {
					err = tx.Commit(ctx)
				}
				if err != nil {
					_ = tx.Rollback(ctx)
					b.Error(err)
					return
				}
			}
		})
		b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "events/s")
	}
	b.Run("fenced", ingest)
	b.Run("unfenced", func(b *testing.B) {
		for _, t := range []string{"events", "event_mentions"} {
			_, err := pool.Exec(ctx, "ALTER TABLE "+t+" DISABLE TRIGGER _community_write_fence")
			require.NoError(b, err)
		}
		ingest(b)
	})
	b.Run("fenced-again", func(b *testing.B) {
		for _, t := range []string{"events", "event_mentions"} {
			_, err := pool.Exec(ctx, "ALTER TABLE "+t+" ENABLE TRIGGER _community_write_fence")
			require.NoError(b, err)
		}
		ingest(b)
	})
}
