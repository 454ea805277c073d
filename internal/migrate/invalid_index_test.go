package migrate_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/buzzrelay/buzz/internal/dbtest"
	"github.com/buzzrelay/buzz/internal/migrate"
)

// An interrupted CREATE INDEX CONCURRENTLY leaves an INVALID index. A
// re-run's IF NOT EXISTS would keep it, and 019 would then drop the old
// index it replaces, leaving kinds reads with no usable index: migrate
// refuses to start instead, naming the index, and goes on once it is
// dropped.
// Mutation killed: without the check the run succeeds and the index stays
// INVALID while events_by_kind is gone.
func TestMigrateRefusesToRunOverAnInvalidIndex(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	conn := connect(t, dbtest.EmptyURL(t))
	exec := func(sql string) {
		t.Helper()
		_, err := conn.Exec(ctx, sql)
		require.NoError(t, err)
	}
	require.NoError(t, migrate.To(ctx, conn, 18))
	// What a cancelled concurrent build of 019's first kinds index leaves.
	exec("CREATE INDEX events_by_kind_time ON events (community_id, kind, created_at, id)")
	exec("UPDATE pg_index SET indisvalid = false WHERE indexrelid = 'events_by_kind_time'::regclass")

	err := migrate.To(ctx, conn, 19)
	require.ErrorContains(t, err, "index public.events_by_kind_time is INVALID")
	require.ErrorContains(t, err, "run DROP INDEX CONCURRENTLY public.events_by_kind_time; then")
	st, err := migrate.CurrentStatus(ctx, conn)
	require.NoError(t, err)
	require.EqualValues(t, 18, st.Current)
	var oldIndex bool
	require.NoError(t, conn.QueryRow(ctx, "SELECT to_regclass('events_by_kind') IS NOT NULL").Scan(&oldIndex))
	require.True(t, oldIndex, "the index 019 replaces is still there")

	exec("DROP INDEX CONCURRENTLY events_by_kind_time")
	require.NoError(t, migrate.To(ctx, conn, 19))
	var valid bool
	require.NoError(t, conn.QueryRow(ctx, "SELECT indisvalid FROM pg_index WHERE indexrelid = 'events_by_kind_time'::regclass").Scan(&valid))
	require.True(t, valid)
}

// A community deletion's purge takes the schema destruction lock shared at
// the start of its transaction. A migration that builds indexes
// concurrently waits for every older snapshot; had it held the lock
// exclusively, a purge queued behind it would hold a snapshot while waiting
// for the lock, and the two deadlock (PostgreSQL cancels the build and
// leaves its index INVALID). Disable-tx migrations therefore run without
// the lock.
// Mutation killed: holding the lock for 019 too fails with "deadlock
// detected".
func TestConcurrentIndexBuildDoesNotDeadlockAQueuedPurge(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := dbtest.EmptyURL(t)
	conn := connect(t, url)
	require.NoError(t, migrate.To(ctx, conn, 18))

	// A purge holding the lock shared while the migration starts.
	holder := connect(t, url)
	held, err := holder.Begin(ctx)
	require.NoError(t, err)
	_, err = held.Exec(ctx, "SELECT pg_advisory_xact_lock_shared($1)", migrate.SchemaDestructionLockKey)
	require.NoError(t, err)

	migrated := make(chan error, 1)
	go func() { migrated <- migrate.To(ctx, conn, 19) }()
	time.Sleep(300 * time.Millisecond) // the migration is under way (or, holding the lock, waits for it)

	// A second purge asks for the lock with its snapshot taken.
	queued := connect(t, url)
	purge, err := queued.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead})
	require.NoError(t, err)
	_, err = purge.Exec(ctx, "SELECT count(*) FROM events")
	require.NoError(t, err)
	locked := make(chan error, 1)
	go func() {
		_, err := purge.Exec(ctx, "SELECT pg_advisory_xact_lock_shared($1)", migrate.SchemaDestructionLockKey)
		locked <- err
	}()
	time.Sleep(300 * time.Millisecond)
	require.NoError(t, held.Commit(ctx))

	select {
	case err := <-locked:
		require.NoError(t, err)
	case err := <-migrated:
		require.NoError(t, err, "the migration failed while a purge waited")
		require.NoError(t, <-locked)
	}
	require.NoError(t, purge.Commit(ctx))
	require.NoError(t, <-migrated)
	var invalid int
	require.NoError(t, conn.QueryRow(ctx, "SELECT count(*) FROM pg_index WHERE NOT indisvalid").Scan(&invalid))
	require.Zero(t, invalid)
}

