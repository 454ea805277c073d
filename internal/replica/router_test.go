package replica_test

import (
	"context"
	"fmt"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/buzzrelay/buzz/internal/dbtest"
	"github.com/buzzrelay/buzz/internal/replica"
)

// decisions records the router's route events.
type decisions struct {
	mu  sync.Mutex
	got []string
}

func (d *decisions) observe(path, decision, reason string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.got = append(d.got, path+" "+decision+"/"+reason)
}

func (d *decisions) last() string {
	d.mu.Lock()
	defer d.mu.Unlock()
	if len(d.got) == 0 {
		return ""
	}
	return d.got[len(d.got)-1]
}

type routed struct {
	writer *pgxpool.Pool
	reader *pgxpool.Pool
	ring   *replica.Ring
	probe  *replica.Probe
	router *replica.Router
	seen   *decisions
}

// newRouted wires a probe on writerURL and a router onto readerURL, the
// probe ticking in the background every probeEvery.
func newRouted(t *testing.T, writerURL, readerURL string, probeEvery, maxAge time.Duration, readerConns int32) *routed {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	r := &routed{writer: writerPool(t, writerURL), ring: replica.NewRing(), seen: &decisions{}}
	cfg, err := replica.ReaderPoolConfig(readerURL, readerConns, 5*time.Second, 10*time.Second)
	require.NoError(t, err)
	r.reader, err = pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	r.probe = replica.NewProbe(r.writer, r.ring, replica.DefaultFloor, probeEvery, time.Now, quiet)
	r.router = replica.NewRouter(r.reader, r.ring, replica.RouterOptions{MaxAge: maxAge, Observe: r.seen.observe, Log: quiet})
	done := make(chan struct{})
	go func() { r.probe.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done; r.reader.Close() })
	return r
}

// eventually waits (generously) until check passes.
func eventually(t *testing.T, what string, check func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !check() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting until %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// route begins and ends one routed read and returns its label.
func (r *routed) route(ctx context.Context, pred replica.Predicate) string {
	if s := r.router.Begin(ctx, "test", pred); s != nil {
		s.Served()
	}
	return r.seen.last()
}

var longAgo = time.Now().Add(-time.Hour)

// On a healthy standby, covered and fresh reads are served by the reader
// from a snapshot that proves a probe token.
func TestRoutingOnAHealthyStandby(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	writer := dbtest.URL(t)
	// The shared test standby replays every test database's WAL and can
	// lag seconds behind in a full run: the ring must reach back that far
	// (RingCapacity ticks) and the budget must allow it.
	r := newRouted(t, writer, dbtest.ReaderURL(t, writer), 250*time.Millisecond, 30*time.Second, 4)
	eventually(t, "the reader proves a token", func() bool {
		return r.route(ctx, replica.Covered(longAgo)) == "test replica/covered"
	})
	eventually(t, "a fresh read routes", func() bool {
		return r.route(ctx, replica.Bounded()) == "test replica/fresh"
	})
	var s *replica.Session
	eventually(t, "a session on the reader", func() bool {
		s = r.router.Begin(ctx, "test", replica.Bounded())
		return s != nil
	})
	var inRecovery bool
	var iso, readOnly string
	require.NoError(t, s.Tx().QueryRow(ctx, "SELECT pg_is_in_recovery(), current_setting('transaction_isolation'), current_setting('transaction_read_only')").Scan(&inRecovery, &iso, &readOnly))
	s.Served()
	require.True(t, inRecovery, "served by the standby")
	require.Equal(t, "repeatable read", iso)
	require.Equal(t, "on", readOnly)
	// A page bounded after the proved wall is not covered.
	require.Equal(t, "test writer/stale", r.route(ctx, replica.Covered(time.Now())))
}

// Without a reader, with the fresh budget off, or before the first token,
// the writer answers.
func TestRoutingFailsClosed(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	seen := &decisions{}
	none := replica.NewRouter(nil, replica.NewRing(), replica.RouterOptions{Observe: seen.observe})
	require.Nil(t, none.Begin(ctx, "test", replica.Covered(longAgo)))
	require.Equal(t, "test writer/disabled", seen.last())

	writer := dbtest.URL(t)
	cfg, err := replica.ReaderPoolConfig(dbtest.ReaderURL(t, writer), 2, time.Second, time.Second)
	require.NoError(t, err)
	reader, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	defer reader.Close()
	ring := replica.NewRing()
	router := replica.NewRouter(reader, ring, replica.RouterOptions{Observe: seen.observe})
	require.Nil(t, router.Begin(ctx, "test", replica.Covered(longAgo)))
	require.Equal(t, "test writer/uninitialized", seen.last())
	_, err = replica.NewProbe(writerPool(t, writer), ring, replica.DefaultFloor, time.Second, time.Now, quiet).Tick(ctx)
	require.NoError(t, err)
	require.Nil(t, router.Begin(ctx, "test", replica.Bounded()))
	require.Equal(t, "test writer/disabled", seen.last(), "the fresh predicate is off at budget 0")
	require.Nil(t, router.Begin(ctx, "test", replica.CoveredOrBounded(time.Now())))
	require.Equal(t, "test writer/stale", seen.last())
	// The token the probe just wrote may not have reached the standby yet:
	// the reader is behind every retained token.
	eventually(t, "covered routes at budget 0 once replayed", func() bool {
		if s := router.Begin(ctx, "test", replica.Covered(longAgo)); s != nil {
			s.Served()
		}
		return seen.last() == "test replica/covered"
	})
}

// acquireBudget is wide so the one-budget check holds on a loaded
// machine: two budgets take at least 6 s, so a read that fell back in
// under 5.75 s spent one. At 1 s the slack for a late timer on a loaded
// machine was 0.75 s; now it is 2.75 s.
const (
	acquireBudget   = 3 * time.Second
	oneBudgetAtMost = 2*acquireBudget - 250*time.Millisecond
)

// A reader that is down when the relay starts, and one whose only
// connection is taken, both cost one acquire budget, then the writer.
// Mutation killed: acquiring a second time (a retry, or a separate budget
// for BEGIN and the proof) pushes the blackholed case past two budgets.
func TestFallbackSpendsOneAcquireBudget(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	writer := dbtest.URL(t)
	ring := replica.NewRing()
	_, err := replica.NewProbe(writerPool(t, writer), ring, replica.DefaultFloor, time.Second, time.Now, quiet).Tick(ctx)
	require.NoError(t, err)

	check := func(name string, reader *pgxpool.Pool) {
		seen := &decisions{}
		router := replica.NewRouter(reader, ring, replica.RouterOptions{Observe: seen.observe, AcquireTimeout: acquireBudget})
		start := time.Now()
		require.Nil(t, router.Begin(ctx, "test", replica.Covered(longAgo)), name)
		elapsed := time.Since(start)
		require.Equal(t, "test writer/reader_acquire_timeout", seen.last(), name)
		require.Less(t, elapsed, oneBudgetAtMost, name)
	}

	// Down at boot: nothing listens on the reader's port.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	deadPort := l.Addr().(*net.TCPAddr).Port
	l.Close()
	cfg, err := replica.ReaderPoolConfig(fmt.Sprintf("postgres://postgres@127.0.0.1:%d/x?sslmode=disable", deadPort), 2, time.Second, time.Second)
	require.NoError(t, err)
	dead, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err, "the reader pool is lazy: a dead reader does not stop start-up")
	defer dead.Close()
	check("reader down", dead)

	// Blackholed: the reader accepts TCP but never answers.
	hole, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer hole.Close()
	go func() {
		for {
			c, err := hole.Accept()
			if err != nil {
				return
			}
			defer c.Close()
		}
	}()
	cfg, err = replica.ReaderPoolConfig("postgres://postgres@"+hole.Addr().String()+"/x?sslmode=disable", 2, time.Second, time.Second)
	require.NoError(t, err)
	black, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	defer black.Close()
	check("reader blackholed", black)

	// Busy: a one-connection reader pool whose connection is held.
	cfg, err = replica.ReaderPoolConfig(dbtest.ReaderURL(t, writer), 1, time.Second, 10*time.Second)
	require.NoError(t, err)
	busy, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	defer busy.Close()
	held, err := busy.Acquire(ctx)
	require.NoError(t, err)
	defer held.Release()
	check("reader pool exhausted", busy)
}

