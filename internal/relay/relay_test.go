package relay_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/buzzrelay/buzz/internal/config"
	"github.com/buzzrelay/buzz/internal/dbtest"
	"github.com/buzzrelay/buzz/internal/nostr"
	"github.com/buzzrelay/buzz/internal/relaytest"
)

func TestMain(m *testing.M) { dbtest.Main(m) }

func ids(events []*nostr.Event) []string {
	out := make([]string, len(events))
	for i, ev := range events {
		out[i] = ev.ID
	}
	return out
}

func TestUnknownHostGets404BeforeUpgrade(t *testing.T) {
	t.Parallel()
	r := relaytest.Start(t)
	_, err := r.TryDial("unknown.example")
	require.ErrorContains(t, err, "404")

	req, _ := http.NewRequest("GET", r.HTTPURL+"/", nil)
	req.Host = "unknown.example"
	req.Header.Set("Accept", "application/nostr+json")
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, http.StatusNotFound, resp.StatusCode)
	body, _ := io.ReadAll(resp.Body)
	require.JSONEq(t, `{"error":"invalid: no community is served at this host"}`, string(body))
}

func TestNIP11AdvertisesTheEnforcedLimits(t *testing.T) {
	t.Parallel()
	r := relaytest.Start(t, func(c *config.Config) { c.MaxFilters = 3; c.MaxLimit = 42 })
	req, _ := http.NewRequest("GET", r.HTTPURL+"/", nil)
	req.Header.Set("Accept", "application/nostr+json")
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.Equal(t, "application/nostr+json", resp.Header.Get("Content-Type"))
	// NIP-11 asks for all three CORS headers, and a page that adds a
	// header of its own gets a preflight, which must carry them too.
	// Mutations killed: no Allow-Methods; OPTIONS answered as a plain GET
	// of / (text, no CORS headers).
	requireInfoCORS := func(h http.Header) {
		t.Helper()
		require.Equal(t, "*", h.Get("Access-Control-Allow-Origin"))
		require.NotEmpty(t, h.Get("Access-Control-Allow-Headers"))
		require.Contains(t, h.Get("Access-Control-Allow-Methods"), "GET")
	}
	requireInfoCORS(resp.Header)
	for _, path := range []string{"/", "/info"} {
		pre, _ := http.NewRequest(http.MethodOptions, r.HTTPURL+path, nil)
		pre.Header.Set("Origin", "https://client.example")
		pre.Header.Set("Access-Control-Request-Method", "GET")
		pre.Header.Set("Access-Control-Request-Headers", "accept, cache-control")
		preResp, err := http.DefaultClient.Do(pre)
		require.NoError(t, err)
		preResp.Body.Close()
		require.Equal(t, http.StatusNoContent, preResp.StatusCode, path)
		requireInfoCORS(preResp.Header)
	}
	var info struct {
		Self          string `json:"self"`
		SupportedNIPs []int  `json:"supported_nips"`
		Limitation    struct {
			MaxFilters   int  `json:"max_filters"`
			MaxLimit     int  `json:"max_limit"`
			AuthRequired bool `json:"auth_required"`
		} `json:"limitation"`
	}
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&info))
	require.Subset(t, info.SupportedNIPs, []int{1, 9, 10, 11, 25, 29, 42, 45, 50, 98})
	require.Equal(t, 3, info.Limitation.MaxFilters)
	require.Equal(t, 42, info.Limitation.MaxLimit)
	require.True(t, info.Limitation.AuthRequired)

	// The advertised filter limit is the enforced one.
	c := r.Dial(t, "")
	c.Auth(nil)
	// "self" is the key that signs this community's discovery events.
	ch := createChannel(t, c, "nip11", false)
	meta := c.Req("meta", map[string]any{"kinds": []int{39000}, "#d": []string{ch}})
	require.Len(t, meta, 1)
	require.Equal(t, info.Self, meta[0].PubKey)
	c.SendRaw(`["REQ","s",{},{},{},{}]`)
	closed := c.Expect("CLOSED")
	require.Equal(t, "s", closed.SubID)
	require.True(t, strings.HasPrefix(closed.Msg, "invalid: "), closed.Msg)
}