// The wait for the schema destruction lock is unbounded on purpose, but
// the migration after it runs under the session's own lock_timeout: one
// that cannot have its table lock fails instead of queueing every query
// on the table behind a long transaction.
// Mutation killed: without RESET lock_timeout after the advisory lock, 010
// waits behind the reader until the test's deadline.
func TestMigrationKeepsTheSessionLockTimeout(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	url := dbtest.EmptyURL(t)
	cfg, err := pgx.ParseConfig(url)
	require.NoError(t, err)
	cfg.RuntimeParams["lock_timeout"] = "300"
	conn, err := pgx.ConnectConfig(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(func() { conn.Close(context.Background()) })
	require.NoError(t, migrate.To(ctx, conn, 9))

	reader := connect(t, url)
	long, err := reader.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = long.Rollback(context.Background()) }()
	_, err = long.Exec(ctx, "SELECT count(*) FROM events")
	require.NoError(t, err)

	err = migrate.To(ctx, conn, 10) // ALTER TABLE events: ACCESS EXCLUSIVE
	require.ErrorContains(t, err, "lock timeout")
	require.NoError(t, ctx.Err())
}

// A disable-tx migration (a concurrent index build) runs without the
// session's lock_timeout and statement_timeout, which the README asks the
// migrator's role to have: the build blocks no writer while it waits for
// older snapshots, and cancelled it would leave its index INVALID.
// Mutations killed: without lifting lock_timeout for disable-tx steps,
// 019's build fails with "lock timeout" while a reader's snapshot is open;
// without lifting statement_timeout, with "statement timeout".
func TestConcurrentIndexBuildOutwaitsTheSessionTimeouts(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := dbtest.EmptyURL(t)
	require.NoError(t, migrate.To(ctx, connect(t, url), 18))
	cfg, err := pgx.ParseConfig(url)
	require.NoError(t, err)
	cfg.RuntimeParams["lock_timeout"] = "100"
	cfg.RuntimeParams["statement_timeout"] = "300"
	conn, err := pgx.ConnectConfig(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(func() { conn.Close(context.Background()) })

	reader := connect(t, url)
	snapshot, err := reader.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead})
	require.NoError(t, err)
	_, err = snapshot.Exec(ctx, "SELECT count(*) FROM events")
	require.NoError(t, err)
	migrated := make(chan error, 1)
	go func() { migrated <- migrate.To(ctx, conn, 19) }()
	waitForLockWait(t, url, migrated)
	time.Sleep(600 * time.Millisecond) // a build under either timeout has failed by now
	require.NoError(t, snapshot.Commit(ctx))
	require.NoError(t, <-migrated)
	var invalid int
	require.NoError(t, conn.QueryRow(ctx, "SELECT count(*) FROM pg_index WHERE NOT indisvalid").Scan(&invalid))
	require.Zero(t, invalid)
	var lockTimeout string
	require.NoError(t, conn.QueryRow(ctx, "SHOW lock_timeout").Scan(&lockTimeout))
	require.Equal(t, "100ms", lockTimeout, "the session's own setting is back after the step")
}

// 013's documented way on a large table: add the column and build the
// index concurrently by hand, then migrate; the migration keeps both.
// Mutation killed: without IF NOT EXISTS, 013 fails on the column.
func TestWebhookIdempotencyPrebuiltByHand(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	conn := connect(t, dbtest.EmptyURL(t))
	require.NoError(t, migrate.To(ctx, conn, 12))
	for _, sql := range []string{
		`ALTER TABLE workflow_runs ADD COLUMN idempotency_key text NULL
		    CONSTRAINT workflow_runs_idempotency_key_len CHECK (length(idempotency_key) BETWEEN 1 AND 255)`,
		`CREATE UNIQUE INDEX CONCURRENTLY workflow_runs_idempotency ON workflow_runs (community_id, workflow_id, idempotency_key)
		    WHERE idempotency_key IS NOT NULL`,
	} {
		_, err := conn.Exec(ctx, sql)
		require.NoError(t, err)
	}
	require.NoError(t, migrate.To(ctx, conn, 13))
}

// Two deploys each run `buzz-relay migrate` on an empty database at once.
// They queue: every run succeeds and no index is left INVALID. Before, a
// run waited for tern's lock inside a statement while the other built an
// index concurrently; the build waited for the waiter's snapshot, PostgreSQL
// broke the deadlock by cancelling one of them, and a cancelled build left
// an INVALID index that the next run's IF NOT EXISTS recorded as migrated.
// Mutation killed: without lockMigrator the runs fail with "deadlock
// detected" (and may leave idx_channels_id_live INVALID at version 26).
func TestConcurrentMigrationRunsQueue(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	url := dbtest.EmptyURL(t)
	const runs = 4
	conns := make([]*pgx.Conn, runs)
	for i := range conns {
		conns[i] = connect(t, url)
	}
	errs := make(chan error, runs)
	for _, conn := range conns {
		go func() { errs <- migrate.Up(ctx, conn) }()
	}
	for range runs {
		require.NoError(t, <-errs)
	}
	st, err := migrate.CurrentStatus(ctx, conns[0])
	require.NoError(t, err)
	require.False(t, st.Behind())
	rows, err := conns[0].Query(ctx, "SELECT indexrelid::regclass::text FROM pg_index WHERE NOT indisvalid")
	require.NoError(t, err)
	invalid, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	require.Empty(t, invalid)
}
