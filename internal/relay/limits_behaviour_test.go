package relay_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/buzzrelay/buzz/internal/config"
	"github.com/buzzrelay/buzz/internal/db"
	"github.com/buzzrelay/buzz/internal/dberr"
	"github.com/buzzrelay/buzz/internal/dbtest"
	"github.com/buzzrelay/buzz/internal/eventstore"
	"github.com/buzzrelay/buzz/internal/nostr"
	"github.com/buzzrelay/buzz/internal/relay"
	"github.com/buzzrelay/buzz/internal/relaytest"
)

// A client that stops answering pings is closed: it stops reading, so its
// WebSocket library sends no pong.
func TestMissedPongClosesTheConnection(t *testing.T) {
	t.Parallel()
	r := relaytest.Start(t, func(c *config.Config) { c.PingInterval = 200 * time.Millisecond })
	c := r.Dial(t, "")
	c.Auth(nil)
	require.Eventually(t, func() bool { return connections(r) == 0 }, 60*time.Second, 20*time.Millisecond)
}

// A connection whose REQ is being handled is not closed for missed pongs:
// the relay reads pongs only in its read loop, which waits for the
// handler, so a REQ that takes several ping intervals (here it waits for a
// lock on events; a long history streamed to a slow reader does the same)
// would otherwise cut off a client that answers every ping. Once the REQ
// is answered, pings count again: the client stops reading and is closed.
//
// Pings every 500 ms: the client answers pings only while it reads, and
// between its AUTH's answer and its REQ it does not; at 200 ms a goroutine
// held up that long on a loaded box (race detector, 2 cores) missed a pong
// before the REQ arrived, and the connection was rightly closed.
//
// Mutations killed: closing on every missed pong (the EOSE never comes);
// leaving the handling flag set after the handler (never closed after).
func TestPingSparesAConnectionWhileItsRequestIsHandled(t *testing.T) {
	t.Parallel()
	r := relaytest.Start(t, func(c *config.Config) { c.PingInterval = 500 * time.Millisecond })
	ctx := context.Background()
	lock, err := r.Pool.Begin(ctx)
	require.NoError(t, err)
	// Locked before the client connects: taking the lock can wait (for the
	// relay's own ANALYZE, say) longer than two ping intervals, and a client
	// that does not read meanwhile rightly misses its pongs.
	_, err = lock.Exec(ctx, `LOCK TABLE events IN ACCESS EXCLUSIVE MODE`)
	if err != nil {
		_ = lock.Rollback(ctx)
		require.NoError(t, err)
	}
	c := r.Dial(t, "")
	c.Auth(nil)
	released := make(chan struct{})
	go func() {
		defer close(released)
		time.Sleep(5 * time.Second) // ten ping intervals
		_ = lock.Rollback(ctx)
	}()
	defer func() { <-released }()
	c.Send("REQ", "waits", map[string]any{"kinds": []int{1}})
	msg, err := c.TryNext(30 * time.Second) // reads, so the client answers every ping
	require.NoError(t, err, "the connection was closed while its REQ waited")
	require.JSONEq(t, `"EOSE"`, string(msg[0]))
	require.Eventually(t, func() bool { return connections(r) == 0 }, 60*time.Second, 20*time.Millisecond,
		"a client that stops reading after its answer misses pongs and is closed")
}

// A write the client never takes (it stopped reading and the socket buffers
// are full) is cut off by the write watchdog.
func TestWriteWatchdogClosesAStuckWrite(t *testing.T) {
	// Not parallel: it pushes tens of megabytes through loopback, and alone
	// it does not starve the timing-sensitive tests that run in parallel.
	r := relaytest.Start(t, func(c *config.Config) { c.WriteTimeout = time.Second; c.PingInterval = time.Hour })
	pub := r.Dial(t, "")
	pub.Auth(nil)
	big := strings.Repeat("x", 60<<10)
	for i := range 50 {
		require.True(t, pub.Publish(pub.Sign(1, fmt.Sprint(i, big), nil, 0)).OK)
	}
	stuck := r.Dial(t, "")
	stuck.Auth(nil)
	// About 30 MB of history, well past what loopback socket buffers hold;
	// the client never reads it.
	for i := range 10 {
		stuck.Send("REQ", fmt.Sprint("h", i), map[string]any{"kinds": []int{1}})
	}
	require.Eventually(t, func() bool { return connections(r) == 1 }, 60*time.Second, 20*time.Millisecond,
		"the stuck connection is closed; the publisher's stays")
}

