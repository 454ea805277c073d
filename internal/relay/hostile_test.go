package relay_test

import (
	"context"
	"testing"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/buzzrelay/buzz/internal/nostr"
	"github.com/buzzrelay/buzz/internal/relaytest"
)

// A member of another channel (here its owner) tries every read and write
// path on a private channel whose message p-tags them: REQ, COUNT and
// /query with ids, #e, #p, authors, kinds, search, #d of its lists and of
// an addressable event, presence and pinned reads; posts, addressable
// events, gift wraps, presence, typing, every NIP-29 moderation kind, a
// workflow, comments, reactions and replies from their own channel, kind 5
// and 9005 deletions naming its events, a forged 39000. Nothing of the
// channel comes back, every write is refused with the answer an unknown
// channel gets, and the channel's events, thread counters and reactions are
// as its members left them. A sweep of what held in an outside review; each
// path's own test names the mutation it kills.
func TestOutsiderOfAPrivateChannelLearnsAndChangesNothing(t *testing.T) {
	t.Parallel()
	r := relaytest.Start(t)
	alice := r.Dial(t, "")
	alice.Auth(nil)
	mallory := r.Dial(t, "")
	mallory.Auth(nil)
	mk := mallory.Key.PublicKeyHex()

	p := createChannel(t, alice, "secret", true)
	x := createChannel(t, mallory, "mallorys", false)
	m1 := alice.Sign(9, "zebra secret", nostr.Tags{{"h", p}, {"p", mk}}, 0)
	require.True(t, alice.Publish(m1).OK)
	reply := alice.Sign(9, "zebra reply", nostr.Tags{{"h", p}, {"e", m1.ID, "", "reply"}}, 0)
	require.True(t, alice.Publish(reply).OK)
	doc := alice.Sign(30023, "zebra doc", nostr.Tags{{"h", p}, {"d", "doc"}}, 0)
	require.True(t, alice.Publish(doc).OK)
	xmsg := mallory.Sign(9, "in x", nostr.Tags{{"h", x}}, 0)
	require.True(t, mallory.Publish(xmsg).OK)

	secret := map[string]bool{m1.ID: true, reply.ID: true, doc.ID: true}
	noSecret := func(what string, evs []*nostr.Event) {
		t.Helper()
		for _, ev := range evs {
			require.False(t, secret[ev.ID], "%s: %s", what, ev.ID)
			for _, h := range ev.Tags.Values("h") {
				require.NotEqual(t, p, h, "%s: event %d of P", what, ev.Kind)
			}
			for _, d := range ev.Tags.Values("d") {
				require.NotEqual(t, p, d, "%s: list %d of P", what, ev.Kind)
			}
		}
	}
	for i, f := range []map[string]any{
		{}, {"ids": []string{m1.ID}}, {"#e": []string{m1.ID}}, {"#p": []string{mk}},
		{"kinds": []int{7, 9, 30023}}, {"authors": []string{alice.Key.PublicKeyHex()}},
		{"kinds": []int{39000, 39001, 39002}, "#d": []string{p}}, {"#d": []string{"doc"}},
		{"search": "zebra"}, {"search": "zebra", "kinds": []int{9}}, {"kinds": []int{44100, 44101}, "#p": []string{mk}},
	} {
		noSecret("REQ", mallory.Req("r", f))
		mallory.Send("COUNT", "c", f)
		n := mallory.Expect("COUNT").Count
		if _, search := f["search"]; search {
			require.Zero(t, n, "COUNT %d %v", i, f)
		}
		got := post(t, r, mallory.Key, "/query", query(f))
		require.Equal(t, 200, got.Status, got.Raw)
		noSecret("HTTP /query", got.Events)
	}
	mallory.Send("COUNT", "c", map[string]any{"ids": []string{m1.ID, reply.ID, doc.ID}})
	require.Zero(t, mallory.Expect("COUNT").Count)
	for _, f := range []map[string]any{{"#h": []string{p}}, {"kinds": []int{20001, 20002}, "#h": []string{p}}, {"#h": []string{x, p}}} {
		mallory.Send("REQ", "pin", f)
		require.Equal(t, "restricted: not a channel member", mallory.Expect("CLOSED").Msg)
	}

	// Writes.
	unknown := "restricted: channel does not exist or is private to its members"
	for _, ev := range []*nostr.Event{
		mallory.Sign(9, "in", nostr.Tags{{"h", p}}, 0),
		mallory.Sign(30023, "in", nostr.Tags{{"h", p}, {"d", "doc"}}, 0),
		mallory.Sign(1059, "in", nostr.Tags{{"h", p}, {"p", mk}}, 0),
		mallory.Sign(20001, "here", nostr.Tags{{"h", p}}, 0),
		mallory.Sign(20002, "typing", nostr.Tags{{"h", p}}, 0),
		mallory.Sign(9021, "", nostr.Tags{{"h", p}}, 0),
		mallory.Sign(9022, "", nostr.Tags{{"h", p}}, 0),
		mallory.Sign(9000, "", nostr.Tags{{"h", p}, {"p", mk}}, 0),
		mallory.Sign(9001, "", nostr.Tags{{"h", p}, {"p", alice.Key.PublicKeyHex()}}, 0),
		mallory.Sign(9002, "", nostr.Tags{{"h", p}, {"name", "pwned"}}, 0),
		mallory.Sign(9005, "", nostr.Tags{{"h", p}, {"e", m1.ID}}, 0),
		mallory.Sign(9008, "", nostr.Tags{{"h", p}}, 0),
		mallory.Sign(9003, "", nostr.Tags{{"h", p}}, 0),
		mallory.Sign(1111, "comment", nostr.Tags{{"h", p}, {"e", m1.ID}}, 0),
		mallory.Sign(30620, "name: x", nostr.Tags{{"h", p}, {"d", uuid.NewString()}}, 0),
	} {
		got := mallory.Publish(ev)
		require.False(t, got.OK, "kind %d accepted", ev.Kind)
		if ev.Kind != 30620 {
			require.Equal(t, unknown, got.Msg, "kind %d", ev.Kind)
		}
	}
	requireRejected(t, mallory.Publish(mallory.Sign(7, "+", nostr.Tags{{"e", m1.ID}}, 0)), "invalid: reaction target event not found")
	requireRejected(t, mallory.Publish(mallory.Sign(7, "+", nostr.Tags{{"e", m1.ID}, {"h", x}}, 0)), "invalid: reaction target event not found")
	requireRejected(t, mallory.Publish(mallory.Sign(9, "re", nostr.Tags{{"h", x}, {"e", m1.ID, "", "reply"}}, 0)), "invalid: reply parent not found")
	requireRejected(t, mallory.Publish(mallory.Sign(9, "re", nostr.Tags{{"h", x}, {"e", m1.ID, "", "root"}}, 0)), "invalid: reply parent not found")
	requireRejected(t, mallory.Publish(mallory.Sign(9, "re", nostr.Tags{{"h", x}, {"e", m1.ID}}, 0)), "invalid: reply parent not found")
	require.True(t, mallory.Publish(mallory.Sign(5, "", nostr.Tags{{"e", m1.ID}, {"e", doc.ID}, {"a", "30023:" + alice.Key.PublicKeyHex() + ":doc"}}, 0)).OK)
	require.True(t, mallory.Publish(mallory.Sign(9005, "", nostr.Tags{{"h", x}, {"e", m1.ID}, {"e", reply.ID}}, 0)).OK)
	requireRejected(t, mallory.Publish(mallory.Sign(39000, "", nostr.Tags{{"d", p}}, 0)), "restricted: ")

	still := alice.Req("still", map[string]any{"#h": []string{p}, "kinds": []int{9, 30023, 7, 1111, 5}})
	require.ElementsMatch(t, []string{m1.ID, reply.ID, doc.ID}, ids(still))
	var foreign int
	require.NoError(t, r.Pool.QueryRow(context.Background(),
		`SELECT count(*) FROM events WHERE community_id = $1 AND channel_id = $2 AND pubkey = decode($3, 'hex')`,
		r.CommunityID, uuid.MustParse(p), mk).Scan(&foreign))
	require.Zero(t, foreign)
	var replies, reactions int
	require.NoError(t, r.Pool.QueryRow(context.Background(),
		`SELECT (SELECT coalesce(sum(reply_count),0) FROM thread_metadata WHERE community_id = $1 AND channel_id = $2), (SELECT count(*) FROM reactions WHERE community_id = $1)`,
		r.CommunityID, uuid.MustParse(p)).Scan(&replies, &reactions))
	require.Equal(t, 1, replies)
	require.Zero(t, reactions)
}
