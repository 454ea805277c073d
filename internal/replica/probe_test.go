package replica_test

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/buzzrelay/buzz/internal/dbtest"
	"github.com/buzzrelay/buzz/internal/migrate"
	"github.com/buzzrelay/buzz/internal/pgcluster"
	"github.com/buzzrelay/buzz/internal/replica"
)

// The wall is bounded by the oldest open transaction, sampled before the
// token is written; an idle session holds nothing back. Tokens strictly
// increase within one epoch.
// Mutation killed: ignoring open transactions (wall = S - floor) fails the
// wall bound below. (Writing the token before the sample is no such
// mutation: the token becomes visible only at the commit, after both, and
// this test passes with it.)
func TestProbeWallIsBoundedByOpenTransactions(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := dbtest.URL(t)
	pool := writerPool(t, url)
	ring := replica.NewRing()
	probe := replica.NewProbe(pool, ring, replica.DefaultFloor, time.Second, time.Now, quiet)

	idle, err := pgx.Connect(ctx, url)
	require.NoError(t, err)
	defer idle.Close(ctx)
	first, err := probe.Tick(ctx)
	require.NoError(t, err)

	open, err := pgx.Connect(ctx, url)
	require.NoError(t, err)
	defer open.Close(ctx)
	tx, err := open.Begin(ctx)
	require.NoError(t, err)
	defer tx.Rollback(ctx)
	var started time.Time
	require.NoError(t, tx.QueryRow(ctx, "SELECT now()").Scan(&started))

	second, err := probe.Tick(ctx)
	require.NoError(t, err)
	require.Greater(t, second.Token, first.Token)
	require.Equal(t, first.Epoch, second.Epoch)
	require.False(t, second.Wall.After(started.Add(-replica.DefaultFloor-replica.ClockMargin)),
		"wall %s must not pass the open transaction's start %s less floor and margin", second.Wall, started)
	require.NoError(t, tx.Rollback(ctx))
}

// Only sessions of the probe's own database can write its events: an open
// transaction in another database on the same cluster does not hold the
// wall back.
// Mutation killed: scanning every database's sessions bounds the wall by
// the other database's transaction.
func TestProbeWallIgnoresOtherDatabases(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	probe := replica.NewProbe(writerPool(t, dbtest.URL(t)), replica.NewRing(), replica.DefaultFloor, time.Second, time.Now, quiet)

	other, err := pgx.Connect(ctx, dbtest.URL(t))
	require.NoError(t, err)
	defer other.Close(ctx)
	tx, err := other.Begin(ctx)
	require.NoError(t, err)
	defer tx.Rollback(ctx)
	var started time.Time
	require.NoError(t, tx.QueryRow(ctx, "SELECT now()").Scan(&started))

	e, err := probe.Tick(ctx)
	require.NoError(t, err)
	require.True(t, e.Wall.After(started.Add(-replica.DefaultFloor-replica.ClockMargin)),
		"wall %s must not be bounded by another database's transaction started at %s", e.Wall, started)
}

// A restored writer whose token went backwards gets a new epoch, and a
// reader still showing the old one cannot prove anything.
// Mutation killed: recording a regressed token without rotating (Record's
// false ignored) leaves the epoch unchanged and fails this test.
func TestProbeRotatesTheEpochAfterATokenRegression(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := writerPool(t, dbtest.URL(t))
	ring := replica.NewRing()
	probe := replica.NewProbe(pool, ring, replica.DefaultFloor, time.Second, time.Now, quiet)
	before, err := probe.Tick(ctx)
	require.NoError(t, err)
	_, err = probe.Tick(ctx)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, "UPDATE replica_heartbeat SET token = 0") // a restore from an older backup
	require.NoError(t, err)
	after, err := probe.Tick(ctx)
	require.NoError(t, err)
	require.NotEqual(t, before.Epoch, after.Epoch)
	var dbEpoch [16]byte
	require.NoError(t, pool.QueryRow(ctx, "SELECT epoch FROM replica_heartbeat").Scan(&dbEpoch))
	require.Equal(t, after.Epoch[:], dbEpoch[:])
	_, err = ring.Resolve(before.Token, before.Epoch)
	require.ErrorIs(t, err, replica.ErrEpochMismatch)
	e, err := ring.Resolve(after.Token, after.Epoch)
	require.NoError(t, err)
	require.Equal(t, after.Token, e.Token)
}

