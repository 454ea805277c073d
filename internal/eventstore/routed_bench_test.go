package eventstore_test

import (
	"context"
	"log/slog"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/buzzrelay/buzz/internal/dbtest"
	"github.com/buzzrelay/buzz/internal/eventstore"
	"github.com/buzzrelay/buzz/internal/nostr"
	"github.com/buzzrelay/buzz/internal/replica"
)

// benchRouting is a writer with channel history 2 hours deep, the shared
// standby, and a probe ticking at the default interval.
type benchRouting struct {
	writer, reader *pgxpool.Pool
	ring           *replica.Ring
	community      uuid.UUID
	channel        uuid.UUID
	routes         *routeLog
}

func newBenchRouting(b *testing.B) *benchRouting {
	ctx := context.Background()
	url := dbtest.URL(b)
	writer, err := pgxpool.New(ctx, url)
	require.NoError(b, err)
	b.Cleanup(writer.Close)
	r := &benchRouting{writer: writer, ring: replica.NewRing(), community: uuid.New(), channel: uuid.New(), routes: &routeLog{}}
	_, err = writer.Exec(ctx, "INSERT INTO communities (id, host) VALUES ($1, 'bench.example')", r.community)
	require.NoError(b, err)
	key := newKey(b)
	start := time.Now().Add(-2 * time.Hour)
	for i := 0; i < 2000; i++ {
		ev := &nostr.Event{Kind: 9, CreatedAt: start.Add(time.Duration(i) * 3600 * time.Millisecond).Unix(), Tags: nostr.Tags{{"h", r.channel.String()}}, Content: "history"}
		require.NoError(b, ev.Sign(key))
		params, err := eventstore.InsertParams(r.community, ev, &r.channel)
		require.NoError(b, err)
		_, err = writer.Exec(ctx, `INSERT INTO events (community_id, id, pubkey, created_at, kind, tags, content, sig, channel_id)
			VALUES ($1, $2, $3, to_timestamp($4), $5, $6, $7, $8, $9)`,
			params.CommunityID, params.ID, params.Pubkey, params.CreatedAt, params.Kind, params.Tags, params.Content, params.Sig, params.ChannelID)
		require.NoError(b, err)
	}
	_, err = writer.Exec(ctx, "ANALYZE events")
	require.NoError(b, err)
	cfg, err := replica.ReaderPoolConfig(dbtest.ReaderURL(b, url), 8, 5*time.Second, 10*time.Second)
	require.NoError(b, err)
	r.reader, err = pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(b, err)
	b.Cleanup(r.reader.Close)
	probeCtx, stop := context.WithCancel(ctx)
	b.Cleanup(stop)
	go replica.NewProbe(writer, r.ring, replica.DefaultFloor, replica.DefaultProbeInterval, time.Now, slog.New(slog.DiscardHandler)).Run(probeCtx)
	require.Eventually(b, func() bool { _, ok := r.ring.Newest(time.Now()); return ok }, 30*time.Second, 10*time.Millisecond)
	return r
}

func (r *benchRouting) store(maxAge time.Duration, routed bool) *eventstore.Store {
	s := eventstore.New(r.writer, 500)
	if routed {
		s.Router = replica.NewRouter(r.reader, r.ring, replica.RouterOptions{MaxAge: maxAge, Observe: r.routes.observe})
	}
	return s
}

func percentile(d []time.Duration, p float64) time.Duration {
	slices.Sort(d)
	return d[min(len(d)-1, int(float64(len(d))*p))]
}

// BenchmarkHistoryPage: one channel history page of 50 (until an hour
// ago, covered) from the writer and routed to the standby; reports p50/p99.
func BenchmarkHistoryPage(b *testing.B) {
	r := newBenchRouting(b)
	until := time.Now().Add(-time.Hour).Unix()
	limit := 50
	filters := nostr.Filters{{Tags: map[string][]string{"h": {r.channel.String()}}, Until: &until, Limit: &limit}}
	scope := eventstore.Scope{Channels: []uuid.UUID{r.channel}}
	for _, mode := range []struct {
		name   string
		routed bool
	}{{"writer", false}, {"routed", true}} {
		b.Run(mode.name, func(b *testing.B) {
			s := r.store(0, mode.routed)
			var lat []time.Duration
			for b.Loop() {
				start := time.Now()
				n := 0
				if err := s.Query(context.Background(), r.community, scope, filters, func(*nostr.Event, *uuid.UUID) error { n++; return nil }); err != nil {
					b.Fatal(err)
				}
				lat = append(lat, time.Since(start))
				if n != limit {
					b.Fatalf("%d rows", n)
				}
			}
			b.ReportMetric(float64(percentile(lat, .5).Microseconds()), "p50-µs")
			b.ReportMetric(float64(percentile(lat, .99).Microseconds()), "p99-µs")
			got := r.routes.take()
			if mode.routed && (len(got) == 0 || got[len(got)-1] != "channel_history replica/covered") {
				b.Fatalf("not routed: %v", got[max(0, len(got)-1):])
			}
		})
	}
}

