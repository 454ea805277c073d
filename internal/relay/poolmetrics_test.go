package relay_test

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/buzzrelay/buzz/internal/dbtest"
	"github.com/buzzrelay/buzz/internal/nostr"
	"github.com/buzzrelay/buzz/internal/relaytest"
)

// A publish that finds every writer connection taken waits in Acquire, and
// the pool metrics show it: every connection acquired while they are held,
// then one more wait, lasting about as long as the hold.
//
// Mutations killed: the collector not registered (no series); the acquired
// and idle gauges swapped; the wait count read from another stat (no wait
// counted); the wait time not reported (less than a tenth of the hold).
func TestWriterPoolMetricsShowAnAcquireWait(t *testing.T) {
	t.Parallel()
	const maxConns = 3
	pool := dbtest.PoolOn(t, dbtest.URL(t), maxConns)
	r := relaytest.StartOn(t, pool)
	key := relaytest.NewKey(t)
	c := r.Dial(t, "")
	c.Auth(key)
	require.Equal(t, strconv.Itoa(maxConns), metric(t, r, "buzz_db_pool_max"))
	count := func(name string) float64 {
		t.Helper()
		v, err := strconv.ParseFloat(metric(t, r, name), 64)
		require.NoError(t, err, name)
		return v
	}
	waitsBefore := count("buzz_db_pool_acquire_waits_total")
	waitedBefore := count("buzz_db_pool_acquire_wait_seconds_total")

	var held []*pgxpool.Conn
	for len(held) < maxConns {
		conn, err := pool.Acquire(context.Background())
		require.NoError(t, err)
		held = append(held, conn)
	}
	release := func() {
		for _, conn := range held {
			conn.Release()
		}
		held = nil
	}
	t.Cleanup(release)
	require.Equal(t, strconv.Itoa(maxConns), metric(t, r, `buzz_db_pool_conns{state="acquired"}`))
	require.Equal(t, "0", metric(t, r, `buzz_db_pool_conns{state="idle"}`))

	// The hold is long and the floor checked below a tenth of it: the
	// publish must reach Acquire within the other nine tenths, which a
	// loaded machine under the race detector did not always do within the
	// half of a 200 ms hold the check once left it.
	const hold = 2 * time.Second
	ok := make(chan bool, 1)
	go func() { ok <- c.Publish(relaytest.SignEvent(t, key, 1, "waits for a connection", nostr.Tags{}, 0)).OK }()
	time.Sleep(hold)
	release()
	require.True(t, <-ok)

	require.Greater(t, count("buzz_db_pool_acquire_waits_total"), waitsBefore, "the publish waited for a connection")
	// The relay asks for a connection only once it has read and verified
	// the event, some time after the hold began: a tenth of it is a floor.
	require.GreaterOrEqual(t, count("buzz_db_pool_acquire_wait_seconds_total")-waitedBefore, (hold / 10).Seconds(),
		"the wait lasted about as long as every connection was held")
	require.Positive(t, count("buzz_db_pool_new_conns_total"))
}
