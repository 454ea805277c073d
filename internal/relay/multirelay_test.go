package relay_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/uuid"
	goredis "github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/buzzrelay/buzz/internal/config"
	"github.com/buzzrelay/buzz/internal/db"
	"github.com/buzzrelay/buzz/internal/dbtest"
	"github.com/buzzrelay/buzz/internal/eventstore"
	"github.com/buzzrelay/buzz/internal/nostr"
	"github.com/buzzrelay/buzz/internal/redisserver"
	"github.com/buzzrelay/buzz/internal/relaytest"
)

// Several relays on one database and one Redis, as several pods behind a
// load balancer would be. Every relaytest relay creates a community of its
// own host; the clients below all speak to the first relay's community,
// whichever relay they are connected to. Communities are fresh per test,
// and every Redis channel is under buzz:<community id>:, so tests sharing
// the run's redis-server do not see each other's traffic.

func withRedis(url string) func(*config.Config) {
	return func(c *config.Config) { c.RedisURL = url }
}

// readyRedis returns the redis field of the relay's /ready answer, which
// must be 200 whatever Redis does.
func readyRedis(t testing.TB, r *relaytest.Relay) string {
	t.Helper()
	return readyField(t, r, "redis")
}

// readyField returns one field of the relay's /ready answer, which must be
// 200 whatever an optional dependency (Redis, media) does.
func readyField(t testing.TB, r *relaytest.Relay, field string) string {
	t.Helper()
	resp, err := http.Get(r.HTTPURL + "/ready")
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode, "a relay without Redis or media still serves: it stays ready")
	var body map[string]string
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&body))
	return body[field]
}

// waitRedis waits (generously: the machine may be loaded) until every relay
// reports want in /ready.
func waitRedis(t testing.TB, want string, relays ...*relaytest.Relay) {
	t.Helper()
	for _, r := range relays {
		require.Eventually(t, func() bool { return readyRedis(t, r) == want }, 30*time.Second, 20*time.Millisecond,
			"relay %s never reported redis %q in /ready", r.HTTPURL, want)
	}
}

// holdRedisWrites holds back every write command redis receives (so
// PUBLISH: no invalidation or event crosses between relays) until the test
// ends, while reads go on (the relays' health pings: they go on trusting
// their caches). The pause outlasts any test; the cleanup lifts it, on a
// context of its own (the test's is cancelled by then).
func holdRedisWrites(t *testing.T, redis *redisserver.Server) {
	t.Helper()
	rc := goredis.NewClient(&goredis.Options{Addr: redis.Addr()})
	t.Cleanup(func() { _ = rc.Close() })
	require.NoError(t, rc.Do(t.Context(), "CLIENT", "PAUSE", "600000", "WRITE").Err())
	t.Cleanup(func() { _ = rc.Do(context.Background(), "CLIENT", "UNPAUSE").Err() })
}

// relaysOnRedis starts n relays on one fresh database, joined through the
// Redis at url, and waits until each has subscribed.
func relaysOnRedis(t *testing.T, url string, n int) []*relaytest.Relay {
	t.Helper()
	pool := dbtest.Pool(t)
	relays := make([]*relaytest.Relay, n)
	for i := range relays {
		relays[i] = relaytest.StartOn(t, pool, withRedis(url))
	}
	waitRedis(t, "connected", relays...)
	return relays
}

// waitPublished waits until the relay has published, or given up on,
// everything it queued for Redis.
func waitPublished(t *testing.T, r *relaytest.Relay) {
	t.Helper()
	require.Eventually(t, func() bool { return metric(t, r, "buzz_redis_publish_pending") == "0" },
		30*time.Second, 20*time.Millisecond, "relay %s never finished publishing", r.HTTPURL)
}

func metric(t testing.TB, r *relaytest.Relay, name string) string {
	t.Helper()
	for _, line := range metricLines(t, r) {
		if value, ok := strings.CutPrefix(line, name+" "); ok {
			return value
		}
	}
	return ""
}

// metricLines is r's /metrics page, one line each.
func metricLines(t testing.TB, r *relaytest.Relay) []string {
	t.Helper()
	resp, err := http.Get(r.MetricsURL + "/metrics")
	require.NoError(t, err)
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return strings.Split(string(body), "\n")
}

