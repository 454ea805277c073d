package eventstore_test

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/buzzrelay/buzz/internal/db"
	"github.com/buzzrelay/buzz/internal/dbtest"
	"github.com/buzzrelay/buzz/internal/eventstore"
	"github.com/buzzrelay/buzz/internal/nostr"
)

// BenchmarkSearchAtScale times NIP-50 searches (limit 10) over
// BUZZ_BENCH_SEARCH_EVENTS kind-1 events (default 200,000) for a word in
// 90% of them, one in 5%, one in 0.1% and one in none, with the default
// candidate bound and with every match ranked. Loading a million rows takes
// a few minutes:
//
//	BUZZ_BENCH_SEARCH_EVENTS=1000000 go run ./internal/dbtest/withcluster -- go test ./internal/eventstore -run '^$' -bench SearchAtScale -benchtime 1x
func BenchmarkSearchAtScale(b *testing.B) {
	n := 200_000
	if v := os.Getenv("BUZZ_BENCH_SEARCH_EVENTS"); v != "" {
		var err error
		if n, err = strconv.Atoi(v); err != nil {
			b.Fatalf("BUZZ_BENCH_SEARCH_EVENTS: %v", err)
		}
	}
	pool := dbtest.Pool(b)
	ctx := context.Background()
	c, err := db.New(pool).CommunityCreate(ctx, "search.example")
	if err != nil {
		b.Fatal(err)
	}
	// Ids, keys and signatures are random bytes of the right length: the
	// search never verifies them.
	_, err = pool.Exec(ctx, `
INSERT INTO events (community_id, id, pubkey, created_at, kind, tags, content, sig)
SELECT $1, decode(md5(i::text) || md5('id' || i), 'hex'), decode(md5((i % 500)::text) || md5('pk' || (i % 500)), 'hex'),
       to_timestamp(1700000000 + i), 1, '[]'::jsonb,
       CASE WHEN i % 10 = 0 THEN '' ELSE 'lorem ipsum dolor sit amet ' END
         || 'common' || (i % 20) || ' rare' || (i % 1000) || ' consectetur adipiscing elit sed do eiusmod tempor incididunt ut labore',
       decode(repeat(md5(i::text), 4), 'hex')
FROM generate_series(1, $2::int) AS i`, c.ID, n)
	if err != nil {
		b.Fatal(err)
	}
	if _, err := pool.Exec(ctx, "VACUUM ANALYZE events"); err != nil {
		b.Fatal(err)
	}
	store := eventstore.New(pool, 500)
	limit := 10
	b.ResetTimer()
	for range b.N {
		for _, candidates := range []int{eventstore.DefaultSearchCandidates, 1 << 30} {
			store.SearchCandidates = candidates
			label := strconv.Itoa(candidates)
			if candidates == 1<<30 {
				label = "all"
			}
			for _, term := range []string{"lorem", "common7", "rare42", "absent"} {
				var ds []time.Duration
				runs := 20
				if label == "all" {
					runs = 5 // seconds each for a common word at a million events
				}
				for range runs {
					start := time.Now()
					err := store.Query(ctx, c.ID, eventstore.Scope{}, nostr.Filters{{Search: term, Limit: &limit}}, func(*nostr.Event, *uuid.UUID) error { return nil })
					if err != nil {
						b.Fatal(err)
					}
					ds = append(ds, time.Since(start))
				}
				slices.Sort(ds)
				p50, p99 := ds[len(ds)/2], ds[len(ds)-1] // p99 of 20 runs: the slowest
				b.ReportMetric(float64(p99)/float64(time.Millisecond), fmt.Sprintf("p99_ms_%s_%s", label, term))
				b.Logf("%d events, candidates %s, %q: p50 %.2f ms, p99 %.2f ms", n, label, term,
					float64(p50)/float64(time.Millisecond), float64(p99)/float64(time.Millisecond))
			}
		}
	}
	b.ReportMetric(0, "ns/op")
}
