package relay_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/buzzrelay/buzz/internal/nostr"
	"github.com/buzzrelay/buzz/internal/relaytest"
)

// NIP-17 gift wraps are signed by a throwaway key, stored without a
// channel, and reach only the pubkey in their p tag, live or stored.
func TestGiftWrapsReachOnlyTheirRecipient(t *testing.T) {
	t.Parallel()
	r := relaytest.Start(t)
	sender := r.Dial(t, "")
	sender.Auth(nil)
	recipient := r.Dial(t, "")
	recipient.Auth(nil)
	snoop := r.Dial(t, "")
	snoop.Auth(nil)

	me := recipient.Key.PublicKeyHex()
	recipient.Send("REQ", "inbox", map[string]any{"kinds": []int{1059}, "#p": []string{me}, "limit": 0})
	recipient.Expect("EOSE")
	snoop.Send("REQ", "everything", map[string]any{"limit": 0})
	snoop.Expect("EOSE")

	wrap := relaytest.SignEvent(t, relaytest.NewKey(t), 1059, "ciphertext", nostr.Tags{{"p", me}}, 0)
	ok := sender.Publish(wrap)
	require.True(t, ok.OK, "a gift wrap's author is a throwaway key: %s", ok.Msg)
	require.Equal(t, wrap.ID, recipient.Expect("EVENT").Event.ID)

	require.Equal(t, []string{wrap.ID}, ids(recipient.Req("stored", map[string]any{"kinds": []int{1059}, "#p": []string{me}})))
	require.Empty(t, snoop.Req("all", map[string]any{}))
	snoop.Send("REQ", "theirs", map[string]any{"kinds": []int{1059}, "#p": []string{me}})
	require.Equal(t, "restricted: kind 1059 is only readable with a #p filter naming only you", snoop.Expect("CLOSED").Msg)
	snoop.ExpectSilence(300*time.Millisecond, "a catch-all subscription must not receive someone else's gift wrap")

	var channel *string
	require.NoError(t, r.Pool.QueryRow(context.Background(), "SELECT channel_id::text FROM events WHERE kind = 1059").Scan(&channel))
	require.Nil(t, channel, "gift wraps are stored without a channel")
}

// Presence (20001) and typing (20002) are ephemeral and channel-scoped:
// members pinned to the channel see them, nobody else, and nothing is stored.
func TestPresenceAndTypingAreChannelScopedAndEphemeral(t *testing.T) {
	t.Parallel()
	r := relaytest.Start(t)
	owner := r.Dial(t, "")
	owner.Auth(nil)
	member := r.Dial(t, "")
	member.Auth(nil)
	outsider := r.Dial(t, "")
	outsider.Auth(nil)
	ch := createChannel(t, owner, "typing", true)
	require.True(t, owner.Publish(owner.Sign(9000, "", nostr.Tags{{"h", ch}, {"p", member.Key.PublicKeyHex()}}, 0)).OK)

	member.Send("REQ", "typing", map[string]any{"kinds": []int{20001, 20002}, "#h": []string{ch}, "limit": 0})
	member.Expect("EOSE")
	outsider.Send("REQ", "global", map[string]any{"kinds": []int{20001, 20002}, "limit": 0})
	outsider.Expect("EOSE")

	for _, kind := range []int{20001, 20002} {
		ev := owner.Sign(kind, "", nostr.Tags{{"h", ch}}, 0)
		require.True(t, owner.Publish(ev).OK)
		got := member.Expect("EVENT")
		require.Equal(t, ev.ID, got.Event.ID)
	}
	requireRejected(t, outsider.Publish(outsider.Sign(20002, "", nostr.Tags{{"h", ch}}, 0)), "restricted: ")
	outsider.ExpectSilence(300*time.Millisecond, "a non-member never sees presence in a private channel")

	var n int
	require.NoError(t, r.Pool.QueryRow(context.Background(), "SELECT count(*) FROM events WHERE kind BETWEEN 20000 AND 29999").Scan(&n))
	require.Zero(t, n)
}