// A restore can happen while no tick succeeds (the writer is down for it)
// or while no probe runs at all. Either way the restored writer's lower
// token must not be accepted in the old epoch: a standby frozen on the old
// timeline holds a higher token and would prove any read.
// Mutations killed: comparing only against the entries a failed tick
// cleared (the regression passes unnoticed); comparing only within one
// epoch (the older epoch is adopted); not rotating on a process's first
// tick (the second probe keeps the old epoch).
func TestProbeRotatesTheEpochAfterARestoreItDidNotSee(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := writerPool(t, dbtest.URL(t))
	var initial uuid.UUID
	require.NoError(t, pool.QueryRow(ctx, "SELECT epoch FROM replica_heartbeat").Scan(&initial))
	ring := replica.NewRing()
	probe := replica.NewProbe(pool, ring, replica.DefaultFloor, time.Second, time.Now, quiet)
	first, err := probe.Tick(ctx)
	require.NoError(t, err)
	require.NotEqual(t, initial, first.Epoch, "a process's first tick starts a new epoch")
	for range 3 {
		_, err = probe.Tick(ctx)
		require.NoError(t, err)
	}

	down, cancel := context.WithCancel(ctx)
	cancel()
	_, err = probe.Tick(down) // the writer is down for the restore
	require.Error(t, err)
	_, err = pool.Exec(ctx, "UPDATE replica_heartbeat SET token = 1") // restored from an older backup
	require.NoError(t, err)
	after, err := probe.Tick(ctx)
	require.NoError(t, err)
	require.NotEqual(t, first.Epoch, after.Epoch, "a regression after a failed tick rotates the epoch")
	_, err = ring.Resolve(first.Token+3, first.Epoch)
	require.ErrorIs(t, err, replica.ErrEpochMismatch, "a standby still on the old timeline proves nothing")

	// Restored to a backup from before the first rotation: an older epoch.
	_, err = pool.Exec(ctx, "UPDATE replica_heartbeat SET token = 1, epoch = $1", initial)
	require.NoError(t, err)
	older, err := probe.Tick(ctx)
	require.NoError(t, err)
	require.NotEqual(t, initial, older.Epoch, "a lower token in an older epoch is a regression too")
	_, err = ring.Resolve(first.Token+3, initial)
	require.ErrorIs(t, err, replica.ErrEpochMismatch)

	_, err = pool.Exec(ctx, "UPDATE replica_heartbeat SET token = 1") // and again, with no probe running
	require.NoError(t, err)
	restarted := replica.NewProbe(pool, replica.NewRing(), replica.DefaultFloor, time.Second, time.Now, quiet)
	again, err := restarted.Tick(ctx)
	require.NoError(t, err)
	require.NotEqual(t, older.Epoch, again.Epoch, "a process started after a restore starts a new epoch")
}

