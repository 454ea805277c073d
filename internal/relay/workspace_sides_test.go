package relay_test

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/buzzrelay/buzz/internal/nostr"
	"github.com/buzzrelay/buzz/internal/relaytest"
)

// sidesChannel creates an open channel owned by c's key.
func sidesChannel(t *testing.T, c *relaytest.Client) string {
	t.Helper()
	id := uuid.NewString()
	ok := c.Publish(c.Sign(9007, "", nostr.Tags{{"h", id}, {"name", "sides " + id[:8]}}, 0))
	require.True(t, ok.OK, ok.Msg)
	return id
}

func requirePrefix(t *testing.T, ok relaytest.Reply, prefix string) {
	t.Helper()
	require.False(t, ok.OK, "expected a rejection, got OK true %q", ok.Msg)
	require.True(t, strings.HasPrefix(ok.Msg, prefix), "message %q lacks prefix %q", ok.Msg, prefix)
}

func putUser(c *relaytest.Client, ch string, user *nostr.SecretKey) relaytest.Reply {
	return c.Publish(c.Sign(9000, "", nostr.Tags{{"h", ch}, {"p", user.PublicKeyHex()}}, 0))
}

// A user's profile decides who may add it to channels (agents usually allow
// only their owner): "nobody" refuses every 9000 put-user, "owner_only"
// accepts only the agent's verified owner.
func TestProfileChannelAddPolicyGatesPutUser(t *testing.T) {
	t.Parallel()
	r := relaytest.Start(t)
	alice := r.Dial(t, "")
	alice.Auth(nil)
	bob := r.Dial(t, "")
	bob.Auth(nil)
	hermit := r.Dial(t, "")
	hermit.Auth(nil)
	agent := r.Dial(t, "")
	agent.Auth(nil)
	ch := sidesChannel(t, alice)

	require.True(t, hermit.Publish(hermit.Sign(0, `{"name":"hermit","channel_add_policy":"nobody"}`, nil, 0)).OK)
	requirePrefix(t, putUser(alice, ch, hermit.Key), "blocked: ")
	// The user may still join on their own.
	require.True(t, hermit.Publish(hermit.Sign(9021, "", nostr.Tags{{"h", ch}}, 0)).OK)

	// The agent's owner is proven by bob's signed attestation on its AUTH.
	ok := authWith(t, agent, agent.Key, attest(t, bob.Key, agent.Key.PublicKeyHex(), ""))
	require.True(t, ok.OK, ok.Msg)
	require.True(t, agent.Publish(agent.Sign(0, `{"name":"honey","channel_add_policy":"owner_only"}`, nil, 0)).OK)
	requirePrefix(t, putUser(alice, ch, agent.Key), "blocked: ")
	// Bob, the owner, becomes an admin (his policy is the default) and adds it.
	ok = alice.Publish(alice.Sign(9000, "", nostr.Tags{{"h", ch}, {"p", bob.Key.PublicKeyHex(), "admin"}}, 0))
	require.True(t, ok.OK, ok.Msg)
	ok = putUser(bob, ch, agent.Key)
	require.True(t, ok.OK, ok.Msg)

	members := alice.Req("members", map[string]any{"kinds": []int{39002}, "#d": []string{ch}})
	require.Len(t, members, 1)
	require.ElementsMatch(t, []string{alice.Key.PublicKeyHex(), bob.Key.PublicKeyHex(), hermit.Key.PublicKeyHex(), agent.Key.PublicKeyHex()},
		members[0].Tags.Values("p"))
}

