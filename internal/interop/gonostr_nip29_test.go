package interop

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/nbd-wtf/go-nostr"
	"github.com/stretchr/testify/require"

	"github.com/buzzrelay/buzz/internal/relaytest"
)

// TestGoNostrNIP29Flow drives a channel's life with go-nostr: create, join,
// send, receive live, leave — and checks the relay-signed discovery events
// go-nostr reads back.
func TestGoNostrNIP29Flow(t *testing.T) {
	t.Parallel()
	r := relaytest.Start(t)
	owner, guest := connectGo(t, r), connectGo(t, r)
	ch := uuid.NewString()

	owner.publish(9007, "", nostr.Tags{{"h", ch}, {"name", "interop"}, {"visibility", "private"}}, nostr.Now())
	// Private: the guest cannot join on its own, and sees nothing of it.
	require.Error(t, guest.send(guest.sign(9021, "", nostr.Tags{{"h", ch}}, nostr.Now())))
	require.Empty(t, guest.query(nostr.Filter{Kinds: []int{39000}, Tags: nostr.TagMap{"d": {ch}}}))

	owner.publish(9000, "", nostr.Tags{{"h", ch}, {"p", guest.pk}}, nostr.Now())
	meta := guest.query(nostr.Filter{Kinds: []int{39000}, Tags: nostr.TagMap{"d": {ch}}})
	require.Len(t, meta, 1)
	ok, err := meta[0].CheckSignature()
	require.NoError(t, err)
	require.True(t, ok, "go-nostr verifies the relay's signature")
	require.Equal(t, "interop", meta[0].Tags.GetFirst([]string{"name", ""}).Value())
	members := guest.query(nostr.Filter{Kinds: []int{39002}, Tags: nostr.TagMap{"d": {ch}}})
	require.Len(t, members, 1)
	require.NotNil(t, members[0].Tags.GetFirst([]string{"p", guest.pk}))

	ctx, cancel := context.WithTimeout(t.Context(), 4*wait)
	defer cancel()
	sub, err := guest.Subscribe(ctx, nostr.Filters{{Kinds: []int{9}, Tags: nostr.TagMap{"h": {ch}}}})
	require.NoError(t, err)
	defer sub.Unsub()
	select {
	case <-sub.EndOfStoredEvents:
	case reason := <-sub.ClosedReason:
		t.Fatalf("CLOSED %q", reason)
	case <-time.After(wait):
		t.Fatal("no EOSE")
	}
	msg := owner.publish(9, "welcome", nostr.Tags{{"h", ch}}, nostr.Now())
	select {
	case ev := <-sub.Events:
		require.Equal(t, msg.ID, ev.ID)
	case <-time.After(wait):
		t.Fatal("the member did not receive the channel message live")
	}
	reply := guest.publish(9, "thanks", nostr.Tags{{"h", ch}}, nostr.Now())
	require.ElementsMatch(t, []string{reply.ID, msg.ID}, ids(owner.query(nostr.Filter{Kinds: []int{9}, Tags: nostr.TagMap{"h": {ch}}})))

	guest.publish(9022, "", nostr.Tags{{"h", ch}}, nostr.Now())
	require.Error(t, guest.send(guest.sign(9, "still here?", nostr.Tags{{"h", ch}}, nostr.Now())), "a former member cannot write to a private channel")
	require.Contains(t, guest.reqClosedReasonFor(nostr.Filter{Kinds: []int{9}, Tags: nostr.TagMap{"h": {ch}}}), "restricted:")
}