// A subscriber whose live queue overflows is closed with 1008 (policy
// violation) after what was queued.
func TestSlowClientIsClosedWith1008(t *testing.T) {
	// Not parallel: it pushes tens of megabytes through loopback, and alone
	// it does not starve the timing-sensitive tests that run in parallel.
	r := relaytest.Start(t, func(c *config.Config) { c.SendQueue = 4; c.WriteTimeout = time.Hour; c.PingInterval = time.Hour })
	slow := r.Dial(t, "")
	slow.Auth(nil)
	slow.Send("REQ", "live", map[string]any{"kinds": []int{1}, "limit": 0})
	slow.Expect("EOSE")
	pub := r.Dial(t, "")
	pub.Auth(nil)
	big := strings.Repeat("x", 60<<10)
	for i := 0; testutil.ToFloat64(r.Server.Metrics().SlowClosed) == 0; i++ {
		require.Less(t, i, 2000, "the slow client's queue never overflowed")
		require.True(t, pub.Publish(pub.Sign(1, fmt.Sprint(i, big), nil, 0)).OK)
	}
	err := readUntilClosed(slow.WS, 60*time.Second)
	require.Equal(t, websocket.StatusPolicyViolation, websocket.CloseStatus(err), "got %v", err)
}

// /ready answers 503 while the database is unreachable and while shutting
// down; /health stays 200 (the process is alive).
func TestReadyIs503WithoutDatabaseOrWhileShuttingDown(t *testing.T) {
	t.Parallel()
	get := func(r *relaytest.Relay, path string) (int, string) {
		resp, err := bridgeHTTP.Get(r.HTTPURL + path)
		require.NoError(t, err)
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(body)
	}
	pool, err := pgxpool.New(context.Background(), dbtest.URL(t))
	require.NoError(t, err)
	down := relaytest.StartOn(t, pool)
	status, _ := get(down, "/ready")
	require.Equal(t, http.StatusOK, status)
	pool.Close()
	status, body := get(down, "/ready")
	require.Equal(t, http.StatusServiceUnavailable, status)
	require.Contains(t, body, "database unavailable")
	status, _ = get(down, "/health")
	require.Equal(t, http.StatusOK, status)
	// A route the database could not serve answers the one text the
	// webhooks answer too.
	req, err := http.NewRequest(http.MethodGet, down.HTTPURL+"/", nil)
	require.NoError(t, err)
	req.Host = "unknown-" + uuid.NewString()[:8] + ".example"
	resp, err := bridgeHTTP.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, http.StatusServiceUnavailable, resp.StatusCode)
	var answer map[string]string
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&answer))
	require.Equal(t, map[string]string{"error": dberr.UnavailableAnswer}, answer)

	closing := relaytest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	require.NoError(t, closing.Shutdown(ctx))
	status, body = get(closing, "/ready")
	require.Equal(t, http.StatusServiceUnavailable, status)
	require.Contains(t, body, "shutting down")
}

// A REQ or COUNT that runs out of its query budget is CLOSED with a reason
// that says so; the connection survives.
func TestQueryTimeoutAnswersClosed(t *testing.T) {
	t.Parallel()
	r := relaytest.Start(t, func(c *config.Config) { c.QueryTimeout = time.Nanosecond })
	c := r.Dial(t, "")
	c.Auth(nil)
	for _, verb := range []string{"REQ", "COUNT"} {
		c.Send(verb, "slow", map[string]any{"kinds": []int{1}})
		closed := c.Expect("CLOSED")
		require.Equal(t, "slow", closed.SubID)
		require.Equal(t, "error: query timed out; narrow the filter", closed.Msg, verb)
	}
	require.True(t, c.Publish(c.Sign(1, "still connected", nil, 0)).OK)
}