// A subscriber on A receives what is published on B exactly once and in
// the publisher's order; a subscriber on B (the publisher's own relay) gets
// each event once too, not a second time back from Redis; an ephemeral event
// crosses as well.
// Mutations killed: not publishing to Redis after commit (A gets nothing);
// dropping the origin check (B's subscriber gets every event twice);
// delivering remote events without the hub's read path is caught by the
// private-channel test below.
func TestCrossRelayDeliveryOnceAndInOrder(t *testing.T) {
	t.Parallel()
	url := dbtest.RedisURL(t)
	relays := relaysOnRedis(t, url, 2)
	a, b := relays[0], relays[1]

	onA := a.Dial(t, a.Host)
	onA.Auth(nil)
	onB := b.Dial(t, a.Host)
	onB.Auth(nil)
	publisher := b.Dial(t, a.Host)
	author := publisher.Auth(nil)
	filter := map[string]any{"authors": []string{author.PublicKeyHex()}, "limit": 0}
	for _, c := range []*relaytest.Client{onA, onB} {
		c.Send("REQ", "live", filter)
		c.Expect("EOSE")
	}

	const n = 50
	var want []string
	for i := range n {
		ev := publisher.Sign(1, fmt.Sprintf("note %d", i), nil, 0)
		require.True(t, publisher.Publish(ev).OK)
		want = append(want, ev.ID)
	}
	typing := publisher.Sign(20002, "typing", nil, 0)
	require.True(t, publisher.Publish(typing).OK)
	want = append(want, typing.ID)

	for name, c := range map[string]*relaytest.Client{"subscriber on A": onA, "subscriber on B": onB} {
		var got []string
		for range want {
			got = append(got, c.Expect("EVENT").Event.ID)
		}
		require.Equal(t, want, got, "%s: every event once, in the publisher's order", name)
	}
	onA.ExpectSilence(300*time.Millisecond, "no duplicate arrives on A")
	onB.ExpectSilence(300*time.Millisecond, "no echo from Redis arrives on B")
}

// One signed event sent to two communities (as a client sends its profile,
// or a note, to each community it belongs to) is stored in each, and each
// community's subscribers get it live, on every relay: that the first
// community's copy was published, here or heard from Redis, does not stand
// for the second's.
// Mutation killed: the hub remembering published ids without their
// community (neither relay's subscriber in the second community gets it).
func TestCrossRelayDeliversOneEventSentToTwoCommunitiesInEach(t *testing.T) {
	t.Parallel()
	url := dbtest.RedisURL(t)
	relays := relaysOnRedis(t, url, 2)
	a, b := relays[0], relays[1]

	inFirst := b.Dial(t, a.Host)
	key := inFirst.Auth(nil)
	inSecond := b.Dial(t, b.Host)
	inSecond.Auth(key)
	filter := map[string]any{"authors": []string{key.PublicKeyHex()}, "limit": 0}
	subscribers := map[string]*relaytest.Client{}
	for name, relay := range map[string]*relaytest.Relay{"on A": a, "on B": b} {
		c := relay.Dial(t, b.Host)
		c.Auth(nil)
		c.Send("REQ", "live", filter)
		c.Expect("EOSE")
		subscribers["second community's subscriber "+name] = c
	}

	ev := inFirst.Sign(1, "to every community I belong to", nil, 0)
	require.True(t, inFirst.Publish(ev).OK)
	require.True(t, inSecond.Publish(ev).OK, "a second community stores its own copy")
	for name, c := range subscribers {
		require.Equal(t, ev.ID, c.Expect("EVENT").Event.ID, "%s gets the second community's copy", name)
	}
	for name, c := range subscribers {
		c.ExpectSilence(300*time.Millisecond, name+": once")
	}
}

// A member removed through relay A stops receiving the private channel's
// live events on relay B as soon as B has heard of anything A committed
// after the removal: the invalidation travels ahead of A's later events.
// Mutations killed: not broadcasting the invalidation (B trusts its cached
// reader set for its whole TTL and delivers to the removed member);
// handing a remote event to the hub without its channel (the outsider's
// unpinned subscription receives the private channel).
func TestCrossRelayRemovalStopsLiveDeliveryOnOtherRelay(t *testing.T) {
	t.Parallel()
	url := dbtest.RedisURL(t)
	relays := relaysOnRedis(t, url, 2)
	a, b := relays[0], relays[1]

	owner := a.Dial(t, a.Host)
	owner.Auth(nil)
	ch := createChannel(t, owner, "secret", true)
	leaving := b.Dial(t, a.Host)
	leaving.Auth(nil)
	staying := b.Dial(t, a.Host)
	staying.Auth(nil)
	for _, m := range []*relaytest.Client{leaving, staying} {
		require.True(t, owner.Publish(owner.Sign(9000, "", nostr.Tags{{"h", ch}, {"p", m.Key.PublicKeyHex()}}, 0)).OK)
		m.Send("REQ", "channel", map[string]any{"kinds": []int{9}, "#h": []string{ch}, "limit": 0})
		m.Expect("EOSE")
	}
	// An outsider's unpinned subscription never receives channel events,
	// from this relay or another.
	outsider := b.Dial(t, a.Host)
	outsider.Auth(nil)
	outsider.Send("REQ", "everything", map[string]any{"kinds": []int{9}, "limit": 0})
	outsider.Expect("EOSE")
	staying.Send("REQ", "owner-notes", map[string]any{"kinds": []int{1}, "authors": []string{owner.Key.PublicKeyHex()}, "limit": 0})
	staying.Expect("EOSE")

	// B delivers a channel message to both members: its reader set for the
	// channel is now cached.
	postOnB(t, staying, leaving, ch, "before")

	// A removes the member, then publishes a public note; once B has
	// delivered the note, B has processed everything A sent before it.
	require.True(t, owner.Publish(owner.Sign(9001, "", nostr.Tags{{"h", ch}, {"p", leaving.Key.PublicKeyHex()}}, 0)).OK)
	marker := owner.Sign(1, "after the removal", nil, 0)
	require.True(t, owner.Publish(marker).OK)
	require.Equal(t, marker.ID, staying.Expect("EVENT").Event.ID)

	after := staying.Sign(9, "after", nostr.Tags{{"h", ch}}, 0)
	staying.Send("EVENT", after)
	require.Equal(t, after.ID, staying.Expect("EVENT").Event.ID, "a member still receives the channel")
	require.True(t, staying.Expect("OK").OK)
	fromA := owner.Sign(9, "after, from A", nostr.Tags{{"h", ch}}, 0)
	require.True(t, owner.Publish(fromA).OK)
	require.Equal(t, fromA.ID, staying.Expect("EVENT").Event.ID, "a member on B receives the channel's events committed on A")
	leaving.ExpectSilence(300*time.Millisecond, "a member removed through A must not receive the channel on B")
	outsider.ExpectSilence(300*time.Millisecond, "an outsider never receives a private channel's events")
}