// TestGoNostrChannelDeletionWithoutHTag: a member deletes their message
// with a plain NIP-09 deletion (e and k tags, no h tag, as generic clients
// send it). It is stored in the message's channel, so the channel's readers
// following it by #h are sent it: live, in a pinned REQ and in a pinned
// COUNT. A non-member is sent none of it.
//
// go-nostr (like nostr-tools) drops an event that does not match its
// subscription's filters before handing it over, and an h-less deletion
// does not match #h as sent: what the relay sent is observed through
// go-nostr's duplicate check, which sees every EVENT's id first.
func TestGoNostrChannelDeletionWithoutHTag(t *testing.T) {
	t.Parallel()
	r := relaytest.Start(t)
	owner, member, outsider := connectGo(t, r), connectGo(t, r), connectGo(t, r)
	ch := uuid.NewString()
	pinned := nostr.Filter{Kinds: []int{5}, Tags: nostr.TagMap{"h": {ch}}}

	owner.publish(9007, "", nostr.Tags{{"h", ch}, {"name", "deletions"}, {"visibility", "private"}}, nostr.Now())
	owner.publish(9000, "", nostr.Tags{{"h", ch}, {"p", member.pk}}, nostr.Now())
	msg := owner.publish(9, "oops", nostr.Tags{{"h", ch}}, nostr.Now())

	live := member.sent(nostr.Filter{Tags: nostr.TagMap{"h": {ch}}, Since: ptr(msg.CreatedAt + 1)})
	outsiderLive := outsider.sent(nostr.Filter{Kinds: []int{5}})
	require.Empty(t, live.stored)
	require.Empty(t, outsiderLive.stored)

	del := owner.publish(5, "", nostr.Tags{{"e", msg.ID}, {"k", "9"}}, msg.CreatedAt+1)
	require.Equal(t, del.ID, live.next(), "the channel's member is sent the deletion live")
	require.Equal(t, []string{del.ID}, member.sent(pinned).stored, "pinned history holds the deletion")
	require.EqualValues(t, 1, member.count(pinned))
	require.Empty(t, member.fetch(nostr.Filter{IDs: []string{msg.ID}}))
	// Only deletions are read as carrying their channel's h tag: the
	// channel's relay-signed lists, also stored there, are pinned by #d.
	lists := nostr.Filter{Kinds: []int{39000, 39001, 39002}}
	require.NotEmpty(t, member.sent(nostr.Filter{Kinds: lists.Kinds, Tags: nostr.TagMap{"d": {ch}}}).stored)
	require.Empty(t, member.sent(nostr.Filter{Kinds: lists.Kinds, Tags: nostr.TagMap{"h": {ch}}}).stored)

	require.Empty(t, outsider.sent(nostr.Filter{Kinds: []int{5}}).stored)
	require.Contains(t, outsider.reqClosedReasonFor(pinned), "restricted:")
	// A deletion the outsider may read, published after the channel's,
	// is the first it is sent: the channel's was not.
	sentinel := owner.publish(5, "", nostr.Tags{{"e", owner.publish(1, "global", nil, nostr.Now()).ID}}, nostr.Now())
	require.Equal(t, sentinel.ID, outsiderLive.next(), "the outsider was sent the channel's deletion")
}

// sentSub is a go-nostr subscription recording the id of every event the
// relay sends on it, whether or not go-nostr passes the event on.
type sentSub struct {
	c      *goClient
	stored []string    // sent before EOSE
	live   chan string // sent after EOSE
}

// sent subscribes to filter and waits for its EOSE; the subscription stays
// open until the test ends.
func (c *goClient) sent(filter nostr.Filter) *sentSub {
	c.t.Helper()
	s := &sentSub{c: c, live: make(chan string, 16)}
	var eosed atomic.Bool
	var mu sync.Mutex
	observe := nostr.WithCheckDuplicate(func(id, _ string) bool {
		if eosed.Load() {
			s.live <- id
		} else {
			mu.Lock()
			s.stored = append(s.stored, id)
			mu.Unlock()
		}
		return false
	})
	sub, err := c.Subscribe(c.t.Context(), nostr.Filters{filter}, observe)
	require.NoError(c.t, err)
	c.t.Cleanup(sub.Unsub)
	go func() { // go-nostr sends EOSE once every stored event is taken
		for range sub.Events {
		}
	}()
	select {
	case <-sub.EndOfStoredEvents:
	case reason := <-sub.ClosedReason:
		c.t.Fatalf("REQ %v: CLOSED %q", filter, reason)
	case <-time.After(wait):
		c.t.Fatalf("REQ %v: no EOSE within %s", filter, wait)
	}
	eosed.Store(true)
	mu.Lock()
	defer mu.Unlock()
	return s
}

// next is the id of the next event sent live.
func (s *sentSub) next() string {
	s.c.t.Helper()
	select {
	case id := <-s.live:
		return id
	case <-time.After(wait):
		s.c.t.Fatal("no event sent live")
		return ""
	}
}