// BenchmarkProbeTick: the probe's cost on the writer, per tick, and the
// WAL it writes.
func BenchmarkProbeTick(b *testing.B) {
	ctx := context.Background()
	writer, err := pgxpool.New(ctx, dbtest.URL(b))
	require.NoError(b, err)
	defer writer.Close()
	probe := replica.NewProbe(writer, replica.NewRing(), replica.DefaultFloor, time.Second, time.Now, slog.New(slog.DiscardHandler))
	var before, after int64
	require.NoError(b, writer.QueryRow(ctx, "SELECT pg_current_wal_insert_lsn() - '0/0'::pg_lsn").Scan(&before))
	for b.Loop() {
		if _, err := probe.Tick(ctx); err != nil {
			b.Fatal(err)
		}
	}
	require.NoError(b, writer.QueryRow(ctx, "SELECT pg_current_wal_insert_lsn() - '0/0'::pg_lsn").Scan(&after))
	b.ReportMetric(float64(after-before)/float64(b.N), "WAL-B/tick")
}

// BenchmarkRoutedShareUnderPublishLoad: while a writer publishes channel
// messages steadily (~200/s), readers scroll channel history (until
// uniformly up to an hour back); reports the share of pages the standby
// served, with the fresh budget off and at 1 s.
func BenchmarkRoutedShareUnderPublishLoad(b *testing.B) {
	r := newBenchRouting(b)
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	cfg, err := pgxpool.ParseConfig(r.writer.Config().ConnString())
	require.NoError(b, err)
	replica.ArmFloor(cfg, replica.DefaultFloor)
	armed, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(b, err)
	defer armed.Close()
	var published atomic.Int64
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		key := newKey(b)
		for t := time.NewTicker(5 * time.Millisecond); ctx.Err() == nil; <-t.C {
			ev := &nostr.Event{Kind: 9, CreatedAt: time.Now().Unix(), Tags: nostr.Tags{{"h", r.channel.String()}}, Content: "live"}
			if ev.Sign(key) != nil {
				return
			}
			params, _ := eventstore.InsertParams(r.community, ev, &r.channel)
			if _, err := armed.Exec(ctx, `INSERT INTO events (community_id, id, pubkey, created_at, kind, tags, content, sig, channel_id)
				VALUES ($1, $2, $3, to_timestamp($4), $5, $6, $7, $8, $9)`,
				params.CommunityID, params.ID, params.Pubkey, params.CreatedAt, params.Kind, params.Tags, params.Content, params.Sig, params.ChannelID); err == nil {
				published.Add(1)
			}
		}
	}()
	scope := eventstore.Scope{Channels: []uuid.UUID{r.channel}}
	limit := 50
	for _, budget := range []time.Duration{0, time.Second} {
		b.Run("budget="+budget.String(), func(b *testing.B) {
			s := r.store(budget, true)
			rng := rand.New(rand.NewPCG(1, 2))
			r.routes.take()
			for b.Loop() {
				until := time.Now().Add(-time.Duration(rng.Int64N(int64(time.Hour)))).Unix()
				filters := nostr.Filters{{Tags: map[string][]string{"h": {r.channel.String()}}, Until: &until, Limit: &limit}}
				if err := s.Query(ctx, r.community, scope, filters, func(*nostr.Event, *uuid.UUID) error { return nil }); err != nil {
					b.Fatal(err)
				}
			}
			routed := 0
			got := r.routes.take()
			for _, d := range got {
				if d == "channel_history replica/covered" || d == "channel_history replica/fresh" {
					routed++
				}
			}
			b.ReportMetric(100*float64(routed)/float64(len(got)), "%routed")
		})
	}
	stop()
	wg.Wait()
	b.Logf("published %d messages during the run", published.Load())
}