// Redis goes away mid-test: each relay keeps delivering to its own
// subscribers and storing, reports degraded in /ready (still 200) and in
// buzz_redis_connected, and cross-relay delivery resumes when Redis is back.
// What was committed elsewhere meanwhile is replayed live from the database
// once Redis is back, ahead of what comes after, and nothing is sent twice:
// not the event heard before the outage, not what a relay published itself.
// Mutations killed: a relay that never resubscribes (A never reports
// connected again); /ready answering 503 while degraded; no catch-up (A's
// subscriber never gets the outage's event); the hub not remembering what
// it published (B's subscriber gets the outage's event again, A's the one
// before it).
func TestCrossRelaySurvivesRedisOutage(t *testing.T) {
	t.Parallel()
	redis := dbtest.RedisServer(t)
	relays := relaysOnRedis(t, redis.URL(), 2)
	a, b := relays[0], relays[1]
	require.Equal(t, "1", metric(t, a, "buzz_redis_connected"))

	onA := a.Dial(t, a.Host)
	onA.Auth(nil)
	onB := b.Dial(t, a.Host)
	onB.Auth(nil)
	publisher := b.Dial(t, a.Host)
	author := publisher.Auth(nil)
	filter := map[string]any{"authors": []string{author.PublicKeyHex()}, "limit": 0}
	for _, c := range []*relaytest.Client{onA, onB} {
		c.Send("REQ", "live", filter)
		c.Expect("EOSE")
	}
	first := publisher.Sign(1, "before the outage", nil, 0)
	require.True(t, publisher.Publish(first).OK)
	require.Equal(t, first.ID, onA.Expect("EVENT").Event.ID)
	require.Equal(t, first.ID, onB.Expect("EVENT").Event.ID)

	redis.Kill()
	waitRedis(t, "degraded", a, b)
	require.Equal(t, "0", metric(t, a, "buzz_redis_connected"))
	during := publisher.Sign(1, "during the outage", nil, 0)
	require.True(t, publisher.Publish(during).OK, "writes go on without Redis")
	require.Equal(t, during.ID, onB.Expect("EVENT").Event.ID, "local delivery goes on without Redis")
	// B gives up on publishing it (a Redis back within the publish timeout
	// would still carry it); only then does Redis return.
	waitPublished(t, b)
	require.Equal(t, "1", metric(t, b, `buzz_redis_publish_dropped_total{reason="redis_error"}`), "B counts the event it could not publish")

	require.NoError(t, redis.Restart(t.Context()))
	waitRedis(t, "connected", a, b)
	require.Equal(t, during.ID, onA.Expect("EVENT").Event.ID, "A replays what B committed during the outage")
	for _, r := range []*relaytest.Relay{a, b} {
		require.Eventually(t, func() bool { return metric(t, r, `buzz_redis_gaps_total{outcome="replayed"}`) == "1" },
			30*time.Second, 20*time.Millisecond, "relay %s never finished its catch-up", r.HTTPURL)
	}
	require.Equal(t, "1", metric(t, a, "buzz_redis_replayed_total"), "A counts the one event it replayed")
	require.Equal(t, "0", metric(t, b, "buzz_redis_replayed_total"), "B had published everything itself")
	after := publisher.Sign(1, "after the outage", nil, 0)
	require.True(t, publisher.Publish(after).OK)
	require.Equal(t, after.ID, onB.Expect("EVENT").Event.ID, "B delivered the outage's event already, and only once")
	require.Equal(t, after.ID, onA.Expect("EVENT").Event.ID, "cross-relay delivery resumes")
	onA.ExpectSilence(300*time.Millisecond, "nothing arrives twice on A")
	onB.ExpectSilence(300*time.Millisecond, "nothing arrives twice on B")

	reader := a.Dial(t, a.Host)
	reader.Auth(nil)
	got := reader.Req("history", map[string]any{"authors": []string{author.PublicKeyHex()}})
	require.ElementsMatch(t, []string{first.ID, during.ID, after.ID}, ids(got), "everything stored stays queryable on every relay")
}

