package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/buzzrelay/buzz/internal/dbtest"
	"github.com/buzzrelay/buzz/internal/nostr"
	"github.com/buzzrelay/buzz/internal/relaytest"
)

// waitRedisConnected waits until the process reports in /ready that it is
// subscribed to the other processes' live traffic.
func (p *relayProcess) waitRedisConnected(t *testing.T) {
	t.Helper()
	require.Eventually(t, func() bool {
		resp, err := http.Get("http://" + p.addr + "/ready")
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return resp.StatusCode == http.StatusOK && strings.Contains(string(body), `"redis":"connected"`)
	}, 60*time.Second, 20*time.Millisecond, "relay process %s never subscribed to Redis", p.name)
}

// Three `buzz-relay serve` processes on one database and one redis-server,
// as three pods behind a load balancer: a subscriber on A and one on C get
// what is published on B, once each and in order; presence announced on C
// is seen by a later subscriber on A; a member removed through A stops
// receiving the private channel on B at once; one publisher's burst is
// spent across all three; B is SIGKILLed, and A and C keep serving each
// other with nothing stored lost.
// Mutations killed: serve not calling StartCrossRelay (BUZZ_REDIS_URL
// ignored: /ready never says connected, nothing crosses); presence kept in
// each process only (A's later subscriber sees nobody); serve building a
// process-local publish limiter when Redis is configured (the 31st event
// is accepted); no invalidation broadcast (B keeps delivering to the
// removed member from its cached reader set).
func TestThreeRelayProcessesServeAsOne(t *testing.T) {
	const publishBurst = 30
	t.Parallel()
	bin := buildRelay(t)
	databaseURL := dbtest.URL(t)
	redisURL := dbtest.RedisURL(t)
	procs := make([]*relayProcess, 3)
	for i, name := range []string{"a", "b", "c"} {
		procs[i] = startRelayProcess(t, bin, name, map[string]string{
			"BUZZ_DATABASE_URL": withAppName(t, databaseURL, name),
			"BUZZ_REDIS_URL":    redisURL,
			// Enough for the test's own publishers; the limit part spends
			// the whole burst of one key across the three processes.
			"BUZZ_PUBLISH_BURST":      fmt.Sprint(publishBurst),
			"BUZZ_PUBLISH_PER_MINUTE": "1",
		})
	}
	for _, p := range procs {
		p.waitRedisConnected(t)
	}
	a, b, c := procs[0], procs[1], procs[2]

	publisher := b.client(t, nil)
	author := publisher.Key.PublicKeyHex()
	filter := map[string]any{"authors": []string{author}, "limit": 0}
	onA, onC := a.client(t, nil), c.client(t, nil)
	for _, sub := range []*relaytest.Client{onA, onC} {
		sub.Send("REQ", "live", filter)
		sub.Expect("EOSE")
	}
	const n = 20
	var want []string
	for i := range n {
		ev := publisher.Sign(1, fmt.Sprintf("note %d", i), nil, 0)
		require.True(t, publisher.Publish(ev).OK)
		want = append(want, ev.ID)
	}
	for name, sub := range map[string]*relaytest.Client{"A": onA, "C": onC} {
		var got []string
		for range want {
			got = append(got, sub.Expect("EVENT").Event.ID)
		}
		require.Equal(t, want, got, "subscriber on %s: each event of B once, in order", name)
	}

	// Presence announced on C is seen by a later subscriber on A.
	present := c.client(t, nil)
	channel := uuid.NewString()
	require.True(t, present.Publish(present.Sign(9007, "", nostr.Tags{{"h", channel}, {"name", "presence"}, {"visibility", "private"}}, 0)).OK)
	reader := a.client(t, nil)
	require.True(t, present.Publish(present.Sign(9000, "", nostr.Tags{{"h", channel}, {"p", reader.Key.PublicKeyHex()}}, 0)).OK)
	here := present.Sign(20001, "online", nostr.Tags{{"h", channel}}, 0)
	require.True(t, present.Publish(here).OK)
	got := reader.Req("present", map[string]any{"kinds": []int{20001}, "#h": []string{channel}})
	// The subscription is live before the presence store is read, so C's
	// broadcast, if it reaches A in between, may bring the same event a
	// second time before EOSE: clients tell events apart by id.
	seen := map[string]bool{}
	for _, ev := range got {
		seen[ev.ID] = true
	}
	require.Equal(t, map[string]bool{here.ID: true}, seen, "presence set on C is seen on A")

	// A member removed through A stops receiving the channel on B: B has
	// delivered to them from a cached reader set before the removal.
	owner := a.client(t, present.Key)
	leaving, staying := b.client(t, nil), b.client(t, reader.Key)
	require.True(t, owner.Publish(owner.Sign(9000, "", nostr.Tags{{"h", channel}, {"p", leaving.Key.PublicKeyHex()}}, 0)).OK)
	for _, m := range []*relaytest.Client{leaving, staying} {
		m.Send("REQ", "channel", map[string]any{"kinds": []int{9}, "#h": []string{channel}, "limit": 0})
		m.Expect("EOSE")
	}
	before := owner.Sign(9, "before", nostr.Tags{{"h", channel}}, 0)
	require.True(t, owner.Publish(before).OK)
	require.Equal(t, before.ID, leaving.Expect("EVENT").Event.ID)
	require.Equal(t, before.ID, staying.Expect("EVENT").Event.ID)
	require.True(t, owner.Publish(owner.Sign(9001, "", nostr.Tags{{"h", channel}, {"p", leaving.Key.PublicKeyHex()}}, 0)).OK)
	after := owner.Sign(9, "after", nostr.Tags{{"h", channel}}, 0)
	require.True(t, owner.Publish(after).OK)
	require.Equal(t, after.ID, staying.Expect("EVENT").Event.ID, "a member on B still receives the channel")
	leaving.ExpectSilence(300*time.Millisecond, "a member removed through A must not receive the channel on B")

	// One key's burst is shared: spent a third on each process, the next
	// event is refused wherever it arrives.
	spender := []*relaytest.Client{a.client(t, nil)}
	spender = append(spender, b.client(t, spender[0].Key), c.client(t, spender[0].Key))
	for i := range publishBurst {
		on := spender[i%3]
		require.True(t, on.Publish(on.Sign(1, fmt.Sprintf("spend %d", i), nil, 0)).OK, "event %d of the burst", i)
	}
	for name, on := range map[string]*relaytest.Client{"A": spender[0], "B": spender[1], "C": spender[2]} {
		over := on.Publish(on.Sign(1, "over the limit", nil, 0))
		require.False(t, over.OK, "relay %s accepted an event over the shared burst", name)
		require.True(t, strings.HasPrefix(over.Msg, "rate-limited: "), over.Msg)
	}

	b.kill()
	fromC := c.client(t, publisher.Key)
	last := fromC.Sign(1, "after B died", nil, 0)
	require.True(t, fromC.Publish(last).OK)
	require.Equal(t, last.ID, onA.Expect("EVENT").Event.ID, "A and C keep serving each other")
	require.Equal(t, last.ID, onC.Expect("EVENT").Event.ID)
	stored := a.client(t, nil).Req("history", map[string]any{"authors": []string{author}})
	require.Len(t, stored, n+1, "nothing B stored is lost")
	onA.ExpectSilence(300*time.Millisecond, "no duplicate arrives on A")
}

