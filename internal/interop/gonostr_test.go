package interop

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nbd-wtf/go-nostr"
	"github.com/stretchr/testify/require"

	"github.com/buzzrelay/buzz/internal/relaytest"
)

// wait bounds every single round trip to the relay: a failure bound only,
// long enough for a loaded machine.
const wait = 30 * time.Second

// goClient is one go-nostr connection with its own key.
type goClient struct {
	*nostr.Relay
	t  *testing.T
	sk string
	pk string
}

// dialGo connects with go-nostr without authenticating.
func dialGo(t *testing.T, r *relaytest.Relay) *goClient {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), wait)
	defer cancel()
	rl, err := nostr.RelayConnect(ctx, r.URL)
	require.NoError(t, err)
	t.Cleanup(func() { _ = rl.Close() })
	sk := nostr.GeneratePrivateKey()
	pk, err := nostr.GetPublicKey(sk)
	require.NoError(t, err)
	return &goClient{Relay: rl, t: t, sk: sk, pk: pk}
}

// connectGo connects and authenticates the way go-nostr's own pool does: a
// request refused with "auth-required:" is answered with AUTH. The refusal
// also proves go-nostr has read the challenge, which the relay sends first.
func connectGo(t *testing.T, r *relaytest.Relay) *goClient {
	t.Helper()
	c := dialGo(t, r)
	require.True(t, strings.HasPrefix(c.reqClosedReason(), "auth-required:"))
	require.NoError(t, c.auth(nil))
	return c
}

func (c *goClient) ctx() (context.Context, context.CancelFunc) {
	return context.WithTimeout(c.t.Context(), wait)
}

// auth sends go-nostr's AUTH event; tamper (optional) edits it before signing.
func (c *goClient) auth(tamper func(*nostr.Event)) error {
	ctx, cancel := c.ctx()
	defer cancel()
	return c.Auth(ctx, func(evt *nostr.Event) error {
		if tamper != nil {
			tamper(evt)
		}
		return evt.Sign(c.sk)
	})
}

// reqClosedReason sends a REQ that the relay must refuse before AUTH and
// returns the CLOSED reason.
func (c *goClient) reqClosedReason() string {
	c.t.Helper()
	return c.reqClosedReasonFor(nostr.Filter{Kinds: []int{1}, Limit: 1})
}

// reqClosedReasonFor sends a REQ the relay must refuse and returns the reason.
func (c *goClient) reqClosedReasonFor(filter nostr.Filter) string {
	c.t.Helper()
	ctx, cancel := c.ctx()
	defer cancel()
	sub, err := c.Subscribe(ctx, nostr.Filters{filter})
	require.NoError(c.t, err)
	events := sub.Events
	for {
		select {
		case reason := <-sub.ClosedReason:
			return reason
		case ev, ok := <-events:
			require.False(c.t, ok, "refused REQ %v returned event %v", filter, ev)
			events = nil // closed after CLOSED; the reason is on its way
		case <-sub.EndOfStoredEvents:
			c.t.Fatalf("REQ %v reached EOSE; want CLOSED", filter)
		case <-ctx.Done():
			c.t.Fatalf("REQ %v: no CLOSED within %s", filter, wait)
		}
	}
}

// sign builds an event by this client's key.
func (c *goClient) sign(kind int, content string, tags nostr.Tags, createdAt nostr.Timestamp) nostr.Event {
	c.t.Helper()
	if tags == nil {
		tags = nostr.Tags{}
	}
	ev := nostr.Event{Kind: kind, Content: content, Tags: tags, CreatedAt: createdAt}
	require.NoError(c.t, ev.Sign(c.sk))
	return ev
}

func (c *goClient) send(ev nostr.Event) error {
	ctx, cancel := c.ctx()
	defer cancel()
	return c.Publish(ctx, ev)
}

// publish signs, sends and requires the relay's OK true.
func (c *goClient) publish(kind int, content string, tags nostr.Tags, createdAt nostr.Timestamp) nostr.Event {
	c.t.Helper()
	ev := c.sign(kind, content, tags, createdAt)
	require.NoError(c.t, c.send(ev), "publish kind %d", kind)
	return ev
}