// The hand-built REQ and COUNT statements are timed by name.
func TestDynamicStatementsAreTimedByName(t *testing.T) {
	t.Parallel()
	r := relaytest.Start(t)
	c := r.Dial(t, "")
	c.Auth(nil)
	require.True(t, c.Publish(c.Sign(1, "timed", nil, 0)).OK)
	require.Len(t, c.Req("q", map[string]any{"kinds": []int{1}}), 1)
	c.Send("COUNT", "n", map[string]any{"kinds": []int{1}})
	require.Equal(t, int64(1), c.Expect("COUNT").Count)
	c.Send("REQ", "s", map[string]any{"search": "timed"})
	require.Equal(t, "EVENT", c.NextReply().Verb)
	c.Expect("EOSE")

	resp, err := bridgeHTTP.Get(r.MetricsURL + "/metrics")
	require.NoError(t, err)
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	for _, name := range []string{"EventsQueryPage", "EventsCount", "EventsSearchPage"} {
		require.Contains(t, string(body), `buzz_db_query_seconds_count{query="`+name+`"} 1`, name)
	}
}

// A client that takes longer than the query budget to receive its history
// still gets all of it: each page's statement has the budget, the client's
// pace does not count against it.
func TestSlowReaderGetsItsWholeHistory(t *testing.T) {
	// Not parallel: it pushes tens of megabytes through loopback, and alone
	// it does not starve the timing-sensitive tests that run in parallel.
	// Each page's statement has the whole budget: 3 s, so a loaded machine
	// does not time out a 10-row page (1 s once left it little room).
	const budget = 3 * time.Second
	r := relaytest.Start(t, func(c *config.Config) { c.QueryTimeout = budget; c.ReqPageRows = 10 })
	key := relaytest.NewKey(t)
	const stored = 500 // about 30 MB: more than the reply queue and socket buffers hold
	storeLargeEvents(t, r, key, stored)
	c := r.Dial(t, "")
	c.Auth(key)
	c.Send("REQ", "all", map[string]any{"kinds": []int{1}})
	require.Equal(t, "EVENT", c.NextReply().Verb)
	time.Sleep(budget + time.Second) // the reader dawdles past the query budget
	require.Equal(t, stored, 1+historyUntilEOSE(t, c))
}

// With the statement timer on the pool, generated queries are timed by
// their sqlc name too, and the hand-built ones once each, a COUNT's too,
// which is sent as a batch (pgx traces a batch's statements through the
// batch hooks only).
func TestStatementTimerTimesGeneratedQueries(t *testing.T) {
	t.Parallel()
	pool := dbtest.PoolOn(t, dbtest.URL(t), 0, func(c *pgxpool.Config) { c.ConnConfig.Tracer = relay.NewStatementTimer() })
	r := relaytest.StartOn(t, pool)
	c := r.Dial(t, "")
	c.Auth(nil)
	require.True(t, c.Publish(c.Sign(1, "timed", nil, 0)).OK)
	require.Len(t, c.Req("q", map[string]any{"kinds": []int{1}}), 1)
	c.Send("COUNT", "n", map[string]any{"kinds": []int{1}})
	require.Equal(t, int64(1), c.Expect("COUNT").Count)

	resp, err := bridgeHTTP.Get(r.MetricsURL + "/metrics")
	require.NoError(t, err)
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	require.Contains(t, string(body), `buzz_db_query_seconds_count{query="CommunityResolveServing"}`)
	require.Contains(t, string(body), `buzz_db_query_seconds_count{query="EventsQueryPage"} 1`)
	require.Contains(t, string(body), `buzz_db_query_seconds_count{query="EventsCount"} 1`)
}

