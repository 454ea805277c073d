package ingest_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
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
	p, tenant, pool := benchTenantPool(b)
	return p, tenant, db.New(pool)
}

// benchTenantPool is benchTenant with the pipeline's own pool, for a
// benchmark that reads the database the pipeline writes.
func benchTenantPool(b *testing.B) (*ingest.Pipeline, community.Tenant, *pgxpool.Pool) {
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
	return ingest.New(pool, fanout.NewHub(), ingest.Options{MaxFutureSkew: time.Minute}), community.FromRow(row), pool
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

// BenchmarkJoinLargeChannel is one client joining an open channel of 8,000
// members with fresh keys, one join after another (go test -bench
// JoinLargeChannel -benchtime 200x): ns/op is a join's round trip, so
// 1e9/(ns/op) the joins a second one flooding client sustains, and
// writer-ms/join the group writer's time per join (GroupStats.Took).
// "inline" writes the lists in every join's transaction, as below
// DefaultListFoldMembers; "folded" marks them due, and fold-ms is one
// FoldChannelLists writing them afterwards.
func BenchmarkJoinLargeChannel(b *testing.B) {
	for _, mode := range []struct {
		name        string
		foldMembers int
	}{{"inline", 1 << 30}, {"folded", ingest.DefaultListFoldMembers}} {
		b.Run(mode.name, func(b *testing.B) {
			pool, p, tenant, ch := largeChannel(b, ingest.Options{ListFoldMembers: mode.foldMembers}, 8000)
			var writerTime atomic.Int64
			p.OnGroup = func(s ingest.GroupStats) { writerTime.Add(int64(s.Took)) }
			timeJoins(b, p, tenant, ch, &writerTime)
			if _, err := pool.Exec(context.Background(), `UPDATE channel_lists_due SET due_at = now()`); err != nil {
				b.Fatal(err)
			}
			start := time.Now()
			if _, err := p.FoldChannelLists(context.Background()); err != nil {
				b.Fatal(err)
			}
			b.ReportMetric(float64(time.Since(start).Microseconds())/1e3, "fold-ms")
		})
	}
}

// BenchmarkFoldLargeChannel is one fold (FoldChannelLists) of a channel of
// 8,000, 20,000, 50,000 and 100,000 (the default member limit) members (go
// test -bench FoldLargeChannel -benchtime 5x): ns/op is the fold's time,
// which must stay well inside the write timeout for a large channel's lists
// ever to be written.
func BenchmarkFoldLargeChannel(b *testing.B) {
	for _, members := range []int{8000, 20000, 50000, ingest.DefaultMaxChannelMembers} {
		b.Run(fmt.Sprintf("members=%d", members), func(b *testing.B) {
			pool, p, tenant, ch := largeChannel(b, ingest.Options{ListFoldMembers: 1}, members)
			for b.Loop() {
				if _, err := pool.Exec(context.Background(), `INSERT INTO channel_lists_due (community_id, channel_id, due_at) VALUES ($1, $2, now())`, tenant.ID(), ch); err != nil {
					b.Fatal(err)
				}
				n, err := p.FoldChannelLists(context.Background())
				if err != nil {
					b.Fatal(err)
				}
				if n != 1 {
					b.Fatalf("folded %d channels", n)
				}
			}
		})
	}
}

// BenchmarkJoinNearMemberLimit is one client joining an open channel of
// 10,000, 50,000 and 99,000 members with fresh keys, one join after another,
// under the default member limit (go test -bench JoinNearMemberLimit
// -benchtime 50x): writer-ms/join is the group writer's time per join,
// which includes checking the channel's member count under its row lock.
func BenchmarkJoinNearMemberLimit(b *testing.B) {
	for _, members := range []int{10000, 50000, 99000} {
		b.Run(fmt.Sprintf("members=%d", members), func(b *testing.B) {
			pool, p, tenant, ch := largeChannel(b, ingest.Options{}, members)
			var writerTime atomic.Int64
			p.OnGroup = func(s ingest.GroupStats) { writerTime.Add(int64(s.Took)) }
			if _, err := pool.Exec(context.Background(), `VACUUM ANALYZE channel_members`); err != nil {
				b.Fatal(err)
			}
			timeJoins(b, p, tenant, ch, &writerTime)
		})
	}
}

// largeChannel is a community of its own, a pipeline on it (opts, with a
// future skew of an hour and an hour between fold passes), and an open
// channel of members members: its creator, then the rest inserted without
// the member triggers (each row's would update the channel's row again in
// one transaction, quadratic in members), so the channel's count of its
// active members is set by hand.
func largeChannel(b *testing.B, opts ingest.Options, members int) (*pgxpool.Pool, *ingest.Pipeline, community.Tenant, string) {
	b.Helper()
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, dbtest.URL(b))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(pool.Close)
	row, err := db.New(pool).CommunityCreate(ctx, fmt.Sprintf("bench-channel-%d.example", time.Now().UnixNano()))
	if err != nil {
		b.Fatal(err)
	}
	tenant := community.FromRow(row)
	opts.MaxFutureSkew, opts.ListFoldInterval = time.Hour, time.Hour
	p := ingest.New(pool, fanout.NewHub(), opts)
	owner, _ := nostr.GenerateSecretKey()
	ch := fmt.Sprintf("%08x-0000-4000-8000-000000000000", time.Now().UnixNano()&0xffffffff)
	create := &nostr.Event{Kind: ingest.KindCreateGroup, CreatedAt: time.Now().Unix(), Tags: nostr.Tags{{"h", ch}, {"name", "big"}}}
	if err := create.Sign(owner); err != nil {
		b.Fatal(err)
	}
	if _, err := p.Submit(ctx, tenant, create.PubKey, create); err != nil {
		b.Fatal(err)
	}
	if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SET LOCAL session_replication_role = replica`); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `INSERT INTO channel_members (community_id, channel_id, pubkey)
			SELECT $1, $2, sha256(i::text::bytea) FROM generate_series(1, $3::int - 1) i`, tenant.ID(), ch, members); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `UPDATE channels SET active_members = $3 WHERE community_id = $1 AND id = $2`, tenant.ID(), ch, members)
		return err
	}); err != nil {
		b.Fatal(err)
	}
	return pool, p, tenant, ch
}

// timeJoins times b.N joins of fresh keys to channel ch, signed before the
// clock starts, and reports the group writer's time per join (writerTime
// is summed by p.OnGroup).
func timeJoins(b *testing.B, p *ingest.Pipeline, tenant community.Tenant, ch string, writerTime *atomic.Int64) {
	joins := make([]*nostr.Event, b.N)
	for i := range joins {
		k, _ := nostr.GenerateSecretKey()
		joins[i] = &nostr.Event{Kind: ingest.KindJoinRequest, CreatedAt: time.Now().Unix(), Tags: nostr.Tags{{"h", ch}}}
		if err := joins[i].Sign(k); err != nil {
			b.Fatal(err)
		}
	}
	writerTime.Store(0)
	b.ResetTimer()
	for _, ev := range joins {
		if _, err := p.Submit(context.Background(), tenant, ev.PubKey, ev); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	b.ReportMetric(float64(writerTime.Load())/float64(b.N)/1e6, "writer-ms/join")
}

// BenchmarkSubmitChannelMessages is BenchmarkSubmit for messages (kind 9)
// in one open channel by 16 publishers: each write checks the channel
// (ChannelAccess, under the channel's write lock until the commit). It
// reports the WAL each message costs: the WAL is the cluster's, so the
// figure is exact only when nothing else writes to it meanwhile. A message
// that is not stored fails the benchmark.
func BenchmarkSubmitChannelMessages(b *testing.B) {
	p, tenant, pool := benchTenantPool(b)
	ctx := context.Background()
	owner, _ := nostr.GenerateSecretKey()
	channel := "6f1c4ad2-4c1e-4b8e-9a55-3b1f0c2e7d10"
	create := &nostr.Event{Kind: 9007, CreatedAt: time.Now().Unix(), Tags: nostr.Tags{{"h", channel}, {"name", "bench"}}}
	if err := create.Sign(owner); err != nil {
		b.Fatal(err)
	}
	if outcome, err := p.Submit(ctx, tenant, create.PubKey, create); err != nil || outcome != ingest.Stored {
		b.Fatal(outcome, err)
	}
	events := presigned(b, b.N)
	for _, ev := range events {
		ev.Kind = 9
		ev.Tags = nostr.Tags{{"h", channel}}
	}
	keys := make([]*nostr.SecretKey, 16)
	for i := range keys {
		keys[i], _ = nostr.GenerateSecretKey()
	}
	for i, ev := range events {
		if err := ev.Sign(keys[i%len(keys)]); err != nil {
			b.Fatal(err)
		}
	}
	var walBefore, walAfter string
	if err := pool.QueryRow(ctx, "SELECT pg_current_wal_insert_lsn()::text").Scan(&walBefore); err != nil {
		b.Fatal(err)
	}
	var next atomic.Int64
	b.SetParallelism(8)
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			ev := events[next.Add(1)-1]
			if outcome, err := p.Submit(ctx, tenant, ev.PubKey, ev); err != nil || outcome != ingest.Stored {
				b.Error(outcome, err)
			}
		}
	})
	b.StopTimer()
	var wal float64
	if err := pool.QueryRow(ctx, "SELECT pg_current_wal_insert_lsn()::text").Scan(&walAfter); err != nil {
		b.Fatal(err)
	}
	if err := pool.QueryRow(ctx, "SELECT pg_wal_lsn_diff($1::pg_lsn, $2::pg_lsn)::float8", walAfter, walBefore).Scan(&wal); err != nil {
		b.Fatal(err)
	}
	b.ReportMetric(wal/float64(b.N), "WAL-B/op")
}

// BenchmarkMessageDuringFold is a message into a channel of 8,000 members
// sent while its lists are folded and a join (from another process) waits
// for the fold (go test -bench MessageDuringFold -benchtime 5x):
// message-ms is how long the message took, fold-ms the fold's time.
func BenchmarkMessageDuringFold(b *testing.B) {
	pool, folder, tenant, ch := largeChannel(b, ingest.Options{ListFoldMembers: 1}, 8000)
	ctx := context.Background()
	opts := ingest.Options{ListFoldMembers: 1, MaxFutureSkew: time.Hour, ListFoldInterval: time.Hour}
	changer, writer := ingest.New(pool, fanout.NewHub(), opts), ingest.New(pool, fanout.NewHub(), opts)
	var messageTime, foldTime time.Duration
	for b.Loop() {
		// The join of the round before marked the channel again.
		if _, err := pool.Exec(ctx, `INSERT INTO channel_lists_due (community_id, channel_id, due_at) VALUES ($1, $2, now())
			ON CONFLICT (community_id, channel_id) DO UPDATE SET due_at = now()`, tenant.ID(), ch); err != nil {
			b.Fatal(err)
		}
		joinKey, _ := nostr.GenerateSecretKey()
		join := &nostr.Event{Kind: ingest.KindJoinRequest, CreatedAt: time.Now().Unix(), Tags: nostr.Tags{{"h", ch}}}
		msgKey, _ := nostr.GenerateSecretKey()
		msg := &nostr.Event{Kind: 9, CreatedAt: time.Now().Unix(), Content: "during the fold", Tags: nostr.Tags{{"h", ch}}}
		if join.Sign(joinKey) != nil || msg.Sign(msgKey) != nil {
			b.Fatal("sign")
		}
		locked := make(chan struct{})
		ingest.OnListsLocked(folder, func() { close(locked) })
		folded := make(chan error, 1)
		start := time.Now()
		go func() {
			_, err := folder.FoldChannelLists(ctx)
			folded <- err
		}()
		<-locked
		joined := make(chan error, 1)
		go func() {
			_, err := changer.Submit(ctx, tenant, join.PubKey, join)
			joined <- err
		}()
		for waiting := 0; waiting == 0; {
			if err := pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'`).Scan(&waiting); err != nil {
				b.Fatal(err)
			}
		}
		sent := time.Now()
		if outcome, err := writer.Submit(ctx, tenant, msg.PubKey, msg); err != nil || outcome != ingest.Stored {
			b.Fatal(outcome, err)
		}
		messageTime += time.Since(sent)
		if err := <-folded; err != nil {
			b.Fatal(err)
		}
		foldTime += time.Since(start)
		if err := <-joined; err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(messageTime.Microseconds())/1e3/float64(b.N), "message-ms")
	b.ReportMetric(float64(foldTime.Microseconds())/1e3/float64(b.N), "fold-ms")
}