func TestHealthReadyAndMetrics(t *testing.T) {
	t.Parallel()
	r := relaytest.Start(t)
	for path, want := range map[string]string{"/health": `"ok"`, "/ready": `"ready"`, "/metrics": "buzz_connections"} {
		base := r.HTTPURL
		if path == "/metrics" {
			base = r.MetricsURL // the operator listener, not a community host
		}
		resp, err := http.Get(base + path)
		require.NoError(t, err)
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		require.Equal(t, http.StatusOK, resp.StatusCode, path)
		require.Contains(t, string(body), want, path)
	}
}

func TestNothingButAuthBeforeAuthentication(t *testing.T) {
	t.Parallel()
	r := relaytest.Start(t)
	c := r.Dial(t, "")
	require.Len(t, c.Challenge, 64)
	key := relaytest.NewKey(t)
	ev := relaytest.SignEvent(t, key, 1, "too early", nil, 0)

	ok := c.Publish(ev)
	require.False(t, ok.OK)
	require.True(t, strings.HasPrefix(ok.Msg, "auth-required: "), ok.Msg)

	c.Send("REQ", "early", map[string]any{"kinds": []int{1}})
	closed := c.Expect("CLOSED")
	require.Equal(t, "early", closed.SubID)
	require.True(t, strings.HasPrefix(closed.Msg, "auth-required: "), closed.Msg)

	c.Send("COUNT", "early", map[string]any{})
	require.True(t, strings.HasPrefix(c.Expect("CLOSED").Msg, "auth-required: "))

	c.Send("CLOSE", "early")
	require.True(t, strings.HasPrefix(c.Expect("NOTICE").Msg, "auth-required: "))

	// The connection stays usable: AUTH, then the same event is accepted.
	c.Auth(key)
	require.True(t, c.Publish(ev).OK)
}

func TestAuthRejections(t *testing.T) {
	t.Parallel()
	r := relaytest.Start(t)
	c := r.Dial(t, "")
	key := relaytest.NewKey(t)
	now := time.Now().Unix()
	cases := []struct {
		name string
		ev   func() *nostr.Event
		want string
	}{
		{"wrong kind", func() *nostr.Event {
			return relaytest.SignEvent(t, key, 1, "", nostr.Tags{{"relay", r.URL}, {"challenge", c.Challenge}}, 0)
		}, "invalid: AUTH event must be kind 22242"},
		{"wrong challenge", func() *nostr.Event {
			return relaytest.SignEvent(t, key, nostr.KindAuth, "", nostr.Tags{{"relay", r.URL}, {"challenge", strings.Repeat("0", 64)}}, 0)
		}, "invalid: AUTH challenge does not match"},
		{"missing challenge", func() *nostr.Event {
			return relaytest.SignEvent(t, key, nostr.KindAuth, "", nostr.Tags{{"relay", r.URL}}, 0)
		}, "invalid: AUTH challenge does not match"},
		{"other relay", func() *nostr.Event {
			return relaytest.SignEvent(t, key, nostr.KindAuth, "", nostr.Tags{{"relay", "wss://other.example"}, {"challenge", c.Challenge}}, 0)
		}, "invalid: AUTH relay tag must name this relay"},
		{"stale", func() *nostr.Event {
			return relaytest.SignEvent(t, key, nostr.KindAuth, "", nostr.Tags{{"relay", r.URL}, {"challenge", c.Challenge}}, now-120)
		}, "invalid: AUTH created_at must be within"},
		{"future", func() *nostr.Event {
			return relaytest.SignEvent(t, key, nostr.KindAuth, "", nostr.Tags{{"relay", r.URL}, {"challenge", c.Challenge}}, now+120)
		}, "invalid: AUTH created_at must be within"},
		{"bad signature", func() *nostr.Event {
			ev := relaytest.SignEvent(t, key, nostr.KindAuth, "", nostr.Tags{{"relay", r.URL}, {"challenge", c.Challenge}}, 0)
			ev.Sig = strings.Repeat("1", 128)
			return ev
		}, "invalid: AUTH event: bad signature"},
		{"tampered content", func() *nostr.Event {
			ev := relaytest.SignEvent(t, key, nostr.KindAuth, "", nostr.Tags{{"relay", r.URL}, {"challenge", c.Challenge}}, 0)
			ev.Content = "changed"
			return ev
		}, "invalid: AUTH event: bad event id"},
	}
	for _, tc := range cases {
		ev := tc.ev()
		c.Send("AUTH", ev)
		ok := c.Expect("OK")
		require.False(t, ok.OK, tc.name)
		require.True(t, strings.HasPrefix(ok.Msg, tc.want), "%s: got %q", tc.name, ok.Msg)
	}
	// Still unauthenticated after every failure.
	require.False(t, c.Publish(relaytest.SignEvent(t, key, 1, "x", nil, 0)).OK)
	// AUTH events are never stored.
	c.Auth(key)
	require.Empty(t, c.Req("auth", map[string]any{"kinds": []int{nostr.KindAuth}}))
	var n int
	require.NoError(t, r.Pool.QueryRow(context.Background(), "SELECT count(*) FROM events").Scan(&n))
	require.Zero(t, n)
}

