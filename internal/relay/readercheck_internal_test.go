package relay

import (
	"context"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/buzzrelay/buzz/internal/config"
	"github.com/buzzrelay/buzz/internal/dbtest"
	"github.com/buzzrelay/buzz/internal/replica"
)

// The reader watcher's check does not queue behind routed reads: with
// every reader connection taken (a burst of reads), a check through the
// routed pool would wait out its budget and report, and log, a healthy
// standby as unreachable.
// Mutation killed: checking through the routed pool (unreachable).
func TestReaderCheckDoesNotQueueBehindRoutedReads(t *testing.T) {
	t.Parallel()
	writer := dbtest.URL(t)
	poolCfg, err := pgxpool.ParseConfig(writer)
	require.NoError(t, err)
	replica.ArmFloor(poolCfg, replica.DefaultFloor)
	pool, err := pgxpool.NewWithConfig(context.Background(), poolCfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	cfg := config.Default()
	cfg.ReadDatabaseURL = dbtest.ReaderURL(t, writer)
	cfg.ReadPoolSize = 1
	srv := New(cfg, pool, slog.New(slog.NewTextHandler(io.Discard, nil)))
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	require.NoError(t, srv.StartReadReplica(ctx))
	r := srv.replica.Load()
	require.Eventually(t, func() bool { return *r.state.Load() == "streaming" }, 30*time.Second, 20*time.Millisecond)
	held, err := r.pool.Acquire(ctx) // every routed connection taken
	require.NoError(t, err)
	defer held.Release()
	require.Equal(t, "streaming", srv.checkReader(ctx, r))
}