// A relay process started while Redis is down serves its own clients but
// hears none of the others: once Redis is back, its first subscription
// replays what another process committed meanwhile to the subscriber it
// already had, once.
// Mutation killed: no gap at the bus's start (A's subscriber never gets
// B's event).
func TestCrossRelayStartedDuringAnOutageCatchesUp(t *testing.T) {
	t.Parallel()
	redis := dbtest.RedisServer(t)
	pool := dbtest.Pool(t)
	b := relaytest.StartOn(t, pool, withRedis(redis.URL()))
	waitRedis(t, "connected", b)
	redis.Kill()
	waitRedis(t, "degraded", b)
	a := relaytest.StartOn(t, pool, withRedis(redis.URL()))
	waitRedis(t, "degraded", a)

	onA := a.Dial(t, a.Host)
	onA.Auth(nil)
	publisher := b.Dial(t, a.Host)
	author := publisher.Auth(nil)
	onA.Send("REQ", "live", map[string]any{"authors": []string{author.PublicKeyHex()}, "limit": 0})
	onA.Expect("EOSE")
	during := publisher.Sign(1, "while A never heard B", nil, 0)
	require.True(t, publisher.Publish(during).OK)
	waitPublished(t, b)

	require.NoError(t, redis.Restart(t.Context()))
	waitRedis(t, "connected", a, b)
	require.Equal(t, during.ID, onA.Expect("EVENT").Event.ID, "A replays what B committed before A ever subscribed")
	require.Eventually(t, func() bool { return metric(t, a, "buzz_redis_replayed_total") == "1" },
		30*time.Second, 20*time.Millisecond)
	onA.ExpectSilence(300*time.Millisecond, "nothing arrives twice on A")
}

// A gap longer than ten minutes is not replayed: it would read and sort
// every event received meanwhile, on the writer, in every relay process at
// once when Redis returns, to deliver events long stale. A shorter one is.
// Mutation killed: no bound on the gap's length (the long gap is read and
// replayed).
func TestCatchUpRefusesAGapTooLongToReplay(t *testing.T) {
	t.Parallel()
	r := relaytest.Start(t)
	subscriber := r.Dial(t, r.Host)
	subscriber.Auth(nil)
	publisher := r.Dial(t, r.Host)
	author := publisher.Auth(nil)
	subscriber.Send("REQ", "live", map[string]any{"authors": []string{author.PublicKeyHex()}, "limit": 0})
	subscriber.Expect("EOSE")
	// Stored straight into the database, as another process would: this
	// relay's hub never published it.
	ev := publisher.Sign(1, "committed elsewhere", nil, 0)
	params, err := eventstore.InsertParams(r.CommunityID, ev, nil)
	require.NoError(t, err)
	_, err = db.New(r.Pool).EventInsert(t.Context(), params)
	require.NoError(t, err)

	now := time.Now()
	_, err = r.Server.CatchUp(t.Context(), now.Add(-11*time.Minute), now)
	require.ErrorContains(t, err, "too long to replay live")

	replayed, err := r.Server.CatchUp(t.Context(), now.Add(-time.Minute), now)
	require.NoError(t, err)
	require.Equal(t, 1, replayed)
	require.Equal(t, ev.ID, subscriber.Expect("EVENT").Event.ID)
}

// Without BUZZ_REDIS_URL a relay is the only one: /ready says nothing about
// Redis and no Redis collector is registered.
func TestSingleRelayHasNoRedis(t *testing.T) {
	t.Parallel()
	r := relaytest.Start(t)
	require.Empty(t, readyRedis(t, r))
	require.Empty(t, metric(t, r, "buzz_redis_connected"))
}

