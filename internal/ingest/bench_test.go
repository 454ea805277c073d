package ingest_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/buzzrelay/buzz/internal/community"
	"github.com/buzzrelay/buzz/internal/db"
	"github.com/buzzrelay/buzz/internal/dbtest"
	"github.com/buzzrelay/buzz/internal/eventstore"
	"github.com/buzzrelay/buzz/internal/fanout"
	"github.com/buzzrelay/buzz/internal/ingest"
	"github.com/buzzrelay/buzz/internal/nostr"
)

// presigned returns n signed kind-1 events by a few authors, signed before
// the clock starts.
func presigned(b *testing.B, n int) []*nostr.Event {
	b.Helper()
	keys := make([]*nostr.SecretKey, 16)
	for i := range keys {
		keys[i], _ = nostr.GenerateSecretKey()
	}
	events := make([]*nostr.Event, n)
	now := time.Now().Unix()
	for i := range events {
		events[i] = &nostr.Event{Kind: 1, CreatedAt: now, Content: fmt.Sprintf("bench %d with some text to look like a message", i), Tags: nostr.Tags{{"t", "bench"}}}
		if err := events[i].Sign(keys[i%len(keys)]); err != nil {
			b.Fatal(err)
		}
	}
	return events
}

func benchTenant(b *testing.B) (*ingest.Pipeline, community.Tenant, *db.Queries) {
	cfg, err := pgxpool.ParseConfig(dbtest.URL(b))
	if err != nil {
		b.Fatal(err)
	}
	cfg.MaxConns = 20 // the relay's default pool size
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(pool.Close)
	row, err := db.New(pool).CommunityCreate(context.Background(), fmt.Sprintf("bench-%d.example", time.Now().UnixNano()))
	if err != nil {
		b.Fatal(err)
	}
	return ingest.New(pool, fanout.NewHub(), ingest.Options{MaxFutureSkew: time.Minute}), community.FromRow(row), db.New(pool)
}

// BenchmarkSubmit is the write spine without the WebSocket: verify, insert
// (one autocommit statement for kind 1), fan-out to nobody. 16 goroutines
// like buzz-bench's 16 publishers.
func BenchmarkSubmit(b *testing.B) {
	p, tenant, _ := benchTenant(b)
	events := presigned(b, b.N)
	var next atomic.Int64
	b.SetParallelism(8) // x GOMAXPROCS(2) = 16 writers
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			ev := events[next.Add(1)-1]
			if _, err := p.Submit(context.Background(), tenant, ev.PubKey, ev); err != nil {
				b.Error(err)
			}
		}
	})
}

// BenchmarkEventInsert is the database's share alone: the same INSERT
// without verification or fan-out.
func BenchmarkEventInsert(b *testing.B) {
	_, tenant, q := benchTenant(b)
	events := presigned(b, b.N)
	var next atomic.Int64
	b.SetParallelism(8)
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			ev := events[next.Add(1)-1]
			params, err := eventstore.InsertParams(tenant.ID(), ev, nil)
			if err == nil {
				_, err = q.EventInsert(context.Background(), params)
			}
			if err != nil {
				b.Error(err)
			}
		}
	})
}

// BenchmarkVerify is the CPU's share alone.
func BenchmarkVerify(b *testing.B) {
	events := presigned(b, 64)
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		i := 0
		for pb.Next() {
			if err := events[i%len(events)].Verify(); err != nil {
				b.Error(err)
			}
			i++
		}
	})
}
