package main

import (
	"context"
	"encoding/hex"
	"fmt"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/buzzrelay/buzz/internal/dbtest"
	"github.com/buzzrelay/buzz/internal/nostr"
	"github.com/buzzrelay/buzz/internal/relaytest"
)

// One event sent to two relay processes at the same instant (a client
// retrying through another pod of the load balancer, or publishing to
// both): it is stored once, both publishers get OK true, exactly one of
// them a duplicate, and a live subscriber on either process receives it
// once, not once from its own commit and again through Redis (the fan-out
// also remembers the ids it delivered, so a process that fanned out a
// duplicate too would still deliver it once).
func TestOneEventSentToTwoRelayProcessesAtOnceIsStoredAndDeliveredOnce(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	bin := buildRelay(t)
	databaseURL := dbtest.URL(t)
	redisURL := dbtest.RedisURL(t)
	pool := observerPool(t, databaseURL)
	env := func(name string) map[string]string {
		return map[string]string{
			"BUZZ_DATABASE_URL": withAppName(t, databaseURL, name), "BUZZ_REDIS_URL": redisURL,
			"BUZZ_PUBLISH_BURST": "1000", "BUZZ_PUBLISH_PER_MINUTE": "1000", "BUZZ_MESSAGES_PER_SECOND": "100000",
		}
	}
	a, b := startRelayProcess(t, bin, "a", env("a")), startRelayProcess(t, bin, "b", env("b"))
	a.waitRedisConnected(t)
	b.waitRedisConnected(t)

	toA := a.client(t, nil)
	toB := b.client(t, toA.Key)
	filter := map[string]any{"authors": []string{toA.Key.PublicKeyHex()}, "limit": 0}
	onA, onB := a.client(t, nil), b.client(t, nil)
	for _, sub := range []*relaytest.Client{onA, onB} {
		sub.Send("REQ", "live", filter)
		sub.Expect("EOSE")
	}
	const n = 40
	var want []string
	storedBy := map[string]int{}
	for i := range n {
		ev := toA.Sign(1, fmt.Sprintf("twice %d", i), nil, 0)
		want = append(want, ev.ID)
		// Both frames leave before either answer is read: the two
		// processes race to insert the same row.
		toA.Send("EVENT", ev)
		toB.Send("EVENT", ev)
		stored := 0
		for name, c := range map[string]*relaytest.Client{"a": toA, "b": toB} {
			r := c.Expect("OK")
			require.Equal(t, ev.ID, r.ID)
			require.True(t, r.OK, "event %d on %s: %s", i, name, r.Msg)
			if !strings.HasPrefix(r.Msg, "duplicate:") {
				stored++
				storedBy[name]++
			}
		}
		require.Equal(t, 1, stored, "event %d: exactly one process stores it, the other answers duplicate", i)
	}
	t.Logf("stored by a: %d, by b: %d", storedBy["a"], storedBy["b"])

	for name, sub := range map[string]*relaytest.Client{"A": onA, "B": onB} {
		got := map[string]int{}
		for range want {
			got[sub.Expect("EVENT").Event.ID]++
		}
		for _, id := range want {
			require.Equal(t, 1, got[id], "subscriber on %s: event %s", name, id)
		}
	}
	ids := make([][]byte, len(want))
	for i, id := range want {
		ids[i], _ = hex.DecodeString(id)
	}
	var rows int
	require.NoError(t, pool.QueryRow(ctx, "SELECT count(*) FROM events WHERE id = ANY($1)", ids).Scan(&rows))
	require.Equal(t, n, rows)
	onA.ExpectSilence(500*time.Millisecond, "no event arrives twice on A")
	onB.ExpectSilence(500*time.Millisecond, "no event arrives twice on B")
}

