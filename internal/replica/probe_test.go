package replica_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/buzzrelay/buzz/internal/dbtest"
	"github.com/buzzrelay/buzz/internal/replica"
)

// The wall is bounded by the oldest open transaction, sampled before the
// token is written; an idle session holds nothing back. Tokens strictly
// increase within one epoch.
// Mutation killed: sampling after the token write, or ignoring open
// transactions (wall = S - floor), fails the wall bound below.
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

// A session still starting up (authenticated, not yet ready for its first
// query) shows no state and no transaction even to a superuser. It cannot
// have an event in flight, so it must not fail the tick as if hidden.
// Mutation killed: counting a visible backend with no state as masked (the
// tick fails while other clients connect).
func TestProbeIgnoresSessionsStillStartingUp(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	url := dbtest.URL(t)
	probe := replica.NewProbe(writerPool(t, url), replica.NewRing(), replica.DefaultFloor, time.Second, time.Now, quiet)

	var connecting sync.WaitGroup
	for range 4 {
		connecting.Add(1)
		go func() {
			defer connecting.Done()
			for ctx.Err() == nil {
				if conn, err := pgx.Connect(ctx, url); err == nil {
					_ = conn.Close(context.Background())
				}
			}
		}()
	}
	defer connecting.Wait()
	defer cancel()
	for range 300 {
		_, err := probe.Tick(ctx)
		require.NoError(t, err)
	}
}
