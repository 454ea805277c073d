package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/buzzrelay/buzz/internal/dbtest"
	"github.com/buzzrelay/buzz/internal/pgcluster"
	"github.com/buzzrelay/buzz/internal/redisserver"
)

// lines returns the relay's JSON log lines with message msg, and counts
// the lines that are not JSON at all.
func (b *lockedBuffer) lines(msg string) (matching []map[string]any, notJSON int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	scan := bufio.NewScanner(bytes.NewReader(b.buf.Bytes()))
	for scan.Scan() {
		var line map[string]any
		if json.Unmarshal(scan.Bytes(), &line) != nil {
			notJSON++
			continue
		}
		if line["msg"] == msg {
			matching = append(matching, line)
		}
	}
	return matching, notJSON
}

// migratedCluster starts a private cluster of the test's own (which it may
// stop and start) and migrates a database on it with bin.
func migratedCluster(t *testing.T, bin string) (*pgcluster.Cluster, string) {
	t.Helper()
	ctx := context.Background()
	cluster, err := pgcluster.StartTemp(ctx, nil)
	require.NoError(t, err)
	t.Cleanup(func() { _ = cluster.Close() })
	admin, err := pgx.Connect(ctx, cluster.URL("postgres"))
	require.NoError(t, err)
	_, err = admin.Exec(ctx, "CREATE DATABASE buzz")
	require.NoError(t, err)
	require.NoError(t, admin.Close(ctx))
	databaseURL := cluster.URL("buzz")
	migrate := exec.Command(bin, "migrate")
	migrate.Env = []string{"PATH=" + os.Getenv("PATH"), "BUZZ_DATABASE_URL=" + databaseURL}
	out, err := migrate.CombinedOutput()
	require.NoError(t, err, "migrate: %s", out)
	return cluster, databaseURL
}

// While PostgreSQL is down, every publish, REQ and HTTP request fails the
// same way: the relay's log says so once, with the first failure's cause,
// and once more when the database answers again, with how many requests
// failed meanwhile; it does not write a line per request. The clients
// still get their answers: OK false and CLOSED with error:, HTTP 503.
// Mutation killed: the WebSocket and host-lookup failures logged one by
// one again (20 "ingest failed", 5 "read failed", 5 "resolve community"
// lines, and no line saying the database is back).
func TestRelayProcessLogsADatabaseOutageOnce(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	bin := buildRelay(t)
	cluster, databaseURL := migratedCluster(t, bin)
	p := startRelayProcess(t, bin, "outage", map[string]string{"BUZZ_DATABASE_URL": databaseURL})
	pub := p.client(t, nil)
	require.True(t, pub.Publish(pub.Sign(1, "before", nil, 0)).OK)

	require.NoError(t, cluster.Stop())
	const publishes, reads, requests = 20, 5, 5
	for i := range publishes {
		r := pub.Publish(pub.Sign(1, fmt.Sprintf("while down %d", i), nil, 0))
		require.False(t, r.OK)
		require.Equal(t, "error: could not store the event; try again", r.Msg)
	}
	for i := range reads {
		pub.Send("REQ", fmt.Sprintf("down%d", i), map[string]any{"kinds": []int{1}})
		require.Equal(t, "error: query failed", pub.Expect("CLOSED").Msg)
	}
	for range requests {
		req, err := http.NewRequest(http.MethodGet, "http://"+p.addr+"/", nil)
		require.NoError(t, err)
		req.Host = processHost
		req.Header.Set("Accept", "application/nostr+json")
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		var body map[string]string
		require.NoError(t, json.NewDecoder(resp.Body).Decode(&body))
		resp.Body.Close()
		require.Equal(t, http.StatusServiceUnavailable, resp.StatusCode)
		require.Equal(t, "error: database unavailable; try again", body["error"])
	}

	for _, msg := range []string{"ingest failed", "read failed", "resolve community", "channel lists: fold failed"} {
		one, _ := p.logs.lines(msg)
		require.Zero(t, len(one), "%q logged per request during the outage", msg)
	}
	down, _ := p.logs.lines("database unreachable: requests fail until it answers again; not logged one by one")
	require.Len(t, down, 1, "the outage is logged once")

	restarted, err := pgcluster.Start(ctx, pgcluster.Options{DataDir: cluster.DataDir(), Port: cluster.Port()})
	require.NoError(t, err)
	require.False(t, restarted.Adopted())
	require.Eventually(t, func() bool {
		return pub.Publish(pub.Sign(1, "after", nil, 0)).OK
	}, 30*time.Second, 100*time.Millisecond, "the relay never wrote again after PostgreSQL came back")
	var back []map[string]any
	require.Eventually(t, func() bool {
		back, _ = p.logs.lines("database reachable again")
		return len(back) == 1
	}, 30*time.Second, 50*time.Millisecond, "the end of the outage is logged once")
	require.GreaterOrEqual(t, back[0]["failed_requests"], float64(publishes+reads+requests), "%v", back[0])
	down, _ = p.logs.lines("database unreachable: requests fail until it answers again; not logged one by one")
	require.Len(t, down, 1)
}

// While Redis is down the Redis client library retries its dials and, left
// to itself, writes a plain-text line to stderr for each failed one
// (several a second), outside the JSON log; the relay already says once
// that it lost Redis and once that it is back. Every line the process
// writes through a Redis outage is JSON.
// Mutation killed: the library's own logger left in place (its "failed to
// dial after 5 attempts" lines, one per attempt, break the JSON log).
func TestRelayProcessLogThroughARedisOutageIsJSON(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	bin := buildRelay(t)
	databaseURL := dbtest.URL(t)
	redis, err := redisserver.Start(ctx)
	require.NoError(t, err)
	t.Cleanup(redis.Close)
	p := startRelayProcess(t, bin, "redis-outage", map[string]string{
		"BUZZ_DATABASE_URL": withAppName(t, databaseURL, "redis-outage"),
		"BUZZ_REDIS_URL":    redis.URL(),
	})
	p.waitRedisConnected(t)

	redis.Kill()
	require.Eventually(t, func() bool {
		lost, _ := p.logs.lines("redis: lost the other relays' live traffic; serving local subscribers only, resubscribing")
		return len(lost) == 1
	}, 30*time.Second, 20*time.Millisecond, "the relay never noticed Redis was gone")
	// Publishes meanwhile: each asks the shared rate limiter, and is
	// published to the others, through Redis; each of those dials fails.
	pub := p.client(t, nil)
	for i := range 30 {
		r := pub.Publish(pub.Sign(1, fmt.Sprintf("while Redis is down %d", i), nil, 0))
		require.True(t, r.OK, r.Msg)
	}
	require.NoError(t, redis.Restart(ctx))
	p.waitRedisConnected(t)

	_, notJSON := p.logs.lines("")
	require.Zero(t, notJSON, "lines outside the JSON log:\n%s", p.logs.String())
	lost, _ := p.logs.lines("redis: lost the other relays' live traffic; serving local subscribers only, resubscribing")
	require.Len(t, lost, 1, "the loss is logged once")
}