// fetch subscribes and returns the stored events, requiring an EOSE (not a
// CLOSED, not a timeout) to end them.
func (c *goClient) fetch(filters ...nostr.Filter) []*nostr.Event {
	c.t.Helper()
	ctx, cancel := c.ctx()
	defer cancel()
	sub, err := c.Subscribe(ctx, filters)
	require.NoError(c.t, err)
	defer sub.Unsub()
	var got []*nostr.Event
	for {
		select {
		case ev, ok := <-sub.Events:
			require.True(c.t, ok, "subscription %v ended before EOSE", filters)
			got = append(got, ev)
		case <-sub.EndOfStoredEvents:
			return got
		case reason := <-sub.ClosedReason:
			c.t.Fatalf("REQ %v: CLOSED %q", filters, reason)
		case <-ctx.Done():
			c.t.Fatalf("REQ %v: no EOSE within %s", filters, wait)
		}
	}
}

// query is go-nostr's QuerySync, required to end on EOSE rather than on its
// deadline (QuerySync returns what it has either way).
func (c *goClient) query(filter nostr.Filter) []*nostr.Event {
	c.t.Helper()
	ctx, cancel := c.ctx()
	defer cancel()
	events, err := c.QuerySync(ctx, filter)
	require.NoError(c.t, err)
	require.NoError(c.t, ctx.Err(), "QuerySync %v ended by its deadline, not by EOSE", filter)
	return events
}

// count is NIP-45 COUNT through go-nostr.
func (c *goClient) count(filter nostr.Filter) int64 {
	c.t.Helper()
	ctx, cancel := c.ctx()
	defer cancel()
	n, _, err := c.Count(ctx, nostr.Filters{filter})
	require.NoError(c.t, err, "COUNT %v", filter)
	return n
}

func ids(events []*nostr.Event) []string {
	out := make([]string, len(events))
	for i, ev := range events {
		out[i] = ev.ID
	}
	return out
}

func TestGoNostrAuthRequired(t *testing.T) {
	t.Parallel()
	r := relaytest.Start(t)
	c := dialGo(t, r)

	note := c.sign(1, "before auth", nil, nostr.Now())
	err := c.send(note)
	require.Error(t, err)
	require.Contains(t, err.Error(), "auth-required")
	require.True(t, strings.HasPrefix(c.reqClosedReason(), "auth-required:"))

	// An AUTH event carrying the wrong challenge is refused and leaves the
	// connection unauthenticated.
	err = c.auth(func(evt *nostr.Event) { evt.Tags = nostr.Tags{{"relay", c.URL}, {"challenge", "not-the-challenge"}} })
	require.Error(t, err)
	require.Contains(t, err.Error(), "invalid:")
	err = c.send(note)
	require.Error(t, err)
	require.Contains(t, err.Error(), "auth-required")

	require.NoError(t, c.auth(nil))
	require.NoError(t, c.send(note))
	require.Equal(t, []string{note.ID}, ids(c.fetch(nostr.Filter{IDs: []string{note.ID}})))

	// Authenticated as one key, publishing another key's event is refused.
	other := nostr.GeneratePrivateKey()
	forged := nostr.Event{Kind: 1, Content: "someone else", Tags: nostr.Tags{}, CreatedAt: nostr.Now()}
	require.NoError(t, forged.Sign(other))
	err = c.send(forged)
	require.Error(t, err)
	require.Contains(t, err.Error(), "restricted:")
	require.Empty(t, c.fetch(nostr.Filter{IDs: []string{forged.ID}}))
}