// A probe role that cannot see other sessions' transactions fails closed.
// Mutation killed: dropping the masked count lets the tick succeed.
func TestProbeFailsClosedOnMaskedActivity(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := dbtest.URL(t)
	admin := writerPool(t, url)
	ring := replica.NewRing()
	_, err := replica.NewProbe(admin, ring, replica.DefaultFloor, time.Second, time.Now, quiet).Tick(ctx)
	require.NoError(t, err)

	role := "probe_" + time.Now().Format("150405.000000")
	role = "probe_unpriv_" + role[len(role)-6:]
	_, err = admin.Exec(ctx, "CREATE ROLE "+role+" LOGIN")
	require.NoError(t, err)
	t.Cleanup(func() { _, _ = admin.Exec(context.Background(), "DROP OWNED BY "+role+"; DROP ROLE IF EXISTS "+role) })
	_, err = admin.Exec(ctx, "GRANT UPDATE, SELECT ON replica_heartbeat TO "+role)
	require.NoError(t, err)
	cfg, err := pgxpool.ParseConfig(url)
	require.NoError(t, err)
	cfg.ConnConfig.User = role
	unpriv, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	defer unpriv.Close()
	// Another role's session is on the cluster (this test's own admin pool).
	conn, err := admin.Acquire(ctx)
	require.NoError(t, err)
	defer conn.Release()
	_, err = replica.NewProbe(unpriv, ring, replica.DefaultFloor, time.Second, time.Now, quiet).Tick(ctx)
	require.ErrorIs(t, err, replica.ErrMaskedActivity)
	_, ok := ring.Newest(time.Now())
	require.False(t, ok, "a failed tick closes the ring")
}

// A session that tracks no activity (track_activities off, which a
// superuser may set for itself) shows no transaction start even while one
// is open, so the tick fails closed.
// Mutation killed: dropping the 'disabled' state from the masked count lets
// the tick succeed past the open transaction.
func TestProbeFailsClosedOnUntrackedSession(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := dbtest.URL(t)
	probe := replica.NewProbe(writerPool(t, url), replica.NewRing(), replica.DefaultFloor, time.Second, time.Now, quiet)

	untracked, err := pgx.Connect(ctx, url)
	require.NoError(t, err)
	defer untracked.Close(ctx)
	_, err = untracked.Exec(ctx, "SET track_activities = off")
	require.NoError(t, err)
	tx, err := untracked.Begin(ctx)
	require.NoError(t, err)
	defer tx.Rollback(ctx)
	_, err = tx.Exec(ctx, "SELECT 1")
	require.NoError(t, err)

	_, err = probe.Tick(ctx)
	require.ErrorIs(t, err, replica.ErrMaskedActivity)
}

// Sessions that hold no transaction are no hazard, so they must not fail
// the tick as if hidden: one still starting up (no state, no transaction,
// even to a superuser), and one busy between transactions (state active
// while its next transaction has not begun, or after its last one
// committed: its start is cleared only once the commit is visible).
// Mutations killed: counting a visible backend with no state as masked
// (the connecting sessions fail the tick), or counting an active one with
// no xact_start as masked (the querying sessions fail it).
func TestProbeIgnoresSessionsWithoutTransactions(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	url := dbtest.URL(t)
	probe := replica.NewProbe(writerPool(t, url), replica.NewRing(), replica.DefaultFloor, time.Second, time.Now, quiet)

	var clients sync.WaitGroup
	for range 3 {
		clients.Add(2)
		go func() {
			defer clients.Done()
			for ctx.Err() == nil {
				if conn, err := pgx.Connect(ctx, url); err == nil {
					_ = conn.Close(context.Background())
				}
			}
		}()
		go func() {
			defer clients.Done()
			conn, err := pgx.Connect(ctx, url)
			if err != nil {
				return
			}
			defer conn.Close(context.Background())
			for ctx.Err() == nil {
				_, _ = conn.Exec(ctx, "SELECT 1")
			}
		}()
	}
	defer clients.Wait()
	defer cancel()
	for range 300 {
		_, err := probe.Tick(ctx)
		require.NoError(t, err)
	}
}