func TestEventPubkeyMustMatchAuthenticatedPubkey(t *testing.T) {
	t.Parallel()
	r := relaytest.Start(t)
	c := r.Dial(t, "")
	c.Auth(nil)
	other := relaytest.SignEvent(t, relaytest.NewKey(t), 1, "not mine", nil, 0)
	ok := c.Publish(other)
	require.False(t, ok.OK)
	require.Equal(t, "restricted: event pubkey must match the authenticated pubkey", ok.Msg)
}

func TestPublishQueryAndLiveDelivery(t *testing.T) {
	t.Parallel()
	r := relaytest.Start(t)
	pub := r.Dial(t, "")
	pub.Auth(nil)
	sub := r.Dial(t, "")
	sub.Auth(nil)

	base := time.Now().Unix() - 100
	var stored []*nostr.Event
	for i := 0; i < 5; i++ {
		ev := pub.Sign(1, "note", nostr.Tags{{"t", "buzz"}}, base+int64(i))
		require.True(t, pub.Publish(ev).OK)
		stored = append(stored, ev)
	}
	other := pub.Sign(7, "+", nostr.Tags{{"e", stored[0].ID}}, base+10)
	require.True(t, pub.Publish(other).OK)

	// Newest first, limit applies.
	got := sub.Req("recent", map[string]any{"kinds": []int{1}, "limit": 3})
	require.Equal(t, []string{stored[4].ID, stored[3].ID, stored[2].ID}, ids(got))

	// Filters: authors + since/until inclusive; tags; several filters are ORed without duplicates.
	got = sub.Req("window", map[string]any{"authors": []string{pub.Key.PublicKeyHex()}, "since": base + 1, "until": base + 3})
	require.Equal(t, []string{stored[3].ID, stored[2].ID, stored[1].ID}, ids(got))
	got = sub.Req("tags", map[string]any{"#e": []string{stored[0].ID}})
	require.Equal(t, []string{other.ID}, ids(got))
	got = sub.Req("or", map[string]any{"ids": []string{stored[0].ID}}, map[string]any{"kinds": []int{1}, "#t": []string{"buzz"}, "limit": 1})
	require.ElementsMatch(t, []string{stored[0].ID, stored[4].ID}, ids(got))

	// The same subscription now receives live events, only matching ones.
	sub.Send("REQ", "live", map[string]any{"kinds": []int{1}, "#t": []string{"live"}, "limit": 0})
	require.Equal(t, "live", sub.Expect("EOSE").SubID)
	require.True(t, pub.Publish(pub.Sign(1, "no tag", nil, 0)).OK)
	live := pub.Sign(1, "hello", nostr.Tags{{"t", "live"}}, 0)
	require.True(t, pub.Publish(live).OK)
	ev := sub.Expect("EVENT")
	require.Equal(t, "live", ev.SubID)
	require.Equal(t, live.ID, ev.Event.ID)
	require.NoError(t, ev.Event.Verify(), "delivered events keep a valid signature")

	// CLOSE stops delivery. A connection's messages are handled in order,
	// so once the COUNT sent after the CLOSE is answered, the CLOSE has
	// taken effect; publishing before that raced the relay's handling of it.
	sub.Send("CLOSE", "live")
	sub.Send("COUNT", "closed", map[string]any{"#t": []string{"live"}})
	require.Equal(t, int64(1), sub.Expect("COUNT").Count)
	require.True(t, pub.Publish(pub.Sign(1, "after close", nostr.Tags{{"t", "live"}}, 0)).OK)
	sub.Send("COUNT", "probe", map[string]any{"#t": []string{"live"}})
	count := sub.Expect("COUNT")
	require.Equal(t, int64(2), count.Count)
}