// A client that does not read its history pins at most ReplyQueueBytes of
// queued replies, however large its events: the connection's reader waits
// for room instead of queueing a whole reply queue of them (256 events of
// 60 KB would be 15 MB per connection, 50 connections per address).
// Mutation killed: queueing replies by count alone.
func TestStalledReaderPinsAtMostTheReplyQueueBytes(t *testing.T) {
	// Not parallel: it pushes megabytes through loopback, and alone it does
	// not starve the timing-sensitive tests that run in parallel.
	const budget = 64 << 10
	r := relaytest.Start(t, func(c *config.Config) { c.ReplyQueueBytes = budget })
	key := relaytest.NewKey(t)
	const stored = 300 // about 18 MB: more than the socket buffers hold
	storeLargeEvents(t, r, key, stored)
	queued := func() float64 { return testutil.ToFloat64(r.Server.Metrics().ReplyQueueBytes) }
	c := r.Dial(t, "")
	c.Auth(key)
	c.Send("REQ", "all", map[string]any{"kinds": []int{1}})

	// The client reads nothing: the relay fills the socket buffers, then
	// its reply queue, and must stop there.
	require.Eventually(t, func() bool { return queued() >= budget/2 }, 30*time.Second, 5*time.Millisecond)
	for range 20 {
		require.LessOrEqual(t, queued(), float64(budget))
		time.Sleep(10 * time.Millisecond)
	}

	require.Equal(t, stored, historyUntilEOSE(t, c), "a bounded queue still delivers the whole history")
	require.Eventually(t, func() bool { return queued() == 0 }, 30*time.Second, 5*time.Millisecond)
}

// storeLargeEvents stores n kind-1 events of about 60 KB each by key, one
// second apart, straight into r's database.
func storeLargeEvents(t *testing.T, r *relaytest.Relay, key *nostr.SecretKey, n int) {
	t.Helper()
	q := db.New(r.Pool)
	big := strings.Repeat("x", 60<<10)
	for i := range n {
		ev := relaytest.SignEvent(t, key, 1, fmt.Sprint(i, big), nil, int64(1_700_000_000+i))
		params, err := eventstore.InsertParams(r.CommunityID, ev, nil)
		require.NoError(t, err)
		_, err = q.EventInsert(context.Background(), params)
		require.NoError(t, err)
	}
}

// historyUntilEOSE reads c's EVENT replies up to the EOSE and counts them.
func historyUntilEOSE(t *testing.T, c *relaytest.Client) int {
	t.Helper()
	got := 0
	for {
		reply := c.NextReply()
		if reply.Verb != "EVENT" {
			require.Equal(t, "EOSE", reply.Verb, "%+v", reply)
			return got
		}
		got++
	}
}

// A subscriber that stops reading pins at most BUZZ_SEND_QUEUE_BYTES of
// live events (beyond what the socket buffers take) before it is closed as
// a slow consumer, whatever their count: the count bound alone (1,024)
// let one stalled connection hold 1,024 events of up to 256 KB each.
// Mutation killed: pushLive ignoring the byte bound (the stalled
// subscriber is never closed: 500 events are fewer than 1,024).
func TestStalledSubscriberPinsAtMostTheSendQueueBytes(t *testing.T) {
	// Not parallel: it pushes megabytes through loopback.
	r := relaytest.Start(t, func(c *config.Config) {
		c.SendQueueBytes = 1 << 20
		c.PublishPerMinute, c.PublishBurst = 100_000, 100_000
	})
	publisher := r.Dial(t, "")
	author := publisher.Auth(nil)
	stalled := r.Dial(t, "")
	stalled.Auth(nil)
	stalled.Send("REQ", "live", map[string]any{"authors": []string{author.PublicKeyHex()}, "limit": 0})
	stalled.Expect("EOSE")
	// From here the subscriber reads nothing: the socket buffers fill, then
	// its live queue.
	closed := func() float64 { return testutil.ToFloat64(r.Server.Metrics().SlowClosed) }
	big := strings.Repeat("x", 60<<10)
	for i := 0; i < 500 && closed() == 0; i++ { // 30 MB: far more than the socket buffers take
		require.True(t, publisher.Publish(publisher.Sign(1, fmt.Sprint(i, big), nil, 0)).OK)
	}
	require.Eventually(t, func() bool { return closed() == 1 }, 30*time.Second, 5*time.Millisecond,
		"a subscriber holding more than BUZZ_SEND_QUEUE_BYTES of live events is closed")
}
