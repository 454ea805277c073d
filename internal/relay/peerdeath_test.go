package relay_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/buzzrelay/buzz/internal/dbtest"
	"github.com/buzzrelay/buzz/internal/relaytest"
)

// Each test here runs its own redis-server: the relays of every test on a
// shared one hear each other announce themselves, and one killed here
// would count as a death in all of them.

// waitMetric waits until r's metric reads want.
func waitMetric(t *testing.T, r *relaytest.Relay, name, want string) {
	t.Helper()
	require.Eventually(t, func() bool { return metric(t, r, name) == want }, 30*time.Second, 20*time.Millisecond,
		"relay %s: %s never read %s (last: %q)", r.HTTPURL, name, want, metric(t, r, name))
}

// A relay process killed between committing an event and publishing it
// on Redis goes silent; the other process notices within a few seconds and
// replays from the database what it committed since its last sign of
// life, so its subscriber gets the event live, once.
// Mutation killed: no replay for a silent peer (A's subscriber never gets
// the event).
func TestCrossRelayReplaysWhatAKilledPeerCommitted(t *testing.T) {
	t.Parallel()
	redis := dbtest.RedisServer(t)
	relays := relaysOnRedis(t, redis.URL(), 2)
	a, b := relays[0], relays[1]
	waitMetric(t, a, "buzz_redis_peers", "1")

	onA, publisher := watchedAcross(t, a, b)

	// From here B publishes nothing, not even a goodbye: killed after its
	// commit, before its publish.
	b.Server.KillCrossRelay()
	killed := time.Now()
	lost := publisher.Sign(1, "committed, never published", nil, 0)
	require.True(t, publisher.Publish(lost).OK)

	require.Equal(t, lost.ID, onA.Expect("EVENT").Event.ID, "A replays what the dead B committed")
	t.Logf("the event reached A %s after B went silent", time.Since(killed).Round(time.Millisecond))
	waitMetric(t, a, `buzz_redis_gaps_total{outcome="peer_replayed"}`, "1")
	require.Equal(t, "1", metric(t, a, "buzz_redis_peer_deaths_total"))
	require.Equal(t, "1", metric(t, a, "buzz_redis_replayed_total"), "the event heard live is not replayed")
	require.Equal(t, "0", metric(t, a, "buzz_redis_peers"))
	onA.ExpectSilence(300*time.Millisecond, "nothing arrives twice on A")
}

// A process that stops cleanly says goodbye: the others forget it and
// replay nothing for it. Another process killed after it is counted, once:
// its silence is noticed after the first one's would have been.
// Mutation killed: no goodbye (A counts two deaths).
func TestCrossRelayCleanShutdownIsNoDeath(t *testing.T) {
	t.Parallel()
	redis := dbtest.RedisServer(t)
	relays := relaysOnRedis(t, redis.URL(), 3)
	a, b, c := relays[0], relays[1], relays[2]
	waitMetric(t, a, "buzz_redis_peers", "2")

	b.StopCrossRelay()
	c.Server.KillCrossRelay()
	waitMetric(t, a, `buzz_redis_gaps_total{outcome="peer_replayed"}`, "1")
	require.Equal(t, "1", metric(t, a, "buzz_redis_peer_deaths_total"), "only the killed process died")
	require.Equal(t, "0", metric(t, a, "buzz_redis_peers"))
}

// A process's own Redis outage silences every peer at once: that is the
// subscription's gap, caught up when it resubscribes, not the peers'
// deaths. A peer killed after the outage is counted once.
// Mutation killed: the peers' last signs of life kept across the
// resubscription (A counts B and C dead as it resubscribes).
func TestCrossRelayOutageIsNoPeerDeath(t *testing.T) {
	t.Parallel()
	redis := dbtest.RedisServer(t)
	relays := relaysOnRedis(t, redis.URL(), 3)
	a, b, c := relays[0], relays[1], relays[2]
	waitMetric(t, a, "buzz_redis_peers", "2")

	redis.Kill()
	waitRedis(t, "degraded", a, b, c)
	// Longer than a peer may stay silent (3 s), so that the peers' silence
	// would count if the outage did not reset it.
	time.Sleep(4 * time.Second)
	require.NoError(t, redis.Restart(t.Context()))
	waitRedis(t, "connected", a, b, c)
	waitMetric(t, a, "buzz_redis_peers", "2")

	c.Server.KillCrossRelay()
	waitMetric(t, a, `buzz_redis_gaps_total{outcome="peer_replayed"}`, "1")
	require.Equal(t, "1", metric(t, a, "buzz_redis_peer_deaths_total"), "only the killed process died")
	require.Equal(t, "1", metric(t, a, "buzz_redis_peers"), "B is heard again")
}

// A process whose publish of one batch fails (a Redis error) goes on
// announcing itself, so it is never taken for dead; its next announcement
// says since when its events were not published, and the other process
// replays them from the database, once, in order with what it hears live.
// Mutation killed: announcing without the time of the unpublished events
// (A's subscriber never gets the event).
func TestCrossRelayReplaysWhatAPeerFailedToPublish(t *testing.T) {
	t.Parallel()
	redis := dbtest.RedisServer(t)
	relays := relaysOnRedis(t, redis.URL(), 2)
	a, b := relays[0], relays[1]
	waitMetric(t, a, "buzz_redis_peers", "1")

	onA, publisher := watchedAcross(t, a, b)

	b.Server.FailNextCrossRelayPublish()
	lost := publisher.Sign(1, "committed, its publish failed", nil, 0)
	require.True(t, publisher.Publish(lost).OK)
	failed := time.Now()
	require.Equal(t, lost.ID, onA.Expect("EVENT").Event.ID, "A replays what B could not publish")
	t.Logf("the event reached A %s after its publish failed", time.Since(failed).Round(time.Millisecond))
	waitMetric(t, a, `buzz_redis_gaps_total{outcome="unpublished_replayed"}`, "1")
	require.Equal(t, "1", metric(t, b, `buzz_redis_publish_dropped_total{reason="redis_error"}`))
	require.Equal(t, "1", metric(t, a, "buzz_redis_replayed_total"), "the event heard live is not replayed")
	require.Equal(t, "0", metric(t, a, "buzz_redis_peer_deaths_total"), "B kept announcing itself")
	require.Equal(t, "1", metric(t, a, "buzz_redis_peers"))

	after := publisher.Sign(1, "published again", nil, 0)
	require.True(t, publisher.Publish(after).OK)
	require.Equal(t, after.ID, onA.Expect("EVENT").Event.ID)
	onA.ExpectSilence(300*time.Millisecond, "nothing arrives twice on A")
}

// watchedAcross connects a subscriber on a to the live events of a
// publisher connected to b (in a's community), and sees one event B
// publishes reach it, as it does while B is well.
func watchedAcross(t *testing.T, a, b *relaytest.Relay) (onA, publisher *relaytest.Client) {
	t.Helper()
	onA = a.Dial(t, a.Host)
	onA.Auth(nil)
	publisher = b.Dial(t, a.Host)
	author := publisher.Auth(nil)
	onA.Send("REQ", "live", map[string]any{"authors": []string{author.PublicKeyHex()}, "limit": 0})
	onA.Expect("EOSE")
	heard := publisher.Sign(1, "published while B is well", nil, 0)
	require.True(t, publisher.Publish(heard).OK)
	require.Equal(t, heard.ID, onA.Expect("EVENT").Event.ID)
	return onA, publisher
}
