package main

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/buzzrelay/buzz/internal/config"
	"github.com/buzzrelay/buzz/internal/dbtest"
	"github.com/buzzrelay/buzz/internal/migrate"
)

// `migrate to N` queued behind another run decides whether it goes down
// (and so needs --destroy-data) from the version it finds once it holds
// the migrator lock, not from the one it read before queueing: a deploy's
// `migrate` finishing first would otherwise be undone, its tables dropped
// with their rows, by a run that never asked to destroy data.
// Mutation killed: the --destroy-data check made before the lock.
func TestQueuedMigrateToChecksDestroyDataUnderTheLock(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cfg := config.Default()
	cfg.DatabaseURL = dbtest.EmptyURL(t)
	require.NoError(t, runMigrate(ctx, cfg, []string{"to", "18"}))

	// Another run (a deploy's `buzz-relay migrate`) holds the migrator lock.
	other, err := pgx.Connect(ctx, cfg.DatabaseURL)
	require.NoError(t, err)
	defer other.Close(context.Background())
	const migratorLockKey int64 = 0x62757a7a6d696731
	_, err = other.Exec(ctx, "SELECT pg_advisory_lock($1)", migratorLockKey)
	require.NoError(t, err)

	errc := make(chan error, 1)
	go func() { errc <- runMigrate(ctx, cfg, []string{"to", "19"}) }()
	require.Eventually(t, func() bool {
		var n int
		err := other.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND pid <> pg_backend_pid() AND query LIKE '%pg_try_advisory_lock%'`).Scan(&n)
		return err == nil && n > 0
	}, 20*time.Second, 20*time.Millisecond, "the second run queues")

	// The other run migrates to the latest version, then lets go.
	require.NoError(t, migrate.Up(ctx, other)) // re-entrant: same session
	_, err = other.Exec(ctx, "SELECT pg_advisory_unlock($1)", migratorLockKey)
	require.NoError(t, err)
	st, err := migrate.CurrentStatus(ctx, other)
	require.NoError(t, err)
	require.False(t, st.Behind())

	require.ErrorContains(t, <-errc, "add --destroy-data")
	after, err := migrate.CurrentStatus(ctx, other)
	require.NoError(t, err)
	require.Equal(t, st.Latest, after.Current, "the queued run went down without --destroy-data")
}