// A publisher spread over two relays gets the publish limit once: its
// burst is counted in one bucket in Redis, not one per process.
// Mutation killed: leaving each process's in-process limiter in place (B
// accepts the fourth event: its own bucket is still full).
func TestCrossRelayPublishLimitIsShared(t *testing.T) {
	t.Parallel()
	url := dbtest.RedisURL(t)
	pool := dbtest.Pool(t)
	limit := func(c *config.Config) { c.PublishBurst, c.PublishPerMinute = 3, 1 }
	a := relaytest.StartOn(t, pool, withRedis(url), limit)
	b := relaytest.StartOn(t, pool, withRedis(url), limit)
	waitRedis(t, "connected", a, b)

	onA := a.Dial(t, a.Host)
	key := onA.Auth(nil)
	onB := b.Dial(t, a.Host)
	onB.Auth(key)
	require.True(t, onA.Publish(onA.Sign(1, "one", nil, 0)).OK)
	require.True(t, onA.Publish(onA.Sign(1, "two", nil, 0)).OK)
	require.True(t, onB.Publish(onB.Sign(1, "three", nil, 0)).OK)
	over := onB.Publish(onB.Sign(1, "four", nil, 0))
	require.False(t, over.OK)
	require.True(t, strings.HasPrefix(over.Msg, "rate-limited: "), over.Msg)
	// Another publisher has a bucket of its own.
	other := b.Dial(t, a.Host)
	other.Auth(nil)
	require.True(t, other.Publish(other.Sign(1, "mine", nil, 0)).OK)
}

// An invalidation published while a relay was cut off from Redis is lost;
// the relay makes up for it by forgetting every cached access answer when
// it subscribes again, so a member removed during the outage is cut off as
// soon as Redis is back, not when the cached answer expires.
// Mutation killed: no resync on resubscription (B keeps delivering the
// channel to the removed member from its cached reader set).
func TestCrossRelayResubscribeForgetsCachedAccess(t *testing.T) {
	t.Parallel()
	redis, a, b, owner, ch, leaving, staying := privateChannelOnTwoRelays(t)
	// B caches the channel's readers while delivering this.
	before := owner.Sign(9, "before", nostr.Tags{{"h", ch}}, 0)
	require.True(t, owner.Publish(before).OK)
	require.Equal(t, before.ID, leaving.Expect("EVENT").Event.ID)
	require.Equal(t, before.ID, staying.Expect("EVENT").Event.ID)

	redis.Kill()
	waitRedis(t, "degraded", a, b)
	require.True(t, owner.Publish(owner.Sign(9001, "", nostr.Tags{{"h", ch}, {"p", leaving.Key.PublicKeyHex()}}, 0)).OK)
	// A gives up on publishing the invalidation (a Redis back within the
	// publish timeout would still carry it); only then does Redis return.
	waitPublished(t, a)
	require.NoError(t, redis.Restart(t.Context()))
	waitRedis(t, "connected", a, b)

	after := owner.Sign(9, "after", nostr.Tags{{"h", ch}}, 0)
	require.True(t, owner.Publish(after).OK)
	require.Equal(t, after.ID, staying.Expect("EVENT").Event.ID)
	leaving.ExpectSilence(300*time.Millisecond, "a member removed while B was cut off must not receive the channel once B is back")
}

// A stalled Redis (stopped: it takes bytes into its socket and neither
// answers nor resets) is noticed like a lost one: /ready turns degraded,
// the publish limit falls back to this process's own at once, and the
// relay subscribes again once Redis answers. Before, the subscription's
// health ping went into the socket buffer without error, so the relay
// counted itself connected for good and every publish waited out a Redis
// read on the shared rate limiter.
// Mutation killed: a ping unanswered for a health interval not taken as a
// failure (/ready stays "connected").
func TestCrossRelayNoticesAStalledRedis(t *testing.T) {
	t.Parallel()
	redis := dbtest.RedisServer(t)
	r := relaytest.StartOn(t, dbtest.Pool(t), withRedis(redis.URL()))
	waitRedis(t, "connected", r)
	c := r.Dial(t, r.Host)
	c.Auth(nil)

	require.NoError(t, syscall.Kill(redis.Pid(), syscall.SIGSTOP))
	t.Cleanup(func() { _ = syscall.Kill(redis.Pid(), syscall.SIGCONT) })
	waitRedis(t, "degraded", r)
	require.Equal(t, "0", metric(t, r, "buzz_redis_connected"))
	require.True(t, c.Publish(c.Sign(1, "while Redis is stalled", nil, 0)).OK)

	require.NoError(t, syscall.Kill(redis.Pid(), syscall.SIGCONT))
	waitRedis(t, "connected", r)
}

// A member removed through A while Redis is down must not go on receiving
// the private channel on B: the invalidation cannot cross, so B must not
// trust the reader set it cached before the outage for the rest of its
// 10 s lifetime. While cut off from the other relays, B asks the database.
// Mutation killed: trusting cached access answers while the bus is not
// connected (B delivers the post-removal message to the removed member).
func TestCrossRelayOutageDoesNotTrustCachedAccess(t *testing.T) {
	t.Parallel()
	redis, a, b, owner, ch, leaving, staying := privateChannelOnTwoRelays(t)

	redis.Kill()
	waitRedis(t, "degraded", a, b)
	// B caches the channel's readers while delivering this, during the
	// outage.
	postOnB(t, staying, leaving, ch, "before")

	require.True(t, owner.Publish(owner.Sign(9001, "", nostr.Tags{{"h", ch}, {"p", leaving.Key.PublicKeyHex()}}, 0)).OK)
	postOnB(t, staying, nil, ch, "after the removal")
	leaving.ExpectSilence(300*time.Millisecond, "a member removed through A during the outage must not receive the channel on B")
}