func TestReplaceableAndAddressableKeepOnlyTheNewest(t *testing.T) {
	t.Parallel()
	r := relaytest.Start(t)
	c := r.Dial(t, "")
	c.Auth(nil)
	now := time.Now().Unix()

	old := c.Sign(0, `{"name":"old"}`, nil, now-10)
	require.True(t, c.Publish(old).OK)
	newer := c.Sign(0, `{"name":"new"}`, nil, now-5)
	require.True(t, c.Publish(newer).OK)
	// An older version arriving late is not stored.
	late := c.Sign(0, `{"name":"late"}`, nil, now-20)
	ok := c.Publish(late)
	require.True(t, ok.OK)
	require.True(t, strings.HasPrefix(ok.Msg, "duplicate: "), ok.Msg)
	require.Equal(t, []string{newer.ID}, ids(c.Req("profile", map[string]any{"kinds": []int{0}})))

	// Ties on created_at go to the lowest id, whatever the arrival order.
	a := c.Sign(10002, "a", nil, now)
	b := c.Sign(10002, "b", nil, now)
	low, high := a, b
	if b.ID < a.ID {
		low, high = b, a
	}
	require.True(t, c.Publish(high).OK)
	require.True(t, c.Publish(low).OK)
	require.True(t, strings.HasPrefix(c.Publish(high).Msg, "duplicate: "))
	require.Equal(t, []string{low.ID}, ids(c.Req("tie", map[string]any{"kinds": []int{10002}})))

	// Addressable: one slot per d tag.
	first := c.Sign(30023, "v1", nostr.Tags{{"d", "post"}}, now-3)
	second := c.Sign(30023, "v2", nostr.Tags{{"d", "post"}}, now-2)
	otherSlot := c.Sign(30023, "other", nostr.Tags{{"d", "other"}}, now-4)
	noD := c.Sign(30023, "no d", nil, now-4)
	for _, ev := range []*nostr.Event{first, second, otherSlot, noD} {
		require.True(t, c.Publish(ev).OK)
	}
	require.ElementsMatch(t, []string{second.ID, otherSlot.ID, noD.ID}, ids(c.Req("addr", map[string]any{"kinds": []int{30023}})))
}