func TestGoNostrPublishAndQuery(t *testing.T) {
	t.Parallel()
	r := relaytest.Start(t)
	a, b := connectGo(t, r), connectGo(t, r)
	base := nostr.Now() - 100

	a1 := a.publish(1, "a1", nostr.Tags{{"t", "interop"}}, base)
	a2 := a.publish(1, "a2", nostr.Tags{{"t", "interop"}, {"t", "go"}}, base+1)
	a3 := a.publish(1, "a3", nostr.Tags{{"t", "other"}}, base+2)
	a7 := a.publish(7, "+", nostr.Tags{{"e", a1.ID}}, base+3)
	b1 := b.publish(1, "b1", nostr.Tags{{"t", "interop"}}, base+4)

	// Events come back exactly as signed.
	got := a.query(nostr.Filter{IDs: []string{a2.ID}})
	require.Len(t, got, 1)
	require.Equal(t, a2.ID, got[0].ID)
	require.Equal(t, a2.Sig, got[0].Sig)
	require.Equal(t, a2.PubKey, got[0].PubKey)
	require.Equal(t, a2.Content, got[0].Content)
	require.Equal(t, a2.Tags, got[0].Tags)
	require.Equal(t, a2.CreatedAt, got[0].CreatedAt)
	ok, err := got[0].CheckSignature()
	require.NoError(t, err)
	require.True(t, ok)

	// go-nostr drops events that do not match the filter, so each query is
	// cross-checked with COUNT, which the relay alone evaluates.
	cases := []struct {
		name   string
		filter nostr.Filter
		want   []string
	}{
		{"kinds+authors", nostr.Filter{Kinds: []int{1}, Authors: []string{a.pk}}, []string{a1.ID, a2.ID, a3.ID}},
		{"authors", nostr.Filter{Authors: []string{a.pk}}, []string{a1.ID, a2.ID, a3.ID, a7.ID}},
		{"#t", nostr.Filter{Kinds: []int{1}, Tags: nostr.TagMap{"t": {"interop"}}}, []string{a1.ID, a2.ID, b1.ID}},
		{"#t any of", nostr.Filter{Tags: nostr.TagMap{"t": {"go", "other"}}}, []string{a2.ID, a3.ID}},
		{"#e", nostr.Filter{Kinds: []int{7}, Tags: nostr.TagMap{"e": {a1.ID}}}, []string{a7.ID}},
		{"#t+authors", nostr.Filter{Authors: []string{b.pk}, Tags: nostr.TagMap{"t": {"interop"}}}, []string{b1.ID}},
		{"since+until", nostr.Filter{Authors: []string{a.pk}, Since: ptr(base + 1), Until: ptr(base + 2)}, []string{a2.ID, a3.ID}},
		{"ids", nostr.Filter{IDs: []string{a1.ID, b1.ID}}, []string{a1.ID, b1.ID}},
		{"no match", nostr.Filter{Kinds: []int{1}, Authors: []string{a.pk}, Tags: nostr.TagMap{"t": {"absent"}}}, nil},
	}
	for _, tc := range cases {
		require.ElementsMatch(t, tc.want, ids(a.query(tc.filter)), "QuerySync %s", tc.name)
		require.EqualValues(t, len(tc.want), a.count(tc.filter), "COUNT %s", tc.name)
	}

	// limit keeps the newest. (go-nostr hands each event over from its own
	// goroutine, so arrival order is not asserted here; the nostr-tools
	// check asserts newest-first.)
	require.ElementsMatch(t, []string{a7.ID, a3.ID}, ids(a.query(nostr.Filter{Authors: []string{a.pk}, Limit: 2})))
	require.ElementsMatch(t, []string{b1.ID, a3.ID, a2.ID}, ids(a.query(nostr.Filter{Kinds: []int{1}, Limit: 3})))
	require.ElementsMatch(t, []string{a1.ID}, ids(a.query(nostr.Filter{Authors: []string{a.pk}, Kinds: []int{1}, Until: ptr(base), Limit: 5})))
}

func ptr(ts nostr.Timestamp) *nostr.Timestamp { return &ts }

func TestGoNostrLiveSubscription(t *testing.T) {
	t.Parallel()
	r := relaytest.Start(t)
	reader, writer := connectGo(t, r), connectGo(t, r)
	stored := writer.publish(1, "stored before the REQ", nil, nostr.Now()-10)

	ctx, cancel := context.WithTimeout(t.Context(), 4*wait)
	defer cancel()
	sub, err := reader.Subscribe(ctx, nostr.Filters{{Kinds: []int{1, 20001}, Authors: []string{writer.pk}}})
	require.NoError(t, err)
	defer sub.Unsub()
	next := func(what string) *nostr.Event {
		t.Helper()
		select {
		case ev, ok := <-sub.Events:
			require.True(t, ok, "subscription ended waiting for %s", what)
			return ev
		case reason := <-sub.ClosedReason:
			t.Fatalf("CLOSED %q waiting for %s", reason, what)
		case <-time.After(wait):
			t.Fatalf("no %s within %s", what, wait)
		}
		return nil
	}

	require.Equal(t, stored.ID, next("stored event").ID)
	select {
	case <-sub.EndOfStoredEvents:
	case <-time.After(wait):
		t.Fatal("no EOSE")
	}

	live := writer.publish(1, "published after EOSE", nil, nostr.Now())
	require.Equal(t, live.ID, next("live event").ID)

	// Ephemeral events fan out to live subscribers but are never stored.
	ephemeral := writer.publish(20001, "ephemeral", nil, nostr.Now())
	require.Equal(t, ephemeral.ID, next("ephemeral event").ID)
	require.Empty(t, reader.fetch(nostr.Filter{Kinds: []int{20001}}))
	require.Empty(t, reader.fetch(nostr.Filter{IDs: []string{ephemeral.ID}}))

	// The next delivery is the writer's, not the reader's own note (go-nostr
	// also filters client-side; the nostr-tools check fails on stray events).
	other := reader.publish(1, "not from the writer", nil, nostr.Now())
	last := writer.publish(1, "last", nil, nostr.Now())
	got := next("last event")
	require.NotEqual(t, other.ID, got.ID)
	require.Equal(t, last.ID, got.ID)
}