// The same with Redis stalled (stopped, not closed): B keeps its
// subscription for seconds, but stops trusting its cached answers as soon
// as it has no proof of hearing the others, so the member removed through
// A meanwhile receives nothing more on B.
// Mutation killed: B trusting its cached answers while merely connected
// (TrustOnlyWhile(bus.Connected)): the removed member received the
// post-removal message.
func TestCrossRelayStalledRedisDoesNotTrustCachedAccess(t *testing.T) {
	t.Parallel()
	redis, _, b, owner, ch, leaving, staying := privateChannelOnTwoRelays(t)
	// B caches the channel's readers while delivering this.
	postOnB(t, staying, leaving, ch, "before")

	require.NoError(t, syscall.Kill(redis.Pid(), syscall.SIGSTOP))
	t.Cleanup(func() { _ = syscall.Kill(redis.Pid(), syscall.SIGCONT) })
	require.True(t, owner.Publish(owner.Sign(9001, "", nostr.Tags{{"h", ch}, {"p", leaving.Key.PublicKeyHex()}}, 0)).OK)
	require.Eventually(t, func() bool { return !b.Server.CrossRelayHears() }, 30*time.Second, 10*time.Millisecond)
	postOnB(t, staying, nil, ch, "after the removal")
	leaving.ExpectSilence(300*time.Millisecond, "a member removed through A while Redis is stalled must not receive the channel on B")
}

// postOnB has author, a member connected to B, post content to the channel,
// and requires that author's own subscription and seenBy's (nil: none)
// deliver it: B caches the channel's readers while delivering it.
func postOnB(t *testing.T, author, seenBy *relaytest.Client, ch, content string) *nostr.Event {
	t.Helper()
	ev := author.Sign(9, content, nostr.Tags{{"h", ch}}, 0)
	author.Send("EVENT", ev)
	require.Equal(t, ev.ID, author.Expect("EVENT").Event.ID, "a member still receives the channel")
	require.True(t, author.Expect("OK").OK)
	if seenBy != nil {
		require.Equal(t, ev.ID, seenBy.Expect("EVENT").Event.ID)
	}
	return ev
}

// privateChannelOnTwoRelays starts relays A and B on one database and one
// redis-server, and a private channel created through A whose two members,
// leaving and staying, are connected to B with live subscriptions to it.
func privateChannelOnTwoRelays(t *testing.T) (redis *redisserver.Server, a, b *relaytest.Relay, owner *relaytest.Client, ch string, leaving, staying *relaytest.Client) {
	t.Helper()
	redis = dbtest.RedisServer(t)
	pool := dbtest.Pool(t)
	a = relaytest.StartOn(t, pool, withRedis(redis.URL()))
	b = relaytest.StartOn(t, pool, withRedis(redis.URL()))
	waitRedis(t, "connected", a, b)

	owner = a.Dial(t, a.Host)
	owner.Auth(nil)
	ch = createChannel(t, owner, "secret", true)
	leaving = b.Dial(t, a.Host)
	leaving.Auth(nil)
	staying = b.Dial(t, a.Host)
	staying.Auth(nil)
	for _, m := range []*relaytest.Client{leaving, staying} {
		require.True(t, owner.Publish(owner.Sign(9000, "", nostr.Tags{{"h", ch}, {"p", m.Key.PublicKeyHex()}}, 0)).OK)
		m.Send("REQ", "channel", map[string]any{"kinds": []int{9}, "#h": []string{ch}, "limit": 0})
		m.Expect("EOSE")
	}
	return redis, a, b, owner, ch, leaving, staying
}

// A member removed through A stops receiving the private channel on B at
// once, even before B has heard A's invalidation (Redis slow to carry it,
// here held back by CLIENT PAUSE WRITE, which lets B's health pings
// through, so B goes on trusting its cache): an event B commits after the
// removal has read the channel's readers version in its own write, newer
// than the reader set B cached, so B drops its answers for the community
// and reads the readers again.
// Mutations killed: fan-out ignoring the version an event was written
// under, or the triggers of migration 038 not counting a removal (B
// delivers the post-removal message to the removed member).
func TestCrossRelayRemovalHoldsBeforeTheInvalidationArrives(t *testing.T) {
	t.Parallel()
	redis, a, b, owner, ch, leaving, staying := privateChannelOnTwoRelays(t)
	// B caches the channel's readers while delivering this.
	postOnB(t, staying, leaving, ch, "before")

	holdRedisWrites(t, redis)
	require.True(t, owner.Publish(owner.Sign(9001, "", nostr.Tags{{"h", ch}, {"p", leaving.Key.PublicKeyHex()}}, 0)).OK)
	postOnB(t, staying, nil, ch, "after the removal")
	require.Equal(t, "connected", readyRedis(t, b), "B still trusts its cache: the window this test is about")
	// The write that proved the change dropped B's other answers too: the
	// removed member's history read is refused.
	leaving.Send("REQ", "history", map[string]any{"#h": []string{ch}})
	require.Equal(t, "restricted: not a channel member", leaving.Expect("CLOSED").Msg)
	_ = a
	leaving.ExpectSilence(300*time.Millisecond, "a member removed through A must not receive the channel on B before the invalidation arrives")
}

