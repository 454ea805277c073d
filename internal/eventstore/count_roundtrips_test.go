package eventstore_test

import (
	"context"
	"net"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/buzzrelay/buzz/internal/db"
	"github.com/buzzrelay/buzz/internal/dbtest"
	"github.com/buzzrelay/buzz/internal/eventstore"
	"github.com/buzzrelay/buzz/internal/nostr"
)

// writeCounter counts the writes to a database connection: pgx writes
// once for each round trip it makes.
type writeCounter struct {
	net.Conn
	writes *atomic.Int64
}

func (c writeCounter) Write(p []byte) (int, error) {
	c.writes.Add(1)
	return c.Conn.Write(p)
}

// A COUNT costs one round trip to the database once its statement is
// prepared: sequential scans are turned off in the same batch as the
// count, not in a transaction of its own (BEGIN, SET LOCAL, the count,
// COMMIT: four). The setting ends with the batch: the connection's next
// statement plans with sequential scans on again.
//
// Mutation killed: the transaction of four statements (4 writes a COUNT).
func TestCountIsOneRoundTrip(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	var writes atomic.Int64
	pool := dbtest.PoolOn(t, dbtest.URL(t), 1, func(c *pgxpool.Config) {
		dial := c.ConnConfig.DialFunc
		c.ConnConfig.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
			conn, err := dial(ctx, network, addr)
			if err != nil {
				return nil, err
			}
			return writeCounter{Conn: conn, writes: &writes}, nil
		}
	})
	community, err := db.New(pool).CommunityEnsure(ctx, "count-round-trips.example")
	require.NoError(t, err)
	store := eventstore.New(pool, 10)
	filters := nostr.Filters{{Kinds: []int{1}}}
	_, _, err = store.Count(ctx, community.ID, eventstore.Scope{}, filters) // prepares
	require.NoError(t, err)

	before := writes.Load()
	for range 10 {
		_, _, err := store.Count(ctx, community.ID, eventstore.Scope{}, filters)
		require.NoError(t, err)
	}
	require.Equal(t, int64(10), writes.Load()-before, "writes to the database for 10 COUNTs")

	var seqscan string
	require.NoError(t, pool.QueryRow(ctx, "SELECT current_setting('enable_seqscan')").Scan(&seqscan))
	require.Equal(t, "on", seqscan, "the setting outlived the COUNT")
}