func TestDeletion(t *testing.T) {
	t.Parallel()
	r := relaytest.Start(t)
	alice := r.Dial(t, "")
	alice.Auth(nil)
	bob := r.Dial(t, "")
	bob.Auth(nil)
	now := time.Now().Unix()

	mine := alice.Sign(1, "mine", nil, now-30)
	keep := alice.Sign(1, "keep", nil, now-29)
	bobs := bob.Sign(1, "bob's", nil, now-28)
	for _, c := range []struct {
		cl *relaytest.Client
		ev *nostr.Event
	}{{alice, mine}, {alice, keep}, {bob, bobs}} {
		require.True(t, c.cl.Publish(c.ev).OK)
	}
	del := alice.Sign(5, "", nostr.Tags{{"e", mine.ID}, {"e", bobs.ID}}, now-20)
	require.True(t, alice.Publish(del).OK)
	// Only the author's own event is hidden; the deletion itself is visible.
	got := bob.Req("notes", map[string]any{"kinds": []int{1}})
	require.ElementsMatch(t, []string{keep.ID, bobs.ID}, ids(got))
	require.Equal(t, []string{del.ID}, ids(bob.Req("dels", map[string]any{"kinds": []int{5}})))
	// Limit applies after deleted rows are hidden.
	require.Equal(t, []string{keep.ID}, ids(bob.Req("limit", map[string]any{"authors": []string{alice.Key.PublicKeyHex()}, "kinds": []int{1}, "limit": 1})))
	bob.Send("COUNT", "c", map[string]any{"kinds": []int{1}})
	require.Equal(t, int64(2), bob.Expect("COUNT").Count)
	// Soft delete: the row is still there.
	var deleted int
	require.NoError(t, r.Pool.QueryRow(context.Background(), "SELECT count(*) FROM events WHERE deleted_at IS NOT NULL").Scan(&deleted))
	require.Equal(t, 1, deleted)

	// A deletion request cannot be deleted.
	require.True(t, alice.Publish(alice.Sign(5, "", nostr.Tags{{"e", del.ID}}, now-10)).OK)
	require.Len(t, bob.Req("dels2", map[string]any{"ids": []string{del.ID}}), 1)

	// a-coordinate: hides versions at or before the deletion, not newer ones.
	coord := "30023:" + alice.Key.PublicKeyHex() + ":post"
	v1 := alice.Sign(30023, "v1", nostr.Tags{{"d", "post"}}, now-15)
	require.True(t, alice.Publish(v1).OK)
	require.True(t, alice.Publish(alice.Sign(5, "", nostr.Tags{{"a", coord}}, now-14)).OK)
	require.Empty(t, bob.Req("addr1", map[string]any{"kinds": []int{30023}}))
	v2 := alice.Sign(30023, "v2", nostr.Tags{{"d", "post"}}, now-5)
	require.True(t, alice.Publish(v2).OK)
	require.Equal(t, []string{v2.ID}, ids(bob.Req("addr2", map[string]any{"kinds": []int{30023}})))
	// A tombstone older than the live head deletes nothing.
	require.True(t, alice.Publish(alice.Sign(5, "", nostr.Tags{{"a", coord}}, now-10)).OK)
	require.Equal(t, []string{v2.ID}, ids(bob.Req("addr3", map[string]any{"kinds": []int{30023}})))
	// Bob cannot delete Alice's coordinate.
	require.True(t, bob.Publish(bob.Sign(5, "", nostr.Tags{{"a", coord}}, now)).OK)
	require.Equal(t, []string{v2.ID}, ids(bob.Req("addr4", map[string]any{"kinds": []int{30023}})))

	// A deletion needs a target.
	ok := alice.Publish(alice.Sign(5, "", nil, now))
	require.False(t, ok.OK)
	require.Equal(t, "invalid: a deletion request needs at least one e or a tag", ok.Msg)
}

func TestEphemeralEventsFanOutButAreNeverStored(t *testing.T) {
	t.Parallel()
	r := relaytest.Start(t)
	pub := r.Dial(t, "")
	pub.Auth(nil)
	sub := r.Dial(t, "")
	sub.Auth(nil)
	sub.Send("REQ", "typing", map[string]any{"kinds": []int{20002}})
	sub.Expect("EOSE")
	ev := pub.Sign(20002, "typing", nil, 0)
	ok := pub.Publish(ev)
	require.True(t, ok.OK)
	require.Equal(t, ev.ID, sub.Expect("EVENT").Event.ID)
	require.Empty(t, pub.Req("again", map[string]any{"kinds": []int{20002}}))
	var n int
	require.NoError(t, r.Pool.QueryRow(context.Background(), "SELECT count(*) FROM events").Scan(&n))
	require.Zero(t, n)
}

func TestSameEventInTwoCommunitiesAndDuplicatesWithinOne(t *testing.T) {
	t.Parallel()
	r := relaytest.Start(t)
	r.AddCommunity(t, "b.example")
	key := relaytest.NewKey(t)
	a := r.Dial(t, "")
	a.Auth(key)
	b := r.Dial(t, "b.example")
	b.Auth(key)
	ev := a.Sign(1, "cross-posted", nil, 0)
	require.True(t, a.Publish(ev).OK)
	okB := b.Publish(ev)
	require.True(t, okB.OK)
	require.Empty(t, okB.Msg, "the same event is new in another community")
	dup := a.Publish(ev)
	require.True(t, dup.OK)
	require.Equal(t, "duplicate: already have this event", dup.Msg)

	// Community B's subscription never sees A's events.
	bOnly := b.Sign(1, "only in b", nil, 0)
	require.True(t, b.Publish(bOnly).OK)
	require.Equal(t, []string{ev.ID}, ids(a.Req("a", map[string]any{"kinds": []int{1}})))
	require.ElementsMatch(t, []string{ev.ID, bOnly.ID}, ids(b.Req("b", map[string]any{"kinds": []int{1}})))
	a.Send("REQ", "live", map[string]any{"kinds": []int{1}, "limit": 0})
	a.Expect("EOSE")
	require.True(t, b.Publish(b.Sign(1, "b live", nil, 0)).OK)
	a.ExpectSilence(300*time.Millisecond, "community A must not receive B's live event")
}