// B is SIGKILLed while several publishers stream events through it: some
// answered OK, some committed but unanswered, some not stored. A's live
// subscriber receives every event B stored (answered or not), once each,
// live or, for one committed and not yet published, through the dead-peer
// replay (3 s of silence, then a replay from B's last announcement), and
// nothing B did not store. Where the kill lands is chance: in most runs
// every event has crossed live before it (TestCrossRelayReplaysWhatAKilledPeerCommitted
// holds the replay itself to its promise).
func TestKilledRelayProcessStreamReachesTheOtherProcessOnce(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	bin := buildRelay(t)
	databaseURL := dbtest.URL(t)
	redisURL := dbtest.RedisServer(t).URL()
	pool := observerPool(t, databaseURL)
	env := func(name string) map[string]string {
		return map[string]string{
			"BUZZ_DATABASE_URL": withAppName(t, databaseURL, name), "BUZZ_REDIS_URL": redisURL,
			"BUZZ_PUBLISH_BURST": "100000", "BUZZ_PUBLISH_PER_MINUTE": "100000", "BUZZ_MESSAGES_PER_SECOND": "100000",
		}
	}
	a, b := startRelayProcess(t, bin, "a", env("a")), startRelayProcess(t, bin, "b", env("b"))
	a.waitRedisConnected(t)
	b.waitRedisConnected(t)

	const publishers = 8
	keys := make([]*nostr.SecretKey, publishers)
	authors := make([]string, publishers)
	for i := range keys {
		keys[i] = relaytest.NewKey(t)
		authors[i] = keys[i].PublicKeyHex()
	}
	onA := a.client(t, nil)
	onA.Send("REQ", "live", map[string]any{"authors": authors, "limit": 0})
	onA.Expect("EOSE")
	clients := make([]*relaytest.Client, publishers)
	for i := range clients {
		clients[i] = b.client(t, keys[i])
	}

	var mu sync.Mutex
	var all []*sentEvent
	var wg sync.WaitGroup
	for i, c := range clients {
		wg.Go(func() {
			sent := publishUntilDead(c, func(n int) *nostr.Event {
				ev := &nostr.Event{Kind: 1, CreatedAt: time.Now().Unix(), Tags: nostr.Tags{}, Content: fmt.Sprintf("stream %d/%d", i, n)}
				if err := ev.Sign(keys[i]); err != nil {
					panic(err)
				}
				return ev
			})
			mu.Lock()
			all = append(all, sent...)
			mu.Unlock()
		})
	}
	time.Sleep(700 * time.Millisecond)
	b.kill()
	killed := time.Now()
	wg.Wait()
	require.Eventually(t, func() bool {
		var n int
		err := pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND application_name = 'b'`).Scan(&n)
		return err == nil && n == 0
	}, 30*time.Second, 20*time.Millisecond, "the killed process's backends never ended")

	ids := make([][]byte, len(all))
	for i, s := range all {
		ids[i], _ = hex.DecodeString(s.ev.ID)
	}
	rows, err := pool.Query(ctx, "SELECT encode(id, 'hex') FROM events WHERE id = ANY($1)", ids)
	require.NoError(t, err)
	stored := map[string]bool{}
	for rows.Next() {
		var id string
		require.NoError(t, rows.Scan(&id))
		stored[id] = true
	}
	require.NoError(t, rows.Err())
	var acked, unansweredStored int
	for _, s := range all {
		if s.answered && s.ok {
			acked++
			require.True(t, stored[s.ev.ID], "event %s answered OK but not stored", s.ev.ID)
		}
		if !s.answered && stored[s.ev.ID] {
			unansweredStored++
		}
	}

	got := map[string]int{}
	var lastArrival time.Time
	for len(got) < len(stored) {
		msg, err := onA.TryNext(30 * time.Second)
		require.NoError(t, err, "A received %d of the %d events B stored", len(got), len(stored))
		r := relaytest.Reply{}
		if string(msg[0]) != `"EVENT"` {
			continue
		}
		r.Event = new(nostr.Event)
		require.NoError(t, r.Event.UnmarshalJSON(msg[2]))
		require.True(t, stored[r.Event.ID], "A received %s, which B never stored", r.Event.ID)
		got[r.Event.ID]++
		require.Equal(t, 1, got[r.Event.ID], "A received %s twice", r.Event.ID)
		lastArrival = time.Now()
	}
	t.Logf("%d sent, %d acknowledged, %d stored (%d of them unanswered); the last reached A %v after the kill",
		len(all), acked, len(stored), unansweredStored, lastArrival.Sub(killed).Round(time.Millisecond))
	onA.ExpectSilence(2*time.Second, "nothing arrives twice on A after the replay")
}

// A relay process that freezes (SIGSTOP here; a VM pause, a partitioned
// pod, where no FIN ever reaches PostgreSQL) in the middle of a channel
// change, holding the channel's write lock exclusive in an open
// transaction: PostgreSQL ends that session once it has sat idle in its
// transaction for the write timeout (the relay abandons such a
// transaction itself after that long, when it can run), so the other
// processes' writes into the channel go through again, and the frozen
// process, once it runs again, serves writes as before. Before, the
// session stayed open for as long as the process stayed frozen, and every
// message into the channel, on every process, was answered "error: ...
// try again" after waiting out the write timeout.
func TestFrozenRelayProcessDoesNotHoldAChannelLockForever(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	bin := buildRelay(t)
	databaseURL := dbtest.URL(t)
	pool := observerPool(t, databaseURL)
	env := func(name string) map[string]string {
		return map[string]string{
			"BUZZ_DATABASE_URL": withAppName(t, databaseURL, name),
			// Short, so that the test does not wait out the default 30 s.
			"BUZZ_INGEST_WRITE_TIMEOUT": "2s",
			// Every event in a transaction of its own: a group's short lock
			// timeout could end the change's wait while B is frozen, and
			// leave it holding the row only.
			"BUZZ_INGEST_GROUP_MAX": "1",
		}
	}
	a, b := startRelayProcess(t, bin, "a", env("a")), startRelayProcess(t, bin, "b", env("b"))
	onA := a.client(t, nil)
	channel := newChannel(t, onA, "frozen")
	onB := b.client(t, onA.Key)

	// B's metadata change takes the channel's row and then waits for its
	// write lock, which the test holds shared (as a message in flight does).
	row, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = row.Rollback(ctx) }()
	_, err = row.Exec(ctx, `SELECT pg_advisory_xact_lock_shared(channels_write_lock_key(community_id, id))
		FROM channels WHERE id = $1`, channel)
	require.NoError(t, err)
	change := onB.Sign(9002, "", nostr.Tags{{"h", channel}, {"name", "renamed"}}, 0)
	onB.Send("EVENT", change)
	backendsOfB := func(state string) int {
		var n int
		require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND application_name = 'b' AND state = $1
			  AND ($1 <> 'active' OR wait_event_type = 'Lock')`, state).Scan(&n))
		return n
	}
	require.Eventually(t, func() bool { return backendsOfB("active") > 0 },
		time.Minute, 10*time.Millisecond, "B's change never waited for the channel's write lock")
	require.NoError(t, b.cmd.Process.Signal(syscall.SIGSTOP))
	defer func() { _ = b.cmd.Process.Signal(syscall.SIGCONT) }()
	require.NoError(t, row.Rollback(ctx))
	// B's transaction now holds the lock and waits for a process that
	// does not run.
	require.Eventually(t, func() bool { return backendsOfB("idle in transaction") > 0 },
		time.Minute, 10*time.Millisecond, "B's transaction never went idle holding the lock")
	require.Eventually(t, func() bool { return backendsOfB("idle in transaction") == 0 },
		30*time.Second, 50*time.Millisecond, "PostgreSQL kept the frozen process's transaction, and the channel's write lock, open")

	posted := onA.Publish(onA.Sign(9, "after the freeze", nostr.Tags{{"h", channel}}, 0))
	require.True(t, posted.OK, "a message into the channel on A: %s", posted.Msg)

	require.NoError(t, b.cmd.Process.Signal(syscall.SIGCONT))
	// The frozen change lost its session: it is answered, not left hanging
	// (whether it committed is for its re-send to tell).
	r := onB.Expect("OK")
	var stored int
	require.NoError(t, pool.QueryRow(ctx, "SELECT count(*) FROM events WHERE id = decode($1, 'hex')", change.ID).Scan(&stored))
	t.Logf("B's change, thawed: ok=%v %q, stored %d", r.OK, r.Msg, stored)
	if r.OK {
		require.Equal(t, 1, stored, "B answered its change OK: it must be stored")
	}
	again := onB.Publish(onB.Sign(9, "B serves again", nostr.Tags{{"h", channel}}, 0))
	require.True(t, again.OK, "a message on B after it runs again: %s", again.Msg)
}