// Pausing replay on the standby makes fresh reads go to the writer as
// stale (covered history still routes: old rows are all there); resuming
// brings them back. The test pauses its own standby, never the shared one.
// Mutation killed: judging freshness by the newest ring entry instead of
// the entry the reader proved keeps routing fresh reads while paused.
func TestReplayPauseMovesFreshReadsToTheWriter(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pair := dbtest.PrivatePair(t)
	r := newRouted(t, pair.WriterURL, pair.ReaderURL, 20*time.Millisecond, 300*time.Millisecond, 4)
	eventually(t, "fresh reads route", func() bool { return r.route(ctx, replica.Bounded()) == "test replica/fresh" })

	standby, err := pgxpool.New(ctx, pair.ReaderURL)
	require.NoError(t, err)
	defer standby.Close()
	_, err = standby.Exec(ctx, "SELECT pg_wal_replay_pause()")
	require.NoError(t, err)
	eventually(t, "fresh reads go to the writer as stale", func() bool { return r.route(ctx, replica.Bounded()) == "test writer/stale" })
	eventually(t, "covered history still routes while paused", func() bool {
		return r.route(ctx, replica.Covered(longAgo)) == "test replica/covered"
	})

	_, err = standby.Exec(ctx, "SELECT pg_wal_replay_resume()")
	require.NoError(t, err)
	eventually(t, "fresh reads route again", func() bool { return r.route(ctx, replica.Bounded()) == "test replica/fresh" })
}