// Threads, reactions and mentions written over the wire land in their side
// tables, and a reaction lives in its target's channel.
func TestThreadsReactionsAndMentionsOverWebSockets(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	r := relaytest.Start(t)
	alice := r.Dial(t, "")
	alice.Auth(nil)
	bob := r.Dial(t, "")
	bob.Auth(nil)
	ch := sidesChannel(t, alice)
	require.True(t, bob.Publish(bob.Sign(9021, "", nostr.Tags{{"h", ch}}, 0)).OK)

	msg := alice.Sign(9, "question", nostr.Tags{{"h", ch}}, 0)
	require.True(t, alice.Publish(msg).OK)
	reply := bob.Sign(9, "answer", nostr.Tags{{"h", ch}, {"e", msg.ID, "", "root"}, {"p", alice.Key.PublicKeyHex()}}, 0)
	require.True(t, bob.Publish(reply).OK)
	code := strings.Repeat("b", 64)
	react := alice.Sign(7, ":"+code+":", nostr.Tags{{"e", reply.ID}, {"p", bob.Key.PublicKeyHex()}, {"emoji", code, "https://x.example/b.png"}}, 0)
	ok := alice.Publish(react)
	require.True(t, ok.OK, ok.Msg)

	var depth, replies int
	require.NoError(t, r.Pool.QueryRow(ctx, `SELECT depth FROM thread_metadata WHERE encode(event_id, 'hex') = $1`, reply.ID).Scan(&depth))
	require.NoError(t, r.Pool.QueryRow(ctx, `SELECT reply_count FROM thread_metadata WHERE encode(event_id, 'hex') = $1`, msg.ID).Scan(&replies))
	require.Equal(t, 1, depth)
	require.Equal(t, 1, replies)
	var emoji, reactionChannel string
	require.NoError(t, r.Pool.QueryRow(ctx, `SELECT emoji, channel_id::text FROM reactions WHERE encode(event_id, 'hex') = $1`, reply.ID).Scan(&emoji, &reactionChannel))
	require.Equal(t, ":"+code+":", emoji)
	require.Equal(t, ch, reactionChannel)
	var mentioned []string
	rows, err := r.Pool.Query(ctx, `SELECT pubkey_hex || ':' || event_kind FROM event_mentions ORDER BY event_kind`)
	require.NoError(t, err)
	for rows.Next() {
		var s string
		require.NoError(t, rows.Scan(&s))
		mentioned = append(mentioned, s)
	}
	require.NoError(t, rows.Err())
	require.Equal(t, []string{bob.Key.PublicKeyHex() + ":7", alice.Key.PublicKeyHex() + ":9"}, mentioned)

	require.Equal(t, []string{react.ID}, ids(bob.Req("reaction", map[string]any{"ids": []string{react.ID}})))

	// A reaction in a private channel is as private as its target, whatever
	// h tag (here none) it carries.
	secret := uuid.NewString()
	require.True(t, alice.Publish(alice.Sign(9007, "", nostr.Tags{{"h", secret}, {"name", "secret"}, {"visibility", "private"}}, 0)).OK)
	hidden := alice.Sign(9, "members only", nostr.Tags{{"h", secret}}, 0)
	require.True(t, alice.Publish(hidden).OK)
	// A non-member's reaction is answered like one to an unknown id.
	requirePrefix(t, bob.Publish(bob.Sign(7, "+", nostr.Tags{{"e", hidden.ID}, {"h", ch}}, 0)), "invalid: reaction target event not found")
	private := alice.Sign(7, "🤫", nostr.Tags{{"e", hidden.ID}}, 0)
	require.True(t, alice.Publish(private).OK)
	require.Empty(t, bob.Req("private reaction", map[string]any{"ids": []string{private.ID}}))
	require.Equal(t, []string{private.ID}, ids(alice.Req("own reaction", map[string]any{"ids": []string{private.ID}})))

	// Deleting the reaction event removes the reaction.
	require.True(t, alice.Publish(alice.Sign(5, "", nostr.Tags{{"e", react.ID}}, 0)).OK)
	var removed bool
	require.NoError(t, r.Pool.QueryRow(ctx, `SELECT removed_at IS NOT NULL FROM reactions WHERE encode(event_id, 'hex') = $1`, reply.ID).Scan(&removed))
	require.True(t, removed)
}