func TestGoNostrCount(t *testing.T) {
	t.Parallel()
	r := relaytest.Start(t)
	c := connectGo(t, r)
	base := nostr.Now() - 50
	var first nostr.Event
	for i := range 3 {
		tags := nostr.Tags{{"t", "counted"}}
		if i == 2 {
			tags = nil
		}
		ev := c.publish(1, fmt.Sprint("note ", i), tags, base+nostr.Timestamp(i))
		if i == 0 {
			first = ev
		}
	}
	c.publish(7, "+", nostr.Tags{{"e", first.ID}, {"t", "counted"}}, base+5)

	require.EqualValues(t, 3, c.count(nostr.Filter{Kinds: []int{1}, Authors: []string{c.pk}}))
	require.EqualValues(t, 4, c.count(nostr.Filter{Authors: []string{c.pk}}))
	require.EqualValues(t, 2, c.count(nostr.Filter{Kinds: []int{1}, Tags: nostr.TagMap{"t": {"counted"}}}))
	require.EqualValues(t, 3, c.count(nostr.Filter{Tags: nostr.TagMap{"t": {"counted"}}}))
	require.EqualValues(t, 2, c.count(nostr.Filter{Authors: []string{c.pk}, Since: ptr(base + 2)}))
	require.EqualValues(t, 0, c.count(nostr.Filter{Authors: []string{nostr.GeneratePrivateKey()}}))
}

func TestGoNostrReplaceable(t *testing.T) {
	t.Parallel()
	r := relaytest.Start(t)
	c := connectGo(t, r)
	now := nostr.Now()
	profile := nostr.Filter{Kinds: []int{0}, Authors: []string{c.pk}}

	v1 := c.publish(0, `{"name":"first"}`, nil, now-20)
	require.Equal(t, []string{v1.ID}, ids(c.fetch(profile)))
	v2 := c.publish(0, `{"name":"second"}`, nil, now-10)
	require.Equal(t, []string{v2.ID}, ids(c.fetch(profile)))
	require.EqualValues(t, 1, c.count(profile))

	// The older version arriving again is acknowledged (OK true, duplicate)
	// but does not come back.
	require.NoError(t, c.send(v1))
	older := c.publish(0, `{"name":"older still"}`, nil, now-30)
	require.Equal(t, []string{v2.ID}, ids(c.fetch(profile)))
	require.Empty(t, c.fetch(nostr.Filter{IDs: []string{v1.ID, older.ID}}))

	// Replaceable kinds in 10000-19999 follow the same rule.
	list := nostr.Filter{Kinds: []int{10000}, Authors: []string{c.pk}}
	c.publish(10000, "", nostr.Tags{{"p", c.pk}}, now-5)
	l2 := c.publish(10000, "", nil, now-4)
	require.Equal(t, []string{l2.ID}, ids(c.fetch(list)))
	require.Equal(t, []string{v2.ID}, ids(c.fetch(profile)), "kind 10000 must not replace kind 0")
}

func TestGoNostrAddressable(t *testing.T) {
	t.Parallel()
	r := relaytest.Start(t)
	c, other := connectGo(t, r), connectGo(t, r)
	now := nostr.Now()
	articles := nostr.Filter{Kinds: []int{30023}, Authors: []string{c.pk}}

	a1 := c.publish(30023, "draft", nostr.Tags{{"d", "alpha"}, {"title", "Alpha"}}, now-30)
	b1 := c.publish(30023, "beta", nostr.Tags{{"d", "beta"}}, now-25)
	a2 := c.publish(30023, "final", nostr.Tags{{"d", "alpha"}, {"title", "Alpha"}}, now-20)
	// Another author's event with the same d tag is a different address.
	o1 := other.publish(30023, "theirs", nostr.Tags{{"d", "alpha"}}, now-40)

	require.ElementsMatch(t, []string{a2.ID, b1.ID}, ids(c.fetch(articles)))
	require.Equal(t, []string{a2.ID}, ids(c.fetch(nostr.Filter{Kinds: []int{30023}, Authors: []string{c.pk}, Tags: nostr.TagMap{"d": {"alpha"}}})))
	require.ElementsMatch(t, []string{a2.ID, o1.ID}, ids(c.fetch(nostr.Filter{Kinds: []int{30023}, Tags: nostr.TagMap{"d": {"alpha"}}})))
	require.EqualValues(t, 2, c.count(articles))

	// The replaced version arriving again does not come back.
	require.NoError(t, c.send(a1))
	require.ElementsMatch(t, []string{a2.ID, b1.ID}, ids(c.fetch(articles)))
	require.Empty(t, c.fetch(nostr.Filter{IDs: []string{a1.ID}}))
}