// SIGTERM while a connection's write waits on a lock: the write commits
// while the process closes its connections, and its event still reaches
// the other process's subscriber, because the process says goodbye (which
// tells the others that everything before it was published) only once its
// connections and workers are done. Before, the bus stopped with the
// signal: its goodbye went out first, and the event committed after it
// was stored but never reached another process live.
// Mutation killed: serve starting the bus on the signal's context (the
// goodbye goes out at the signal; A never gets the event).
func TestStoppedRelayProcessPublishesWhatItCommitsWhileClosing(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	bin := buildRelay(t)
	databaseURL := dbtest.URL(t)
	redisURL := dbtest.RedisServer(t).URL()
	pool := observerPool(t, databaseURL)
	a := startRelayProcess(t, bin, "a", map[string]string{
		"BUZZ_DATABASE_URL": withAppName(t, databaseURL, "a"), "BUZZ_REDIS_URL": redisURL,
	})
	b := startRelayProcess(t, bin, "b", map[string]string{
		"BUZZ_DATABASE_URL": withAppName(t, databaseURL, "b"), "BUZZ_REDIS_URL": redisURL,
	})
	a.waitRedisConnected(t)
	b.waitRedisConnected(t)

	publisher := b.client(t, nil)
	onA := a.client(t, nil)
	onA.Send("REQ", "live", map[string]any{"authors": []string{publisher.Key.PublicKeyHex()}, "limit": 0})
	onA.Expect("EOSE")
	heard := publisher.Sign(1, "before the stop", nil, 0)
	require.True(t, publisher.Publish(heard).OK)
	require.Equal(t, heard.ID, onA.Expect("EVENT").Event.ID)

	// The next write waits on the test's lock until B is closing.
	lock, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = lock.Rollback(ctx) }()
	_, err = lock.Exec(ctx, "LOCK TABLE events IN EXCLUSIVE MODE")
	require.NoError(t, err)
	closing := publisher.Sign(1, "committed while B closes", nil, 0)
	publisher.Send("EVENT", closing)
	require.Eventually(t, func() bool {
		var waiting int
		require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND application_name = 'b' AND wait_event_type = 'Lock'`).Scan(&waiting))
		return waiting > 0
	}, time.Minute, 10*time.Millisecond, "B's write never waited on the lock")
	require.NoError(t, b.cmd.Process.Signal(syscall.SIGTERM))
	require.Eventually(t, func() bool { return strings.Contains(b.logs.String(), "shutting down") },
		time.Minute, 10*time.Millisecond)
	// Time for a goodbye sent at the signal to reach A (none is, now).
	time.Sleep(300 * time.Millisecond)
	require.NoError(t, lock.Rollback(ctx))

	require.Equal(t, closing.ID, onA.Expect("EVENT").Event.ID, "the event B committed while closing reaches A")
	select {
	case <-b.exited:
	case <-time.After(time.Minute):
		t.Fatal("B did not stop within a minute of SIGTERM")
	}
	onA.ExpectSilence(300*time.Millisecond, "nothing arrives twice on A")
}