// BenchmarkSubmitChannelMessagesBesideRefusedFlood is
// BenchmarkSubmitChannelMessages while 4 more goroutines flood the relay
// with events it refuses: joins (9021) or messages (9) naming a channel that
// does not exist, each by a fresh key. A join changes its channel's
// membership, so it is written as a group of its own; the message flood is
// the same load without that. It reports the groups written per stored
// message and the flood events submitted per stored message.
func BenchmarkSubmitChannelMessagesBesideRefusedFlood(b *testing.B) {
	for _, flood := range []struct {
		name string
		kind int
	}{{"joins", 9021}, {"messages", 9}} {
		b.Run(flood.name, func(b *testing.B) {
			p, tenant, _ := benchTenantPool(b)
			ctx := context.Background()
			owner, _ := nostr.GenerateSecretKey()
			channel := "6f1c4ad2-4c1e-4b8e-9a55-3b1f0c2e7d10"
			create := &nostr.Event{Kind: 9007, CreatedAt: time.Now().Unix(), Tags: nostr.Tags{{"h", channel}, {"name", "bench"}}}
			if err := create.Sign(owner); err != nil {
				b.Fatal(err)
			}
			if outcome, err := p.Submit(ctx, tenant, create.PubKey, create); err != nil || outcome != ingest.Stored {
				b.Fatal(outcome, err)
			}
			events := presigned(b, b.N)
			keys := make([]*nostr.SecretKey, 16)
			for i := range keys {
				keys[i], _ = nostr.GenerateSecretKey()
			}
			for i, ev := range events {
				ev.Kind, ev.Tags = 9, nostr.Tags{{"h", channel}}
				if err := ev.Sign(keys[i%len(keys)]); err != nil {
					b.Fatal(err)
				}
			}
			const floodEvents = 4096
			refused := make([]*nostr.Event, floodEvents)
			for i := range refused {
				key, _ := nostr.GenerateSecretKey()
				refused[i] = &nostr.Event{Kind: flood.kind, CreatedAt: time.Now().Unix(), Tags: nostr.Tags{{"h", uuid.NewString()}}}
				if err := refused[i].Sign(key); err != nil {
					b.Fatal(err)
				}
			}
			var groups, flooded atomic.Int64
			p.OnGroup = func(ingest.GroupStats) { groups.Add(1) }
			stop := make(chan struct{})
			var wg sync.WaitGroup
			for f := range 4 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for i := f; ; i++ {
						select {
						case <-stop:
							return
						default:
						}
						ev := refused[i%floodEvents]
						if outcome, err := p.Submit(ctx, tenant, ev.PubKey, ev); err == nil && outcome == ingest.Stored {
							b.Error("a flood event was stored")
						}
						flooded.Add(1)
					}
				}()
			}
			var next atomic.Int64
			b.SetParallelism(8)
			b.ResetTimer()
			groups.Store(0)
			flooded.Store(0)
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					ev := events[next.Add(1)-1]
					if outcome, err := p.Submit(ctx, tenant, ev.PubKey, ev); err != nil || outcome != ingest.Stored {
						b.Error(outcome, err)
					}
				}
			})
			b.StopTimer()
			close(stop)
			wg.Wait()
			b.ReportMetric(float64(groups.Load())/float64(b.N), "groups/msg")
			b.ReportMetric(float64(flooded.Load())/float64(b.N), "flood/msg")
		})
	}
}