// A transaction left open on the writer holds the wall back, and every
// covered read newer than its start goes to the writer, recorded only as
// stale. The probe names it once (who holds it and for how long) and says
// when it let go, so the operator can find it.
// Mutation killed: not calling noteHolder after a tick (no warning names
// the holder).
func TestProbeNamesTheTransactionHoldingTheWallBack(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := dbtest.URL(t)
	var logs bytes.Buffer // Tick logs on the test's goroutine
	probe := replica.NewProbe(writerPool(t, url), replica.NewRing(), replica.DefaultFloor, time.Second, time.Now,
		slog.New(slog.NewTextHandler(&logs, nil)))
	probe.HoldWarning = time.Millisecond

	tx := openTransaction(t, url, "nightly-backfill")
	time.Sleep(10 * time.Millisecond) // held longer than HoldWarning
	for range 3 {
		_, err := probe.Tick(ctx)
		require.NoError(t, err)
	}
	require.NoError(t, tx.Rollback(ctx))
	_, err := probe.Tick(ctx)
	require.NoError(t, err)

	// Counted by its name: another transaction of the database (an
	// autovacuum worker's) may be named too, around it.
	named := 0
	for _, line := range strings.Split(logs.String(), "\n") {
		if strings.Contains(line, "holds the replica wall back") && strings.Contains(line, "nightly-backfill") {
			named++
		}
	}
	require.Equal(t, 1, named, "named once, not on every tick:\n%s", logs.String())
	require.Contains(t, logs.String(), "has ended")
}

// openTransaction opens a transaction on its own connection to url as
// applicationName and leaves it open (idle in transaction) until the test
// ends or the caller rolls it back.
func openTransaction(t *testing.T, url, applicationName string) pgx.Tx {
	t.Helper()
	ctx := context.Background()
	cfg, err := pgx.ParseConfig(url)
	require.NoError(t, err)
	cfg.RuntimeParams["application_name"] = applicationName
	conn, err := pgx.ConnectConfig(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close(ctx) })
	tx, err := conn.Begin(ctx)
	require.NoError(t, err)
	_, err = tx.Exec(ctx, "SELECT 1") // BEGIN alone starts nothing on the server
	require.NoError(t, err)
	return tx
}

// An autovacuum worker's transaction inserts no events, and one vacuuming
// a large events table slowly can last for hours: it must not hold the
// wall back (every covered read newer than its start would go to the
// writer, and the probe would name it as a transaction to find and end).
// Mutation killed: counting autovacuum workers (the wall stays at the
// worker's start less floor and margin).
func TestProbeWallIgnoresAutovacuum(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	settings := map[string]string{"autovacuum_naptime": "'1s'"}
	for k, v := range dbtest.ClusterSettings {
		settings[k] = v
	}
	cluster, err := pgcluster.StartTemp(ctx, settings)
	require.NoError(t, err)
	t.Cleanup(func() { cluster.Close() })
	admin, err := pgx.Connect(ctx, cluster.URL("postgres"))
	require.NoError(t, err)
	_, err = admin.Exec(ctx, "CREATE DATABASE buzz")
	admin.Close(ctx)
	require.NoError(t, err)
	url := cluster.URL("buzz")
	conn, err := pgx.Connect(ctx, url)
	require.NoError(t, err)
	defer conn.Close(context.Background())
	require.NoError(t, migrate.Up(ctx, conn))

	// A table whose vacuum sleeps after every page: autovacuum holds a
	// transaction open on it for minutes.
	for _, sql := range []string{
		`CREATE TABLE bloat (n int)`,
		`ALTER TABLE bloat SET (autovacuum_vacuum_cost_delay = 100, autovacuum_vacuum_cost_limit = 1,
		   autovacuum_vacuum_threshold = 0, autovacuum_vacuum_scale_factor = 0,
		   autovacuum_analyze_threshold = 0, autovacuum_analyze_scale_factor = 0)`,
		`INSERT INTO bloat SELECT generate_series(1, 200000)`,
		`DELETE FROM bloat`,
	} {
		_, err := conn.Exec(ctx, sql)
		require.NoError(t, err, sql)
	}
	var started time.Time
	require.Eventually(t, func() bool {
		// An autovacuum worker in this database, open for a moment already.
		err := conn.QueryRow(ctx, `SELECT xact_start FROM pg_stat_activity
			WHERE datname = current_database() AND backend_type = 'autovacuum worker'
			  AND xact_start < clock_timestamp() - interval '100 milliseconds'
			ORDER BY xact_start LIMIT 1`).Scan(&started)
		return err == nil
	}, 2*time.Minute, 50*time.Millisecond, "no autovacuum worker started")

	probe := replica.NewProbe(writerPool(t, url), replica.NewRing(), replica.DefaultFloor, time.Second, time.Now, quiet)
	e, err := probe.Tick(ctx)
	require.NoError(t, err)
	require.True(t, e.Wall.After(started.Add(-replica.DefaultFloor-replica.ClockMargin)),
		"wall %s held back by the autovacuum worker that started at %s", e.Wall, started)
}