func TestCountMatchesQuery(t *testing.T) {
	t.Parallel()
	r := relaytest.Start(t)
	c := r.Dial(t, "")
	c.Auth(nil)
	for i := 0; i < 7; i++ {
		require.True(t, c.Publish(c.Sign(1+i%2, "n", nostr.Tags{{"t", "x"}}, int64(1700000000+i))).OK)
	}
	c.Send("COUNT", "k1", map[string]any{"kinds": []int{1}})
	require.Equal(t, int64(4), c.Expect("COUNT").Count)
	c.Send("COUNT", "both", map[string]any{"kinds": []int{1}}, map[string]any{"kinds": []int{2}, "limit": 1})
	require.Equal(t, int64(7), c.Expect("COUNT").Count, "COUNT ignores limit and ORs filters")
	c.Send("COUNT", "none", map[string]any{"kinds": []int{}})
	require.Equal(t, int64(0), c.Expect("COUNT").Count)
}

func TestSubscriptionLimit(t *testing.T) {
	t.Parallel()
	r := relaytest.Start(t, func(c *config.Config) { c.MaxSubscriptions = 2 })
	c := r.Dial(t, "")
	c.Auth(nil)
	open := func(id string) {
		c.Send("REQ", id, map[string]any{"limit": 0})
		require.Equal(t, id, c.Expect("EOSE").SubID)
	}
	open("one")
	open("two")
	c.Send("REQ", "three", map[string]any{"limit": 0})
	closed := c.Expect("CLOSED")
	require.Equal(t, "three", closed.SubID)
	require.Equal(t, "rate-limited: at most 2 open subscriptions per connection", closed.Msg)
	// A search or an agent_owner lookup is one-shot: it opens no
	// subscription, so the cap does not refuse it. Kills: onReq applying
	// the cap before it knows the REQ is one-shot.
	c.Send("REQ", "search", map[string]any{"search": "hello"})
	require.Equal(t, "search", c.Expect("EOSE").SubID, "a search at the cap")
	c.Send("REQ", "owned", map[string]any{"agent_owner": c.Key.PublicKeyHex()})
	require.Equal(t, "owned", c.Expect("EOSE").SubID, "an agent_owner lookup at the cap")
	// Re-using an open id replaces it rather than counting twice; closing frees a slot.
	open("two")
	c.Send("CLOSE", "one")
	open("three")
}

func TestGracefulShutdownClosesWithGoingAway(t *testing.T) {
	t.Parallel()
	r := relaytest.Start(t)
	c := r.Dial(t, "")
	c.Auth(nil)
	pub := r.Dial(t, "")
	pub.Auth(nil)
	c.Send("REQ", "live", map[string]any{"limit": 0})
	c.Expect("EOSE")
	last := pub.Sign(1, "last words", nil, 0)
	require.True(t, pub.Publish(last).OK)
	pub.WS.CloseNow() // a peer that never answers the close handshake would hold Shutdown for 5 s
	// The live event queued before shutdown is delivered, then 1001.
	readErr := make(chan error, 1)
	go func() {
		msg, err := c.TryNext(relaytest.Patience)
		if err == nil {
			if !strings.Contains(string(msg[2]), last.ID) {
				err = errors.New("expected the queued event first")
			} else {
				_, err = c.TryNext(relaytest.Patience)
			}
		}
		readErr <- err
	}()
	ctx, cancel := context.WithTimeout(context.Background(), relaytest.Patience)
	defer cancel()
	require.NoError(t, r.Shutdown(ctx))
	err := <-readErr
	require.Equal(t, websocket.StatusGoingAway, websocket.CloseStatus(err), "got %v", err)
	_, err = r.TryDial("")
	require.Error(t, err, "no new connections after shutdown")
}