// TestWorkspaceSidesBadInput sends the new kinds' bad inputs on one
// authenticated connection: each gets OK false with the right prefix and
// reason, nothing is stored, and the connection stays usable.
func TestWorkspaceSidesBadInput(t *testing.T) {
	t.Parallel()
	r := relaytest.Start(t)
	c := r.Dial(t, "")
	c.Auth(nil)
	ch := sidesChannel(t, c)
	other := sidesChannel(t, c)
	msg := c.Sign(9, "hello", nostr.Tags{{"h", ch}}, 0)
	require.True(t, c.Publish(msg).OK)
	elsewhere := c.Sign(9, "elsewhere", nostr.Tags{{"h", other}}, 0)
	require.True(t, c.Publish(elsewhere).OK)
	require.True(t, c.Publish(c.Sign(7, "+", nostr.Tags{{"e", msg.ID}}, 0)).OK)
	before := storedDigest(t, r)

	a := func(n int) string { return strings.Repeat("a", n) }
	mixed := "A" + a(63)
	unknown := fmt.Sprintf("%064x", 99)
	cases := []struct {
		name string
		ev   *nostr.Event
		want string // full message, or a prefix ending in ": "
	}{
		{"reaction to unknown target", c.Sign(7, "+", nostr.Tags{{"e", unknown}}, 0), "invalid: reaction target event not found"},
		{"reaction without target", c.Sign(7, "+", nostr.Tags{{"p", unknown}}, 0), "invalid: a reaction needs an e tag with the target event id"},
		{"65-char plain reaction", c.Sign(7, a(65), nostr.Tags{{"e", msg.ID}}, 0), "invalid: reaction emoji exceeds 64 characters (got 65)"},
		{"mixed-case long shortcode", c.Sign(7, ":"+mixed+":", nostr.Tags{{"e", msg.ID}, {"emoji", mixed, "https://x.example/m.png"}}, 0),
			"invalid: long custom emoji reaction shortcode must be canonical lowercase"},
		{"long shortcode with case-mismatched tag", c.Sign(7, ":"+a(64)+":", nostr.Tags{{"e", msg.ID}, {"emoji", strings.ToUpper(a(64))}}, 0),
			"invalid: reaction emoji exceeds 64 characters (got 66)"},
		{"65-char shortcode", c.Sign(7, ":"+a(65)+":", nostr.Tags{{"e", msg.ID}, {"emoji", a(65)}}, 0), "invalid: emoji shortcode exceeds 64 bytes (got 65)"},
		{"duplicate reaction", c.Sign(7, "", nostr.Tags{{"e", msg.ID}}, 0), "duplicate: reaction already exists"},
		{"emoji set with empty shortcode", c.Sign(30030, "", nostr.Tags{{"d", "buzz:custom-emoji"}, {"emoji", "", "https://x.example/e.png"}}, 0),
			"invalid: emoji shortcode must not be empty"},
		{"emoji set tag without shortcode", c.Sign(30030, "", nostr.Tags{{"d", "buzz:custom-emoji"}, {"emoji"}}, 0), "invalid: emoji tag must include a shortcode"},
		{"emoji list with 65-byte shortcode", c.Sign(10030, "", nostr.Tags{{"emoji", a(65), "https://x.example/l.png"}}, 0),
			"invalid: emoji shortcode exceeds 64 bytes (got 65)"},
		{"reply to unknown parent", c.Sign(9, "re", nostr.Tags{{"h", ch}, {"e", unknown, "", "reply"}}, 0), "invalid: reply parent not found"},
		{"reply to parent in another channel", c.Sign(9, "re", nostr.Tags{{"h", ch}, {"e", elsewhere.ID, "", "reply"}}, 0), "invalid: reply parent not found"},
		{"malformed channel_add_policy", c.Sign(0, `{"name":"x","channel_add_policy":"sometimes"}`, nil, 0),
			"invalid: channel_add_policy must be anyone, owner_only or nobody"},
	}
	for _, tc := range cases {
		ok := c.Publish(tc.ev)
		t.Logf("%-40s -> %v %q", tc.name, ok.OK, ok.Msg)
		require.False(t, ok.OK, tc.name)
		require.Equal(t, tc.want, ok.Msg, tc.name)
		// The connection is still usable and in step.
		c.Send("COUNT", "alive", map[string]any{"kinds": []int{9}})
		require.Equal(t, int64(2), c.Expect("COUNT").Count, "%s: connection must stay usable", tc.name)
	}
	require.Equal(t, before, storedDigest(t, r), "bad input must not change stored data")

	// Malformed profile JSON is not bad input: clients send all sorts.
	require.True(t, c.Publish(c.Sign(0, `{"name":`, nil, 0)).OK)
}
