package relay_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/buzzrelay/buzz/internal/config"
	"github.com/buzzrelay/buzz/internal/dbtest"
	"github.com/buzzrelay/buzz/internal/relaytest"
)

// With one read slot (a 3-connection pool, one group writer) and every
// events statement held up by a lock, the first REQ holds the slot until its
// statement times out, the second waits for it and times out the same way,
// and the third, still waiting when its own budget ends, is told the relay
// is busy. Once the lock goes, REQs are answered again.
//
// Mutations killed: the relay not sizing the read slots from its pool (with
// more than one slot the third REQ runs and times out); the busy refusal
// answered with the timeout's text.
func TestAREQWaitingForABusyReadSlotIsToldSo(t *testing.T) {
	t.Parallel()
	url := dbtest.URL(t)
	pool := dbtest.PoolOn(t, url, 3)
	// Wide enough that the order below survives a loaded machine: each
	// step has a third of it (1.5 s) to spare.
	const budget = 4500 * time.Millisecond
	r := relaytest.StartOn(t, pool, func(c *config.Config) {
		c.QueryTimeout = budget
		c.IngestGroupWriters = 1
	})
	key := relaytest.NewKey(t)
	clients := make([]*relaytest.Client, 3)
	for i := range clients {
		clients[i] = r.Dial(t, "")
		clients[i].Auth(key)
	}

	locker, err := pgx.Connect(context.Background(), url)
	require.NoError(t, err)
	t.Cleanup(func() { _ = locker.Close(context.Background()) })
	tx, err := locker.Begin(context.Background())
	require.NoError(t, err)
	_, err = tx.Exec(context.Background(), "LOCK TABLE events IN ACCESS EXCLUSIVE MODE")
	require.NoError(t, err)
	t.Cleanup(func() { _ = tx.Rollback(context.Background()) })

	// A third of the budget apart, counted from when the first REQ's
	// statement waits on the lock (a loaded relay may read the REQ late):
	// the second gets the slot when the first times out, at 1 budget, and
	// holds it to 2; the third gives up at 1.67. Each step has a third of
	// the budget to spare. At a fifth apart counted from the sends, the
	// second REQ had 600 ms for the first one's cancellation and any lag in
	// reading it.
	observer, err := pgx.Connect(context.Background(), url)
	require.NoError(t, err)
	t.Cleanup(func() { _ = observer.Close(context.Background()) })
	clients[0].Send("REQ", "s", map[string]any{"kinds": []int{1}})
	require.Eventually(t, func() bool {
		var waiting int
		err := observer.QueryRow(context.Background(), `SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND wait_event_type = 'Lock' AND pid <> pg_backend_pid()`).Scan(&waiting)
		return err == nil && waiting == 1
	}, time.Minute, 5*time.Millisecond, "the first REQ's statement waits on the lock")
	for _, c := range clients[1:] {
		time.Sleep(budget / 3)
		c.Send("REQ", "s", map[string]any{"kinds": []int{1}})
	}
	want := []string{
		"error: query timed out; narrow the filter",
		"error: query timed out; narrow the filter",
		"error: the relay is busy reading; send the request again shortly",
	}
	for i, c := range clients {
		reply := c.Expect("CLOSED")
		require.Equal(t, want[i], reply.Msg, "REQ %d", i)
	}

	require.NoError(t, tx.Rollback(context.Background()))
	require.True(t, clients[2].Publish(clients[2].Sign(1, "after the lock", nil, 0)).OK)
	require.Len(t, clients[2].Req("after", map[string]any{"kinds": []int{1}}), 1, "answered once the lock is gone")
}
