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
	require.Equal(t, "restricted: kind 1059 is only readable with a #p or authors filter naming only you", snoop.Expect("CLOSED").Msg)
	snoop.ExpectSilence(300*time.Millisecond, "a catch-all subscription must not receive someone else's gift wrap")

	var channel *string
	require.NoError(t, r.Pool.QueryRow(context.Background(), "SELECT channel_id::text FROM events WHERE kind = 1059").Scan(&channel))
	require.Nil(t, channel, "gift wraps are stored without a channel")
}

// NIP-04 direct messages (kind 4) reach only their parties, the author and
// the pubkey the p tag names, live and stored: to every other reader of
// the community their tags and times would tell who writes to whom. The
// author reads what they sent by authors, the recipient by #p; a third
// reader gets nothing by any filter, by id, or counted.
// Mutations killed: kind 4 left out of the p-gated kinds (the snoop's
// catch-all REQ returns it); the author not a party in the stored read
// (the sender's own REQ is empty) or in the fan-out (the sender's live
// subscription stays silent).
func TestDirectMessagesReachOnlyTheirParties(t *testing.T) {
	t.Parallel()
	r := relaytest.Start(t)
	sender := r.Dial(t, "")
	key := sender.Auth(nil)
	senderElsewhere := r.Dial(t, "") // the author's other device, subscribed
	senderElsewhere.Auth(key)
	recipient := r.Dial(t, "")
	recipient.Auth(nil)
	snoop := r.Dial(t, "")
	snoop.Auth(nil)
	from, to := key.PublicKeyHex(), recipient.Key.PublicKeyHex()

	senderElsewhere.Send("REQ", "sent", map[string]any{"kinds": []int{4}, "authors": []string{from}, "limit": 0})
	senderElsewhere.Expect("EOSE")
	recipient.Send("REQ", "inbox", map[string]any{"kinds": []int{4}, "#p": []string{to}, "limit": 0})
	recipient.Expect("EOSE")
	snoop.Send("REQ", "everything", map[string]any{"limit": 0})
	snoop.Expect("EOSE")

	dm := sender.Sign(4, "ciphertext?iv=abc", nostr.Tags{{"p", to}}, 0)
	require.True(t, sender.Publish(dm).OK)
	require.Equal(t, dm.ID, senderElsewhere.Expect("EVENT").Event.ID, "the author's live subscription")
	require.Equal(t, dm.ID, recipient.Expect("EVENT").Event.ID, "the recipient's live subscription")

	require.Equal(t, []string{dm.ID}, ids(sender.Req("mine", map[string]any{"kinds": []int{4}, "authors": []string{from}})))
	require.Equal(t, []string{dm.ID}, ids(recipient.Req("theirs", map[string]any{"kinds": []int{4}, "#p": []string{to}})))
	require.Empty(t, snoop.Req("all", map[string]any{}))
	require.Empty(t, snoop.Req("byid", map[string]any{"ids": []string{dm.ID}}))
	snoop.Send("COUNT", "n", map[string]any{"authors": []string{from}})
	require.Zero(t, snoop.Expect("COUNT").Count)
	snoop.Send("REQ", "spy", map[string]any{"kinds": []int{4}, "authors": []string{from}})
	require.Equal(t, "restricted: kind 4 is only readable with a #p or authors filter naming only you", snoop.Expect("CLOSED").Msg)
	requireRejected(t, snoop.Publish(snoop.Sign(7, "+", nostr.Tags{{"e", dm.ID}, {"p", from}}, 0)), "invalid: ")
	// Last: a read that times out closes the client's connection.
	snoop.ExpectSilence(300*time.Millisecond, "a catch-all subscription must not receive someone else's direct message")
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

// Presence without an h tag says only that its author is online in the
// community: like any channel-less event it reaches every authenticated
// reader's unpinned subscription (no channel membership needed), never a
// channel's pinned one, and it is not kept for later subscribers.
// See read-scope.md for why it stays community-wide.
// Mutation killed: refusing channel-less presence (the OK is false).
func TestPresenceWithoutAChannelIsCommunityWideAndLiveOnly(t *testing.T) {
	t.Parallel()
	r := relaytest.Start(t)
	author := r.Dial(t, "")
	author.Auth(nil)
	ch := createChannel(t, author, "elsewhere", true)
	pinned := r.Dial(t, "")
	pinned.Auth(nil)
	require.True(t, author.Publish(author.Sign(9000, "", nostr.Tags{{"h", ch}, {"p", pinned.Key.PublicKeyHex()}}, 0)).OK)
	pinned.Send("REQ", "channel", map[string]any{"kinds": []int{20001}, "#h": []string{ch}, "limit": 0})
	pinned.Expect("EOSE")
	stranger := r.Dial(t, "") // a member of no channel
	stranger.Auth(nil)
	stranger.Send("REQ", "community", map[string]any{"kinds": []int{20001}, "limit": 0})
	stranger.Expect("EOSE")

	online := author.Sign(20001, "online", nil, 0)
	require.True(t, author.Publish(online).OK)
	require.Equal(t, online.ID, stranger.Expect("EVENT").Event.ID)
	require.Empty(t, stranger.Req("later", map[string]any{"kinds": []int{20001}, "authors": []string{author.Key.PublicKeyHex()}}),
		"channel-less presence is not kept")
	pinned.ExpectSilence(300*time.Millisecond, "a channel's subscription does not get community-wide presence")
}