// A subscriber that stops reading must not slow the publisher or other
// subscribers: once its bounded queue overflows it is disconnected (1008)
// and counted, while the fast subscriber receives every event.
func TestSlowSubscriberIsDisconnectedWithoutBlockingOthers(t *testing.T) {
	t.Parallel()
	// The write watchdog must not win the race against the queue: on a
	// loaded machine a short WriteTimeout closed the blocked slow socket
	// before its 16 slots filled, and nothing was counted as slow.
	r := relaytest.Start(t, func(c *config.Config) { c.SendQueue = 16; c.WriteTimeout = time.Minute })
	slow := r.Dial(t, "")
	slow.Auth(nil)
	slow.Send("REQ", "all", map[string]any{"kinds": []int{1}, "limit": 0})
	slow.Expect("EOSE")
	fast := r.Dial(t, "")
	fast.Auth(nil)
	fast.Send("REQ", "all", map[string]any{"kinds": []int{1}, "limit": 0})
	fast.Expect("EOSE")
	pub := r.Dial(t, "")
	pub.Auth(nil)

	received := make(chan int, 1)
	go func() {
		n := 0
		for {
			ctx, cancel := context.WithTimeout(context.Background(), relaytest.Patience)
			_, _, err := fast.WS.Read(ctx)
			cancel()
			if err != nil {
				t.Logf("fast reader stopped after %d: %v", n, err)
				received <- n
				return
			}
			n++
			if n == 120 {
				received <- n
				return
			}
		}
	}()
	big := strings.Repeat("x", 60<<10)
	for i := 0; i < 120; i++ {
		ok := pub.Publish(pub.Sign(1, fmt.Sprint(i, big), nil, 0))
		require.True(t, ok.OK)
		require.Empty(t, ok.Msg)
	}
	require.Equal(t, 120, <-received, "the fast subscriber gets every event")
	require.Eventually(t, func() bool {
		return testutil.ToFloat64(r.Server.Metrics().SlowClosed) == 1
	}, 30*time.Second, 20*time.Millisecond)
	// The close handshake cannot be written while the slow socket's writer
	// is blocked: the socket goes when the handshake gives up (5 s).
	require.Eventually(t, func() bool {
		return testutil.ToFloat64(r.Server.Metrics().Connections) == 2
	}, 30*time.Second, 20*time.Millisecond, "the slow connection is gone")
}

// A REQ reusing an open id replaces the old subscription even when the new
// one is refused: after its CLOSED, nothing arrives under that id.
func TestRefusedReplacementClosesTheOldSubscription(t *testing.T) {
	t.Parallel()
	r := relaytest.Start(t)
	owner := r.Dial(t, "")
	owner.Auth(nil)
	c := r.Dial(t, "")
	c.Auth(nil)
	private := createChannel(t, owner, "closed", true)
	c.Send("REQ", "x", map[string]any{"kinds": []int{1}, "limit": 0})
	c.Expect("EOSE")
	c.Send("REQ", "x", map[string]any{"#h": []string{private}})
	require.Equal(t, "restricted: not a channel member", c.Expect("CLOSED").Msg)
	require.True(t, owner.Publish(owner.Sign(1, "after the refusal", nil, 0)).OK)
	c.ExpectSilence(300*time.Millisecond, "the replaced subscription must be gone")
}