// records is a slog handler keeping every record, for tests that count
// log lines and read their attributes.
type records struct {
	mu   sync.Mutex
	list []slog.Record
}

func (r *records) Enabled(context.Context, slog.Level) bool { return true }
func (r *records) Handle(_ context.Context, rec slog.Record) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.list = append(r.list, rec.Clone())
	return nil
}
func (r *records) WithAttrs([]slog.Attr) slog.Handler { return r }
func (r *records) WithGroup(string) slog.Handler      { return r }

// matching returns the records whose message starts with prefix, each as
// its attributes by key.
func (r *records) matching(prefix string) []map[string]slog.Value {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []map[string]slog.Value
	for _, rec := range r.list {
		if !strings.HasPrefix(rec.Message, prefix) {
			continue
		}
		attrs := map[string]slog.Value{}
		rec.Attrs(func(a slog.Attr) bool { attrs[a.Key] = a.Value; return true })
		out = append(out, attrs)
	}
	return out
}

// While the writer is down every tick fails (twice a second by default):
// the log says so once when it starts, then at most once per
// FailureReminder with the count, and once when a tick succeeds again with
// how long it failed; OnError (the failure metric) hears every failed tick.
// Mutations killed: logging every failed tick (many "failed" lines), no
// reminder, a reminder on every tick past the first interval (two
// reminders), no recovery line, or a count off by any tick.
func TestProbeLogsAFailingWriterOnceThenAtABoundedRate(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cluster, err := pgcluster.StartTemp(ctx, dbtest.ClusterSettings)
	require.NoError(t, err)
	t.Cleanup(func() { cluster.Close() })
	admin, err := pgx.Connect(ctx, cluster.URL("postgres"))
	require.NoError(t, err)
	_, err = admin.Exec(ctx, "CREATE DATABASE buzz")
	admin.Close(ctx)
	require.NoError(t, err)
	conn, err := pgx.Connect(ctx, cluster.URL("buzz"))
	require.NoError(t, err)
	require.NoError(t, migrate.Up(ctx, conn))
	conn.Close(ctx)

	var mu sync.Mutex
	clock := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	now := func() time.Time { mu.Lock(); defer mu.Unlock(); return clock }
	advance := func(d time.Duration) { mu.Lock(); defer mu.Unlock(); clock = clock.Add(d) }
	logs := &records{}
	probe := replica.NewProbe(writerPool(t, cluster.URL("buzz")), replica.NewRing(), replica.DefaultFloor,
		time.Second, now, slog.New(logs))
	failures := 0
	probe.OnError = func(error) { failures++ }
	_, err = probe.Tick(ctx)
	require.NoError(t, err)

	require.NoError(t, cluster.Stop())
	for range 20 { // ten seconds of failed ticks at the default interval
		advance(replica.DefaultProbeInterval)
		_, err := probe.Tick(ctx)
		require.Error(t, err)
	}
	require.Len(t, logs.matching("replica heartbeat probe failed"), 1, "the first failure is logged, once")
	require.Empty(t, logs.matching("replica heartbeat probe still failing"))

	advance(replica.DefaultFailureReminder)
	for range 3 {
		_, err := probe.Tick(ctx)
		require.Error(t, err)
	}
	reminders := logs.matching("replica heartbeat probe still failing")
	require.Len(t, reminders, 1, "one reminder per FailureReminder")
	require.EqualValues(t, 21, reminders[0]["failed_ticks"].Int64())
	require.EqualValues(t, 20, reminders[0]["failed_since_last_log"].Int64())

	restarted, err := pgcluster.Start(ctx, pgcluster.Options{DataDir: cluster.DataDir(), Port: cluster.Port()})
	require.NoError(t, err)
	require.False(t, restarted.Adopted())
	// The pool may hand out a connection cut by the stop once more.
	for attempt := 0; ; attempt++ {
		advance(replica.DefaultProbeInterval)
		if _, err = probe.Tick(ctx); err == nil {
			break
		}
		require.Less(t, attempt, 10, "the probe never recovered: %v", err)
	}
	recovered := logs.matching("replica heartbeat probe recovered")
	require.Len(t, recovered, 1)
	require.EqualValues(t, failures, recovered[0]["failed_ticks"].Int64(), "every failed tick counted")
	require.GreaterOrEqual(t, failures, 23)
	require.Greater(t, recovered[0]["failed_for"].Duration(), replica.DefaultFailureReminder)
	require.Len(t, logs.matching("replica heartbeat probe failed"), 1)
	require.Len(t, logs.matching("replica heartbeat probe still failing"), 1)
}