func TestGoNostrDeletion(t *testing.T) {
	t.Parallel()
	r := relaytest.Start(t)
	c, other := connectGo(t, r), connectGo(t, r)
	now := nostr.Now()
	notes := nostr.Filter{Kinds: []int{1}, Authors: []string{c.pk}}

	n1 := c.publish(1, "to be deleted", nil, now-30)
	n2 := c.publish(1, "kept", nil, now-29)
	require.EqualValues(t, 2, c.count(notes))

	del := c.publish(5, "mistake", nostr.Tags{{"e", n1.ID}, {"k", "1"}}, now-28)
	require.Equal(t, []string{n2.ID}, ids(c.fetch(notes)))
	require.Empty(t, c.fetch(nostr.Filter{IDs: []string{n1.ID}}))
	require.EqualValues(t, 1, c.count(notes))
	// The deletion request itself is stored and served.
	require.Equal(t, []string{del.ID}, ids(c.fetch(nostr.Filter{Kinds: []int{5}, Authors: []string{c.pk}})))
	// Re-broadcasting the deleted event does not bring it back.
	require.NoError(t, c.send(n1))
	require.Empty(t, c.fetch(nostr.Filter{IDs: []string{n1.ID}}))

	// Nobody can delete someone else's event.
	other.publish(5, "", nostr.Tags{{"e", n2.ID}}, now-27)
	require.Equal(t, []string{n2.ID}, ids(other.fetch(nostr.Filter{IDs: []string{n2.ID}})))

	// An a-tag deletion hides the versions at or before its created_at; a
	// version of another address newer than the deletion stays.
	post := c.publish(30023, "post", nostr.Tags{{"d", "post"}}, now-20)
	keep := c.publish(30023, "newer than the deletion", nostr.Tags{{"d", "keep"}}, now-5)
	c.publish(5, "", nostr.Tags{
		{"a", fmt.Sprintf("30023:%s:post", c.pk)},
		{"a", fmt.Sprintf("30023:%s:keep", c.pk)},
	}, now-10)
	articles := nostr.Filter{Kinds: []int{30023}, Authors: []string{c.pk}}
	require.Equal(t, []string{keep.ID}, ids(c.fetch(articles)))
	require.Empty(t, c.fetch(nostr.Filter{IDs: []string{post.ID}}))
	require.EqualValues(t, 1, c.count(articles))

	// A version newer than the deletion is served again.
	repost := c.publish(30023, "rewritten", nostr.Tags{{"d", "post"}}, now)
	require.ElementsMatch(t, []string{keep.ID, repost.ID}, ids(c.fetch(articles)))
}

// TestGoNostrAddressDeletionCoversLateOlderVersion: NIP-09 says an a-tag
// deletion covers every version of the address up to its created_at, so a
// version created before the deletion must stay hidden even when it reaches
// the relay after the deletion (and after the deleted head).
func TestGoNostrAddressDeletionCoversLateOlderVersion(t *testing.T) {
	t.Parallel()
	r := relaytest.Start(t)
	c := connectGo(t, r)
	now := nostr.Now()
	address := nostr.Filter{Kinds: []int{30023}, Authors: []string{c.pk}, Tags: nostr.TagMap{"d": {"slot"}}}

	c.publish(30023, "v1", nostr.Tags{{"d", "slot"}}, now-30)
	c.publish(5, "", nostr.Tags{{"a", fmt.Sprintf("30023:%s:slot", c.pk)}}, now-10)
	require.Empty(t, c.fetch(address))

	late := c.sign(30023, "v2, written before the deletion", nostr.Tags{{"d", "slot"}}, now-20)
	_ = c.send(late) // refusing it or acknowledging it are both fine; serving it is not
	require.Empty(t, c.fetch(address), "a version created before the a-tag deletion is served")
	require.EqualValues(t, 0, c.count(address))
}
