package relay_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/buzzrelay/buzz/internal/nostr"
	"github.com/buzzrelay/buzz/internal/relaytest"
)

// A connection that authenticates as another pubkey reads as that pubkey
// from then on, live subscriptions included: those opened as the previous
// pubkey are closed, rather than going on delivering its private channel
// to a connection whose REQ for that channel is now refused.
// Mutation killed: keeping the subscriptions across the re-AUTH.
func TestReAuthAsAnotherPubkeyClosesLiveSubscriptions(t *testing.T) {
	t.Parallel()
	r := relaytest.Start(t)
	owner := r.Dial(t, "")
	owner.Auth(nil)
	x := r.Dial(t, "")
	member := x.Auth(nil)
	ch := createChannel(t, owner, "secret", true)
	require.True(t, owner.Publish(owner.Sign(9000, "", nostr.Tags{{"h", ch}, {"p", member.PublicKeyHex()}}, 0)).OK)

	x.Send("REQ", "private", map[string]any{"kinds": []int{9}, "#h": []string{ch}, "limit": 0})
	x.Expect("EOSE")
	x.Send("REQ", "wraps", map[string]any{"kinds": []int{1059}, "#p": []string{member.PublicKeyHex()}, "limit": 0})
	x.Expect("EOSE")

	// The same pubkey again keeps its subscriptions.
	x.Auth(member)
	require.True(t, owner.Publish(owner.Sign(9, "still a member", nostr.Tags{{"h", ch}}, 0)).OK)
	require.Equal(t, "private", x.Expect("EVENT").SubID)

	outsider := relaytest.NewKey(t)
	x.Send("AUTH", x.AuthEvent(outsider))
	closed := map[string]string{}
	for range 3 {
		reply := x.NextReply()
		switch reply.Verb {
		case "CLOSED":
			closed[reply.SubID] = reply.Msg
		case "OK":
			require.True(t, reply.OK, reply.Msg)
		default:
			t.Fatalf("unexpected %+v", reply)
		}
	}
	require.Equal(t, map[string]string{
		"private": "restricted: authenticated as another pubkey; subscribe again",
		"wraps":   "restricted: authenticated as another pubkey; subscribe again",
	}, closed)

	// The new pubkey's REQ is refused, and nothing of the channel or of the
	// member's gift wraps reaches the connection any more.
	x.Send("REQ", "again", map[string]any{"kinds": []int{9}, "#h": []string{ch}, "limit": 0})
	require.Equal(t, "restricted: not a channel member", x.Expect("CLOSED").Msg)
	require.True(t, owner.Publish(owner.Sign(9, "after the re-AUTH", nostr.Tags{{"h", ch}}, 0)).OK)
	wrap := relaytest.SignEvent(t, relaytest.NewKey(t), 1059, "sealed", nostr.Tags{{"p", member.PublicKeyHex()}}, 0)
	require.True(t, owner.Publish(wrap).OK)
	x.ExpectSilence(300*time.Millisecond, "a subscription opened as the previous pubkey delivered after the re-AUTH")
}