// A covered page proves insertions only: a deletion committed after the
// proved token is missing from the reader. So the proved token, not only
// the ring's newest, must be at most Staleness old: a reader lagging
// further proves an older entry and must not serve a deleted row longer.
// Mutation killed: dropping the age test routes the page proved by a
// token 40 s old.
func TestCoveredReadsProveATokenNoOlderThanStaleness(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := writerPool(t, dbtest.URL(t)) // any database with the heartbeat serves as the reader
	var token int64
	var epoch uuid.UUID
	require.NoError(t, pool.QueryRow(ctx, "SELECT token, epoch FROM replica_heartbeat").Scan(&token, &epoch))
	clock := time.Now()
	wall := clock.Add(-time.Hour)
	for _, tc := range []struct {
		provedAge time.Duration
		want      string
	}{
		{replica.Staleness - time.Second, "test replica/covered"},
		{replica.Staleness + 10*time.Second, "test writer/stale"},
	} {
		ring := replica.NewRing()
		// The reader holds token; the probe has written token+1 since.
		require.True(t, ring.Record(replica.Entry{Token: token, Epoch: epoch, CommittedAt: clock.Add(-tc.provedAge), Wall: wall}))
		require.True(t, ring.Record(replica.Entry{Token: token + 1, Epoch: epoch, CommittedAt: clock, Wall: wall}))
		seen := &decisions{}
		router := replica.NewRouter(pool, ring, replica.RouterOptions{Now: func() time.Time { return clock }, Observe: seen.observe, Log: quiet, AcquireTimeout: time.Minute})
		if s := router.Begin(ctx, "test", replica.Covered(wall.Add(-time.Hour))); s != nil {
			s.Served()
		}
		require.Equal(t, tc.want, seen.last(), "proved token %s old", tc.provedAge)
	}
}

// A standby killed, or shut down cleanly (pg_ctl stop -m fast, as for a
// restart), under the pool's idle connections is a reader that could not
// be had (reader_acquire_timeout, as for a failed dial), not a validation
// error, which names a reader that answered with no proof (another
// timeline, no heartbeat): an operator reading the metric after a standby
// restart must not go looking for a restore. A clean shutdown ends each
// backend's session with a FATAL "terminating connection due to
// administrator command" that the next BEGIN reads: an error that ends the
// connection, not an answer.
// Mutations killed: classifying every failure within the budget as a
// validation error (kill: the broken connection's BEGIN); classifying
// every PgError as an answer (stop: the buffered FATAL).
func TestAStandbyGoneUnderThePoolCannotBeHad(t *testing.T) {
	t.Parallel()
	for name, stop := range map[string]func(pair *dbtest.Pair) error{
		"killed":  func(pair *dbtest.Pair) error { return pair.Standby.Kill() },
		"stopped": func(pair *dbtest.Pair) error { return pair.Standby.Stop() },
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			pair := dbtest.PrivatePair(t)
			r := newRouted(t, pair.WriterURL, pair.ReaderURL, 20*time.Millisecond, 0, 1)
			eventually(t, "covered reads route", func() bool { return r.route(ctx, replica.Covered(longAgo)) == "test replica/covered" })
			require.NoError(t, stop(pair))
			require.Equal(t, "test writer/reader_acquire_timeout", r.route(ctx, replica.Covered(longAgo)))
		})
	}
}

// The reader pools' sessions are named buzz-relay-reader, so an operator
// on the standby tells the relay's routed reads from anyone else's.
// Mutation killed: ReaderPoolConfig without pgsession.Name (the name is "").
func TestReaderSessionsAreNamed(t *testing.T) {
	t.Parallel()
	cfg, err := replica.ReaderPoolConfig(dbtest.URL(t), 1, time.Second, time.Second)
	require.NoError(t, err)
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	require.NoError(t, err)
	defer pool.Close()
	require.Equal(t, "buzz-relay-reader", dbtest.SessionName(t, pool))
}

// A standby promoted since the watcher last looked (it looks once a second)
// replays nothing and may take writes the writer never had, while its
// frozen token still resolves in the ring for up to Staleness. The proof
// reads pg_is_in_recovery() after taking the snapshot it proves, so no read
// routes to it once it is promoted, before the watcher says so; the router
// then treats it as no standby until the watcher finds one again.
// Mutation killed: a proof that ignores in_recovery (the covered read
// routes to the promoted server).
func TestAPromotedStandbyProvesNothingAtOnce(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pair := dbtest.PrivatePair(t)
	r := newRouted(t, pair.WriterURL, pair.ReaderURL, 50*time.Millisecond, 0, 2)
	r.router = replica.NewRouter(r.reader, r.ring, replica.RouterOptions{Observe: r.seen.observe, Log: quiet, RequireStandby: true})
	r.router.SetStandby(true) // what the watcher said before the promotion
	eventually(t, "covered reads route", func() bool { return r.route(ctx, replica.Covered(longAgo)) == "test replica/covered" })

	standby, err := pgx.Connect(ctx, pair.ReaderURL)
	require.NoError(t, err)
	defer standby.Close(ctx)
	var promoted bool
	require.NoError(t, standby.QueryRow(ctx, "SELECT pg_promote()").Scan(&promoted)) // waits until it is done
	require.True(t, promoted)

	require.Equal(t, "test writer/disabled", r.route(ctx, replica.Covered(longAgo)))
	require.Equal(t, "test writer/disabled", r.route(ctx, replica.Covered(longAgo)), "no budget spent again until the watcher finds a standby")
}