// A client reading its own large history is not mistaken for a slow
// consumer when live events arrive meanwhile: history waits for room in its
// own queue, and the live queue only overflows for clients that stop reading.
func TestLargeHistoryDoesNotCrowdOutLiveEvents(t *testing.T) {
	t.Parallel()
	r := relaytest.Start(t, func(c *config.Config) { c.SendQueue = 4 })
	pub := r.Dial(t, "")
	pub.Auth(nil)
	// Enough history (150 x 60 KiB) to fill the socket buffers while the
	// client is not reading yet.
	filler := strings.Repeat("h", 60<<10)
	for i := 0; i < 150; i++ {
		require.True(t, pub.Publish(pub.Sign(1, fmt.Sprint(i, filler), nil, int64(1_700_000_000+i))).OK)
	}
	c := r.Dial(t, "")
	c.Auth(nil)
	c.Send("REQ", "live", map[string]any{"kinds": []int{7}, "limit": 0})
	c.Expect("EOSE")
	c.Send("REQ", "history", map[string]any{"kinds": []int{1}})
	time.Sleep(300 * time.Millisecond) // history backs up: the client is not reading yet
	target := pub.Sign(1, "react to me", nil, 0)
	require.True(t, pub.Publish(target).OK)
	for i := 0; i < 3; i++ {
		require.True(t, pub.Publish(pub.Sign(7, fmt.Sprint("+", i), nostr.Tags{{"e", target.ID}}, 0)).OK)
	}
	history, live := 0, 0
	for history < 151 || live < 3 {
		msg := c.NextReply()
		switch {
		case msg.Verb == "EVENT" && msg.SubID == "history":
			history++
		case msg.Verb == "EVENT" && msg.SubID == "live":
			live++
		case msg.Verb == "EOSE":
		default:
			t.Fatalf("unexpected %+v", msg)
		}
	}
	require.Zero(t, testutil.ToFloat64(r.Server.Metrics().SlowClosed))
}

// Every stored event is counted in exactly one group of the group-commit
// histogram, and the waiting-events gauge is served. Events published one
// after another are each written at once by their submitter: groups of one.
//
// Mutation killed: the pipeline's OnGroup not wired to the collectors.
func TestIngestGroupMetrics(t *testing.T) {
	t.Parallel()
	r := relaytest.Start(t)
	key := relaytest.NewKey(t)
	c := r.Dial(t, "")
	c.Auth(key)
	const published = 3
	for i := range published {
		require.True(t, c.Publish(relaytest.SignEvent(t, key, 1, fmt.Sprint("counted ", i), nil, 0)).OK)
	}
	for name, want := range map[string]int{
		"buzz_ingest_group_events_sum":            published,
		"buzz_ingest_group_events_count":          published,
		`buzz_ingest_group_events_bucket{le="1"}`: published,
		"buzz_ingest_group_seconds_count":         published,
		"buzz_ingest_groups_failed_total":         0,
		"buzz_ingest_waiting_events":              0,
	} {
		require.Equal(t, fmt.Sprint(want), metric(t, r, name), name)
	}
}

// buzz_ingest_changes_alone_total counts a change only when the group
// writer hands it on to run alone: a put-user into a channel whose row is
// free commits in its group (not counted); one sent while the row is held
// (as a large channel's list fold holds it) is handed on after its short
// lock wait, counted once, and stored once the row comes free.
//
// Mutation killed: the pipeline's OnChangeAlone not wired to the counter.
func TestIngestChangesAloneMetric(t *testing.T) {
	t.Parallel()
	const name = "buzz_ingest_changes_alone_total"
	ctx := context.Background()
	r := relaytest.Start(t)
	c := r.Dial(t, "")
	c.Auth(relaytest.NewKey(t))
	ch := createChannel(t, c, "handed on", false)
	putUser := func() *nostr.Event {
		return c.Sign(9000, "", nostr.Tags{{"h", ch}, {"p", relaytest.NewKey(t).PublicKeyHex()}}, 0)
	}
	ok := c.Publish(putUser())
	require.True(t, ok.OK, ok.Msg)
	require.Equal(t, "0", metric(t, r, name), "a change whose row was free")

	fold, err := r.Pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = fold.Rollback(ctx) }()
	_, err = fold.Exec(ctx, `SELECT 1 FROM channels WHERE id = $1 FOR NO KEY UPDATE`, ch)
	require.NoError(t, err)
	held := putUser()
	c.Send("EVENT", held)
	require.Eventually(t, func() bool { return metric(t, r, name) == "1" }, 30*time.Second, 5*time.Millisecond,
		"the change waiting for its row was not counted")
	require.NoError(t, fold.Rollback(ctx))
	ok = c.Expect("OK")
	require.True(t, ok.OK, ok.Msg)
	require.Equal(t, "1", metric(t, r, name))
}