// The same for a channel write through B after the removal that is not a
// message: a metadata edit (kind 9002, which takes the channel's lock) and
// a workflow save (kind 30620) each read the channel's access row, and
// must hand its readers version to the fan-out as a message does: the
// removed member does not receive them on B.
// Mutations killed: lockChannel, or the workflow save, not recording the
// readers version it read (ReadChannel): its event was fanned out with
// version 0, from B's reader set cached before the removal, and the
// removed member received it.
func TestCrossRelayRemovalHoldsForChannelWritesBeforeTheInvalidationArrives(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		kind    int
		content string
		tags    nostr.Tags
	}{
		{9002, "", nostr.Tags{{"name", "renamed"}}},
		{30620, "name: Quiet\ntrigger: {on: webhook}\nsteps: [{id: say, action: send_message, text: hi}]", nostr.Tags{{"d", uuid.NewString()}}},
	} {
		t.Run(strconv.Itoa(c.kind), func(t *testing.T) {
			t.Parallel()
			redis, a, b, owner, ch, leaving, staying := privateChannelOnTwoRelays(t)
			before := staying.Sign(9, "before", nostr.Tags{{"h", ch}}, 0)
			staying.Send("EVENT", before)
			require.Equal(t, before.ID, staying.Expect("EVENT").Event.ID)
			require.True(t, staying.Expect("OK").OK)
			require.Equal(t, before.ID, leaving.Expect("EVENT").Event.ID)
			for _, m := range []*relaytest.Client{leaving, staying} {
				m.Send("REQ", "writes", map[string]any{"kinds": []int{c.kind}, "#h": []string{ch}, "limit": 0})
				m.Expect("EOSE")
			}
			ownerOnB := b.Dial(t, a.Host)
			ownerOnB.Auth(owner.Key)

			holdRedisWrites(t, redis)
			require.True(t, owner.Publish(owner.Sign(9001, "", nostr.Tags{{"h", ch}, {"p", leaving.Key.PublicKeyHex()}}, 0)).OK)
			write := ownerOnB.Sign(c.kind, c.content, append(nostr.Tags{{"h", ch}}, c.tags...), 0)
			got := ownerOnB.Publish(write)
			require.True(t, got.OK, got.Msg)
			require.Equal(t, write.ID, staying.Expect("EVENT").Event.ID, "a member still receives the channel")
			require.Equal(t, "connected", readyRedis(t, b), "B still trusts its cache: the window this test is about")
			leaving.ExpectSilence(300*time.Millisecond, "a member removed through A must not receive the channel's write on B before the invalidation arrives")
		})
	}
}

// The same for typing and presence (ephemeral kinds 20002 and 20001),
// which are checked without the channel's write lock and never written: a
// member removed through A does not receive, on B, what a member sends
// through B after the removal's OK, before B has heard A's invalidation.
// Their check reads the channel's readers version as a write's does, and
// the fan-out on B must not use the reader set it cached before the
// removal. Mutation killed: an ephemeral event published with readers
// version 0 (B delivered the typing to the removed member).
func TestCrossRelayRemovalHoldsForTypingAndPresenceBeforeTheInvalidationArrives(t *testing.T) {
	t.Parallel()
	redis, _, _, owner, ch, leaving, staying := privateChannelOnTwoRelays(t)
	for _, m := range []*relaytest.Client{leaving, staying} {
		m.Send("REQ", "ephemeral", map[string]any{"kinds": []int{20001, 20002}, "#h": []string{ch}, "limit": 0})
		m.Expect("EOSE")
	}
	// B caches the channel's readers while delivering this.
	before := staying.Sign(20002, "typing", nostr.Tags{{"h", ch}}, 0)
	staying.Send("EVENT", before)
	require.Equal(t, before.ID, staying.Expect("EVENT").Event.ID)
	require.True(t, staying.Expect("OK").OK)
	require.Equal(t, before.ID, leaving.Expect("EVENT").Event.ID)

	holdRedisWrites(t, redis)
	require.True(t, owner.Publish(owner.Sign(9001, "", nostr.Tags{{"h", ch}, {"p", leaving.Key.PublicKeyHex()}}, 0)).OK)
	for _, kind := range []int{20002, 20001} {
		ev := staying.Sign(kind, "after the removal", nostr.Tags{{"h", ch}}, 0)
		staying.Send("EVENT", ev)
		require.Equal(t, ev.ID, staying.Expect("EVENT").Event.ID, "a member still receives the channel's kind %d", kind)
		got := staying.Expect("OK")
		require.True(t, got.OK, got.Msg)
	}
	leaving.ExpectSilence(300*time.Millisecond, "a member removed through A must not receive the channel's typing or presence on B before the invalidation arrives")
}

