package interop

import (
	"context"
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