// A tick that cannot write its token within TickTimeout (here the heartbeat
// row locked by a session left open; a writer that stopped answering is the
// same) fails: routing closes at once, OnError counts it and the log says
// why. Unbounded, the tick waited on the lock as long as it was held,
// counted and logged nowhere, while reads routed on the older tokens until
// they aged out. The writer ends the wait itself (the tick's lock_timeout),
// so the tick keeps its connection: cut off by the relay's deadline, each
// tick while the row stayed locked closed it and the next dialed again.
// Mutations killed: a tick without its own deadline (Tick waits on the lock
// until the locker lets go); a tick without lock_timeout (the deadline
// closes the connection, and the tick after the lock dials a new one).
func TestProbeTickBlockedOnTheHeartbeatFails(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := dbtest.URL(t)
	ring := replica.NewRing()
	pool := writerPool(t, url)
	probe := replica.NewProbe(pool, ring, replica.DefaultFloor, time.Second, time.Now, quiet)
	failures := 0
	probe.OnError = func(error) { failures++ }
	_, err := probe.Tick(ctx)
	require.NoError(t, err)
	_, open := ring.Newest(time.Now())
	require.True(t, open)
	dialed := pool.Stat().NewConnsCount()

	locker := openTransaction(t, url, "heartbeat locker")
	_, err = locker.Exec(ctx, "SELECT token FROM replica_heartbeat FOR UPDATE")
	require.NoError(t, err)
	probe.TickTimeout = 200 * time.Millisecond
	ticked := make(chan error, 1)
	go func() {
		_, err := probe.Tick(ctx)
		ticked <- err
	}()
	select {
	case err = <-ticked:
	case <-time.After(time.Minute): // a failure bound only
		require.NoError(t, locker.Rollback(ctx))
		t.Fatal("the tick waited on the locked heartbeat row for a minute")
	}
	require.ErrorContains(t, err, "the replica_heartbeat row was locked by another session for over 200ms")
	require.Equal(t, 1, failures)
	_, open = ring.Newest(time.Now())
	require.False(t, open, "routing closes with the failed tick")

	require.NoError(t, locker.Rollback(ctx))
	_, err = probe.Tick(ctx)
	require.NoError(t, err)
	_, open = ring.Newest(time.Now())
	require.True(t, open)
	require.Equal(t, dialed, pool.Stat().NewConnsCount(), "connections the probe dialed again after the failed tick")
}