// The same for a deletion by a former writer: a member removed through A
// may still delete, through B, what they wrote in the channel, and the
// deletion is stored for the channel's members. Its write read no access
// row for the channel it is bound to (the removed author may not write
// there), so it went out from B's reader set cached before the removal,
// to its own author among them.
// Mutation killed: writeBody not reading the version of a channel its
// event is bound to without a write check (readChannelOnce): the removed
// member received the deletion on B.
func TestCrossRelayRemovalHoldsForAFormerWritersDeletion(t *testing.T) {
	t.Parallel()
	redis, _, b, owner, ch, leaving, staying := privateChannelOnTwoRelays(t)
	// B caches the channel's readers while delivering this.
	own := leaving.Sign(9, "mine", nostr.Tags{{"h", ch}}, 0)
	leaving.Send("EVENT", own)
	require.Equal(t, own.ID, leaving.Expect("EVENT").Event.ID)
	require.True(t, leaving.Expect("OK").OK)
	require.Equal(t, own.ID, staying.Expect("EVENT").Event.ID)
	for _, m := range []*relaytest.Client{leaving, staying} {
		// A former writer's deletion carries no h tag (it follows its
		// target): the first filter matches it, the second pins the channel
		// for live delivery.
		m.Send("REQ", "deletions",
			map[string]any{"kinds": []int{5}, "authors": []string{leaving.Key.PublicKeyHex()}, "limit": 0},
			map[string]any{"kinds": []int{5}, "#h": []string{ch}, "limit": 0})
		m.Expect("EOSE")
	}

	holdRedisWrites(t, redis)
	require.True(t, owner.Publish(owner.Sign(9001, "", nostr.Tags{{"h", ch}, {"p", leaving.Key.PublicKeyHex()}}, 0)).OK)
	deletion := leaving.Sign(5, "", nostr.Tags{{"e", own.ID}}, 0)
	leaving.Send("EVENT", deletion)
	// Its fan-out runs before the answer: a delivery to its author comes first.
	got := leaving.NextReply()
	require.Equal(t, "OK", got.Verb, "a member removed through A must not receive their deletion in the channel on B before the invalidation arrives")
	require.True(t, got.OK, got.Msg)
	require.Equal(t, deletion.ID, staying.Expect("EVENT").Event.ID, "a member still receives the channel")
	require.Equal(t, "connected", readyRedis(t, b), "B still trusts its cache: the window this test is about")
	leaving.ExpectSilence(300*time.Millisecond, "a member removed through A must not receive the channel's deletion on B before the invalidation arrives")
}

// A catch-up replays only what a REQ would still return: an event that
// expired during the gap (NIP-40) is not sent to live subscribers after
// its expiration. Mutation killed: EventKeysReceivedBetween and
// EventsByKey without the expiration test (the expired event is replayed,
// and replayed counts 2).
func TestCatchUpSkipsEventsExpiredDuringTheGap(t *testing.T) {
	t.Parallel()
	r := relaytest.Start(t)
	subscriber := r.Dial(t, r.Host)
	subscriber.Auth(nil)
	publisher := r.Dial(t, r.Host)
	author := publisher.Auth(nil)
	subscriber.Send("REQ", "live", map[string]any{"authors": []string{author.PublicKeyHex()}, "limit": 0})
	subscriber.Expect("EOSE")
	// Stored straight into the database, as another process would have
	// while this one heard nothing: one expired since, one that has not.
	now := time.Now()
	expired := publisher.Sign(1, "gone before the replay", nostr.Tags{{"expiration", strconv.FormatInt(now.Add(-time.Second).Unix(), 10)}}, now.Add(-time.Minute).Unix())
	kept := publisher.Sign(1, "still current", nil, now.Unix())
	for _, ev := range []*nostr.Event{expired, kept} {
		params, err := eventstore.InsertParams(r.CommunityID, ev, nil)
		require.NoError(t, err)
		_, err = db.New(r.Pool).EventInsert(t.Context(), params)
		require.NoError(t, err)
	}

	replayed, err := r.Server.CatchUp(t.Context(), now.Add(-time.Minute), time.Now())
	require.NoError(t, err)
	require.Equal(t, 1, replayed)
	require.Equal(t, kept.ID, subscriber.Expect("EVENT").Event.ID)
	subscriber.ExpectSilence(300*time.Millisecond, "the expired event is never replayed")
}
