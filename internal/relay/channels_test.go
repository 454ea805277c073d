package relay_test

import (
	"encoding/hex"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/buzzrelay/buzz/internal/nostr"
	"github.com/buzzrelay/buzz/internal/relaytest"
)

func createChannel(t *testing.T, c *relaytest.Client, name string, private bool) string {
	t.Helper()
	id := uuid.NewString()
	tags := nostr.Tags{{"h", id}, {"name", name}, {"about", "about " + name}}
	if private {
		tags = append(tags, nostr.Tag{"visibility", "private"})
	}
	ok := c.Publish(c.Sign(9007, "", tags, 0))
	require.True(t, ok.OK, ok.Msg)
	return id
}

func requireRejected(t *testing.T, ok relaytest.Reply, prefix string) {
	t.Helper()
	require.False(t, ok.OK, "expected a rejection, got OK true %q", ok.Msg)
	require.True(t, strings.HasPrefix(ok.Msg, prefix), "message %q lacks prefix %q", ok.Msg, prefix)
}

func tagValues(ev *nostr.Event, name string) []string { return ev.Tags.Values(name) }

func hasFlag(ev *nostr.Event, name string) bool {
	for _, tag := range ev.Tags {
		if len(tag) > 0 && tag[0] == name {
			return true
		}
	}
	return false
}

func TestChannelLifecycleAndDiscoveryEvents(t *testing.T) {
	t.Parallel()
	r := relaytest.Start(t)
	owner := r.Dial(t, "")
	owner.Auth(nil)
	member := r.Dial(t, "")
	member.Auth(nil)

	ch := createChannel(t, owner, "general", false)
	meta := owner.Req("meta", map[string]any{"kinds": []int{39000}, "#d": []string{ch}})
	require.Len(t, meta, 1)
	require.Equal(t, []string{"general"}, tagValues(meta[0], "name"))
	require.True(t, hasFlag(meta[0], "public"))
	require.NoError(t, meta[0].Verify())
	relayKey := meta[0].PubKey
	require.NotEqual(t, owner.Key.PublicKeyHex(), relayKey, "discovery events are signed by the relay")

	// Joining an open channel updates the members list; the relay's events
	// for one channel come from one key.
	require.True(t, member.Publish(member.Sign(9021, "", nostr.Tags{{"h", ch}}, 0)).OK)
	members := member.Req("members", map[string]any{"kinds": []int{39002}, "#d": []string{ch}})
	require.Len(t, members, 1, "only the newest members list is kept")
	require.Equal(t, relayKey, members[0].PubKey)
	require.ElementsMatch(t, []string{owner.Key.PublicKeyHex(), member.Key.PublicKeyHex()}, tagValues(members[0], "p"))
	admins := member.Req("admins", map[string]any{"kinds": []int{39001}, "#d": []string{ch}})
	require.Len(t, admins, 1)
	require.Equal(t, nostr.Tags{{"d", ch}, {"p", owner.Key.PublicKeyHex(), "owner"}}, admins[0].Tags)

	// Chat, live to a subscription pinned to the channel.
	owner.Send("REQ", "live", map[string]any{"kinds": []int{9}, "#h": []string{ch}, "limit": 0})
	owner.Expect("EOSE")
	msg := member.Sign(9, "hello", nostr.Tags{{"h", ch}}, 0)
	require.True(t, member.Publish(msg).OK)
	require.Equal(t, msg.ID, owner.Expect("EVENT").Event.ID)

	// Leaving updates the list again; the last owner cannot leave.
	require.True(t, member.Publish(member.Sign(9022, "", nostr.Tags{{"h", ch}}, 0)).OK)
	members = owner.Req("members2", map[string]any{"kinds": []int{39002}, "#d": []string{ch}})
	require.Equal(t, []string{owner.Key.PublicKeyHex()}, tagValues(members[0], "p"))
	requireRejected(t, owner.Publish(owner.Sign(9022, "", nostr.Tags{{"h", ch}}, 0)), "restricted: ")

	// Metadata edits by an admin only.
	requireRejected(t, member.Publish(member.Sign(9002, "", nostr.Tags{{"h", ch}, {"name", "hijacked"}}, 0)), "restricted: ")
	require.True(t, owner.Publish(owner.Sign(9002, "", nostr.Tags{{"h", ch}, {"name", "renamed"}}, 0)).OK)
	meta = owner.Req("meta2", map[string]any{"kinds": []int{39000}, "#d": []string{ch}})
	require.Equal(t, []string{"renamed"}, tagValues(meta[0], "name"))

	// Creating the same channel twice fails; clients cannot forge relay kinds.
	requireRejected(t, owner.Publish(owner.Sign(9007, "", nostr.Tags{{"h", ch}, {"name", "again"}}, 0)), "invalid: channel")
	for _, kind := range []int{39000, 39001, 39002, 44100, 44101} {
		requireRejected(t, owner.Publish(owner.Sign(kind, "", nostr.Tags{{"d", ch}}, 0)), "restricted: only the relay")
	}
}

func TestPrivateChannelAccessControl(t *testing.T) {
	t.Parallel()
	r := relaytest.Start(t)
	owner := r.Dial(t, "")
	owner.Auth(nil)
	outsider := r.Dial(t, "")
	outsider.Auth(nil)
	ch := createChannel(t, owner, "secret", true)
	secret := owner.Sign(9, "the secret", nostr.Tags{{"h", ch}}, 0)
	require.True(t, owner.Publish(secret).OK)

	// An outsider can neither read (pinned or not), write, nor join.
	outsider.Send("REQ", "pinned", map[string]any{"#h": []string{ch}})
	closed := outsider.Expect("CLOSED")
	require.Equal(t, "restricted: not a channel member", closed.Msg)
	require.Empty(t, outsider.Req("all", map[string]any{}), "unpinned history never includes unreadable channels")
	outsider.Send("COUNT", "c", map[string]any{"kinds": []int{9}})
	require.Zero(t, outsider.Expect("COUNT").Count)
	requireRejected(t, outsider.Publish(outsider.Sign(9, "let me in", nostr.Tags{{"h", ch}}, 0)), "restricted: ")
	requireRejected(t, outsider.Publish(outsider.Sign(9021, "", nostr.Tags{{"h", ch}}, 0)), "restricted: ")
	require.Empty(t, outsider.Req("meta", map[string]any{"kinds": []int{39000}}), "a private channel's discovery events are channel-scoped")

	// A global live subscription never receives channel events, even readable ones.
	owner.Send("REQ", "global", map[string]any{"kinds": []int{9}, "limit": 0})
	owner.Expect("EOSE")
	outsider.Send("REQ", "global", map[string]any{"kinds": []int{9}, "limit": 0})
	outsider.Expect("EOSE")

	// The owner adds the outsider: a p-gated notification, then access.
	require.True(t, owner.Publish(owner.Sign(9000, "", nostr.Tags{{"h", ch}, {"p", outsider.Key.PublicKeyHex()}}, 0)).OK)
	note := outsider.Req("note", map[string]any{"kinds": []int{44100}, "#p": []string{outsider.Key.PublicKeyHex()}})
	require.Len(t, note, 1)
	require.Equal(t, []string{ch}, tagValues(note[0], "h"))
	owner.Send("REQ", "others", map[string]any{"kinds": []int{44100}})
	require.True(t, strings.HasPrefix(owner.Expect("CLOSED").Msg, "restricted: "), "p-gated kinds need #p naming only the caller")
	require.Empty(t, owner.Req("implicit", map[string]any{"authors": []string{note[0].PubKey}, "kinds": []int{1, 44100, 9}, "#p": []string{owner.Key.PublicKeyHex()}}))

	got := outsider.Req("now", map[string]any{"kinds": []int{9}, "#h": []string{ch}})
	require.Equal(t, []string{secret.ID}, ids(got))
	outsider.Send("REQ", "pinned-live", map[string]any{"kinds": []int{9}, "#h": []string{ch}, "limit": 0})
	outsider.Expect("EOSE")
	hello := outsider.Sign(9, "thanks", nostr.Tags{{"h", ch}}, 0)
	outsider.Send("EVENT", hello)
	// Fan-out happens at commit, before the OK is queued.
	ev := outsider.Expect("EVENT")
	require.Equal(t, "pinned-live", ev.SubID, "only the pinned subscription receives it")
	require.Equal(t, hello.ID, ev.Event.ID)
	require.True(t, outsider.Expect("OK").OK)

	// Removed: live delivery stops at once, history closes again.
	require.True(t, owner.Publish(owner.Sign(9001, "", nostr.Tags{{"h", ch}, {"p", outsider.Key.PublicKeyHex()}}, 0)).OK)
	require.True(t, owner.Publish(owner.Sign(9, "after removal", nostr.Tags{{"h", ch}}, 0)).OK)
	outsider.Send("REQ", "pinned", map[string]any{"#h": []string{ch}})
	next := outsider.NextReply()
	for next.Verb == "EVENT" && next.Event.Kind == 44101 {
		next = outsider.NextReply()
	}
	require.Equal(t, "CLOSED", next.Verb, "got %+v: a removed member must not receive the channel", next)
	outsider.ExpectSilence(300*time.Millisecond, "nothing else arrives: the global subscription got no channel event")
}

func TestChannelModeration(t *testing.T) {
	t.Parallel()
	r := relaytest.Start(t)
	owner := r.Dial(t, "")
	owner.Auth(nil)
	admin := r.Dial(t, "")
	admin.Auth(nil)
	member := r.Dial(t, "")
	member.Auth(nil)
	ch := createChannel(t, owner, "mod", false)
	require.True(t, owner.Publish(owner.Sign(9000, "", nostr.Tags{{"h", ch}, {"p", admin.Key.PublicKeyHex(), "admin"}}, 0)).OK)
	require.True(t, member.Publish(member.Sign(9021, "", nostr.Tags{{"h", ch}}, 0)).OK)

	// Admins cannot make owners or remove other admins; members cannot moderate.
	requireRejected(t, admin.Publish(admin.Sign(9000, "", nostr.Tags{{"h", ch}, {"p", member.Key.PublicKeyHex(), "owner"}}, 0)), "restricted: ")
	requireRejected(t, member.Publish(member.Sign(9001, "", nostr.Tags{{"h", ch}, {"p", admin.Key.PublicKeyHex()}}, 0)), "restricted: ")
	requireRejected(t, admin.Publish(admin.Sign(9001, "", nostr.Tags{{"h", ch}, {"p", owner.Key.PublicKeyHex()}}, 0)), "restricted: ")

	// 9005: an admin hides a member's message; a member cannot hide the admin's.
	spam := member.Sign(9, "spam", nostr.Tags{{"h", ch}}, 0)
	require.True(t, member.Publish(spam).OK)
	requireRejected(t, member.Publish(member.Sign(9005, "", nostr.Tags{{"h", ch}, {"e", spam.ID}}, 0)), "restricted: ")
	require.True(t, admin.Publish(admin.Sign(9005, "", nostr.Tags{{"h", ch}, {"e", spam.ID}}, 0)).OK)
	require.Empty(t, owner.Req("gone", map[string]any{"ids": []string{spam.ID}}))

	// The sole owner cannot be demoted; another owner makes it possible.
	requireRejected(t, owner.Publish(owner.Sign(9000, "", nostr.Tags{{"h", ch}, {"p", owner.Key.PublicKeyHex(), "member"}}, 0)), "restricted: ")
	require.True(t, owner.Publish(owner.Sign(9000, "", nostr.Tags{{"h", ch}, {"p", admin.Key.PublicKeyHex(), "owner"}}, 0)).OK)
	require.True(t, owner.Publish(owner.Sign(9022, "", nostr.Tags{{"h", ch}}, 0)).OK)

	// 9008: only an owner deletes the channel; afterwards it is gone for everyone.
	requireRejected(t, member.Publish(member.Sign(9008, "", nostr.Tags{{"h", ch}}, 0)), "restricted: ")
	require.True(t, admin.Publish(admin.Sign(9008, "", nostr.Tags{{"h", ch}}, 0)).OK)
	requireRejected(t, member.Publish(member.Sign(9, "hello?", nostr.Tags{{"h", ch}}, 0)), "restricted: channel does not exist or is private to its members")
	member.Send("REQ", "dead", map[string]any{"#h": []string{ch}})
	require.Equal(t, "restricted: not a channel member", member.Expect("CLOSED").Msg)
}

func TestChannelBadInput(t *testing.T) {
	t.Parallel()
	r := relaytest.Start(t)
	c := r.Dial(t, "")
	c.Auth(nil)
	ch := createChannel(t, c, "bad", false)
	cases := []struct {
		name   string
		kind   int
		tags   nostr.Tags
		prefix string
	}{
		{"chat without h", 9, nil, "invalid: kind 9 needs an h tag"},
		{"h not a uuid", 9, nostr.Tags{{"h", "general"}}, "invalid: h tag must be a channel id"},
		{"uppercase uuid", 9, nostr.Tags{{"h", strings.ToUpper(ch)}}, "invalid: h tag must be a channel id"},
		{"unknown channel", 9, nostr.Tags{{"h", uuid.NewString()}}, "restricted: channel does not exist or is private to its members"},
		{"create without name", 9007, nostr.Tags{{"h", uuid.NewString()}}, "invalid: kind 9007 needs a name"},
		{"create bad visibility", 9007, nostr.Tags{{"h", uuid.NewString()}, {"name", "x"}, {"visibility", "secret"}}, "invalid: visibility"},
		{"put-user without p", 9000, nostr.Tags{{"h", ch}}, "invalid: kind 9000 needs a p tag"},
		{"put-user bad role", 9000, nostr.Tags{{"h", ch}, {"p", strings.Repeat("a", 64), "emperor"}}, "invalid: role"},
		{"remove non-member", 9001, nostr.Tags{{"h", ch}, {"p", strings.Repeat("a", 64)}}, "invalid: that user is not a member"},
		{"delete-event without e", 9005, nostr.Tags{{"h", ch}}, "invalid: kind 9005 needs e tags"},
		{"leave when not member", 9022, nostr.Tags{{"h", uuid.NewString()}}, "restricted: channel does not exist or is private to its members"},
		{"empty new name", 9002, nostr.Tags{{"h", ch}, {"name", ""}}, "invalid: name"},
	}
	for _, tc := range cases {
		requireRejected(t, c.Publish(c.Sign(tc.kind, "", tc.tags, 0)), tc.prefix)
		c.Send("COUNT", "alive", map[string]any{"kinds": []int{9007}})
		require.Equal(t, int64(1), c.Expect("COUNT").Count, "%s: connection usable, nothing stored", tc.name)
	}
}

// Every h tag must name the channel the event was authorized for: an
// outsider cannot slip events into a private channel's view with a second h
// tag or an h tag on a kind that binds no channel. And an admin cannot
// demote an owner. (Both found in review; these tests failed before.)
func TestChannelTagsCannotForgeMembershipAndAdminsCannotDemoteOwners(t *testing.T) {
	t.Parallel()
	r := relaytest.Start(t)
	owner := r.Dial(t, "")
	owner.Auth(nil)
	outsider := r.Dial(t, "")
	outsider.Auth(nil)
	open := createChannel(t, owner, "open", false)
	private := createChannel(t, owner, "private", true)

	requireRejected(t, outsider.Publish(outsider.Sign(9, "sneak", nostr.Tags{{"h", open}, {"h", private}}, 0)), "invalid: every h tag must name")
	requireRejected(t, outsider.Publish(outsider.Sign(0, `{"name":"x"}`, nostr.Tags{{"h", private}}, 0)), "restricted: channel does not exist or is private to its members")
	requireRejected(t, outsider.Publish(outsider.Sign(5, "", nostr.Tags{{"e", strings.Repeat("a", 64)}, {"h", private}}, 0)), "restricted: channel does not exist or is private to its members")
	requireRejected(t, outsider.Publish(outsider.Sign(20002, "", nostr.Tags{{"h", open}, {"h", private}}, 0)), "invalid: every h tag must name")
	require.Len(t, owner.Req("private", map[string]any{"#h": []string{private}}), 1, "only the owner's 9007 is in the private channel")

	second := r.Dial(t, "")
	second.Auth(nil)
	admin := r.Dial(t, "")
	admin.Auth(nil)
	require.True(t, owner.Publish(owner.Sign(9000, "", nostr.Tags{{"h", open}, {"p", second.Key.PublicKeyHex(), "owner"}}, 0)).OK)
	require.True(t, owner.Publish(owner.Sign(9000, "", nostr.Tags{{"h", open}, {"p", admin.Key.PublicKeyHex(), "admin"}}, 0)).OK)
	requireRejected(t, admin.Publish(admin.Sign(9000, "", nostr.Tags{{"h", open}, {"p", second.Key.PublicKeyHex(), "guest"}}, 0)), "restricted: only channel owners")
	requireRejected(t, admin.Publish(admin.Sign(9000, "", nostr.Tags{{"h", open}, {"p", admin.Key.PublicKeyHex(), "guest"}}, 0)), "restricted: only channel owners")
	admins := owner.Req("admins", map[string]any{"kinds": []int{39001}, "#d": []string{open}})
	require.Len(t, admins, 1)
	require.Len(t, admins[0].Tags.Values("p"), 3, "both owners and the admin keep their roles")
}

// A put-user or remove-user acts on the first p tag only, and its event is
// the channel's lasting account of the act (no 9005 hides it). An admin
// must not store a 9000 whose extra p tags or roles claim grants that never
// happened: one here named the admin owner, which the relay never applied
// and no owner could hide. Mutation killed: validateTargetUser without the
// one-p-tag check, and validatePutUser without the one-role check (both
// events are stored).
func TestModerationEventsNameOneUserAndOneRole(t *testing.T) {
	t.Parallel()
	r := relaytest.Start(t)
	owner := r.Dial(t, "")
	owner.Auth(nil)
	admin := r.Dial(t, "")
	admin.Auth(nil)
	member := relaytest.NewKey(t).PublicKeyHex()
	ch := createChannel(t, owner, "room", true)
	require.True(t, owner.Publish(owner.Sign(9000, "", nostr.Tags{{"h", ch}, {"p", admin.Key.PublicKeyHex(), "admin"}}, 0)).OK)

	requireRejected(t, admin.Publish(admin.Sign(9000, "", nostr.Tags{{"h", ch}, {"p", member}, {"p", admin.Key.PublicKeyHex(), "owner"}}, 0)),
		"invalid: kind 9000 names one user")
	requireRejected(t, admin.Publish(admin.Sign(9000, "", nostr.Tags{{"h", ch}, {"p", member, "member", "owner"}}, 0)),
		"invalid: kind 9000 gives one role")
	requireRejected(t, admin.Publish(admin.Sign(9001, "", nostr.Tags{{"h", ch}, {"p", member}, {"p", owner.Key.PublicKeyHex()}}, 0)),
		"invalid: kind 9001 names one user")
	require.True(t, admin.Publish(admin.Sign(9000, "", nostr.Tags{{"h", ch}, {"p", member, "member"}}, 0)).OK)
	require.Len(t, owner.Req("acts", map[string]any{"kinds": []int{9000, 9001}, "#h": []string{ch}}), 2,
		"only the owner's grant and the admin's one-user, one-role put-user are stored")
}

// A channel's relay-signed lists (39000-39002) carry the channel in their d
// tag, not an h tag, and NIP-29 clients follow them with #d. They are stored
// in the channel, so live delivery must count a #d naming the channel as a
// pin for them (read permission is still the hub's), or no live subscriber
// ever sees a membership change.
func TestChannelDiscoveryEventsReachLiveSubscribersPinnedByD(t *testing.T) {
	t.Parallel()
	r := relaytest.Start(t)
	owner := r.Dial(t, "")
	owner.Auth(nil)
	outsider := r.Dial(t, "")
	outsider.Auth(nil)
	newcomer := relaytest.NewKey(t)

	ch := createChannel(t, owner, "secret", true)
	watcher := r.Dial(t, "")
	watcher.Auth(owner.Key)
	lists := map[string]any{"kinds": []int{39000, 39001, 39002}, "#d": []string{ch}, "limit": 0}
	watcher.Send("REQ", "lists", lists)
	watcher.Expect("EOSE")
	outsider.Send("REQ", "lists", lists)
	outsider.Expect("EOSE")

	add := owner.Sign(9000, "", nostr.Tags{{"h", ch}, {"p", newcomer.PublicKeyHex(), "member"}}, 0)
	require.True(t, owner.Publish(add).OK)
	seen := map[int]*nostr.Event{}
	for len(seen) < 2 {
		ev := watcher.Expect("EVENT").Event
		seen[ev.Kind] = ev
	}
	require.Contains(t, seen, 39001)
	require.Contains(t, seen, 39002)
	require.ElementsMatch(t, []string{owner.Key.PublicKeyHex(), newcomer.PublicKeyHex()}, tagValues(seen[39002], "p"))

	// Only the lists: any other channel event still needs an #h pin, even
	// one whose d tag happens to name the channel.
	watcher.Send("REQ", "by-d", map[string]any{"#d": []string{ch}, "limit": 0})
	watcher.Expect("EOSE")
	require.True(t, owner.Publish(owner.Sign(30078, "app data", nostr.Tags{{"d", ch}, {"h", ch}}, 0)).OK)
	watcher.ExpectSilence(500*time.Millisecond, "a channel event reached a subscription not pinned with #h")
	outsider.ExpectSilence(500*time.Millisecond, "a private channel's lists reached a non-member")
}

// NIP-29 clients mark a private channel with a bare ["private"] tag, as the
// relay's own 39000 does; a reader of only ["visibility", "private"] created
// such a channel open, readable by everyone, and answered OK to a 9002 that
// asked to close one without closing it. Conflicting flags are refused.
// Mutations killed: Tags.Has matching only tags with a value (like First)
// lets the outsider read the first channel; dropping the conflict check
// creates the first conflicting channel.
func TestBareNIP29PrivateFlagMakesAChannelPrivate(t *testing.T) {
	t.Parallel()
	r := relaytest.Start(t)
	owner := r.Dial(t, "")
	owner.Auth(nil)
	outsider := r.Dial(t, "")
	outsider.Auth(nil)
	requireUnreadable := func(ch, secretID string) {
		t.Helper()
		require.Empty(t, outsider.Req("any", map[string]any{"kinds": []int{9}}), "an outsider reads no message of a private channel")
		outsider.Send("REQ", "pinned", map[string]any{"kinds": []int{9}, "#h": []string{ch}})
		require.Equal(t, "restricted: not a channel member", outsider.Expect("CLOSED").Msg)
		require.Len(t, owner.Req("own", map[string]any{"ids": []string{secretID}}), 1, "members still read it")
		meta := owner.Req("meta", map[string]any{"kinds": []int{39000}, "#d": []string{ch}})
		require.Len(t, meta, 1)
		require.True(t, hasFlag(meta[0], "private"))
		require.False(t, hasFlag(meta[0], "public"))
	}

	created := uuid.NewString()
	ok := owner.Publish(owner.Sign(9007, "", nostr.Tags{{"h", created}, {"name", "secret"}, {"private"}, {"closed"}}, 0))
	require.True(t, ok.OK, ok.Msg)
	secret := owner.Sign(9, "the secret", nostr.Tags{{"h", created}}, 0)
	require.True(t, owner.Publish(secret).OK)
	requireUnreadable(created, secret.ID)

	// A 9002 with a bare ["private"] closes an open channel.
	edited := createChannel(t, owner, "soon private", false)
	later := owner.Sign(9, "said before closing", nostr.Tags{{"h", edited}}, 0)
	require.True(t, owner.Publish(later).OK)
	require.Len(t, outsider.Req("open", map[string]any{"kinds": []int{9}, "#h": []string{edited}}), 1, "open until the edit")
	ok = owner.Publish(owner.Sign(9002, "", nostr.Tags{{"h", edited}, {"private"}, {"closed"}}, 0))
	require.True(t, ok.OK, ok.Msg)
	requireUnreadable(edited, later.ID)

	// Both at once is refused, the channel left as it was.
	open := createChannel(t, owner, "open", false)
	for _, tags := range []nostr.Tags{
		{{"private"}, {"public"}},
		{{"visibility", "open"}, {"private"}},
		{{"visibility", "private"}, {"visibility", "open"}},
	} {
		requireRejected(t, owner.Publish(owner.Sign(9007, "", append(nostr.Tags{{"h", uuid.NewString()}, {"name", "x"}}, tags...), 0)), "invalid: conflicting visibility")
		requireRejected(t, owner.Publish(owner.Sign(9002, "", append(nostr.Tags{{"h", open}}, tags...), 0)), "invalid: conflicting visibility")
	}
	meta := outsider.Req("open-meta", map[string]any{"kinds": []int{39000}, "#d": []string{open}})
	require.Len(t, meta, 1)
	require.True(t, hasFlag(meta[0], "public"))
}

// Opening a private channel shows its whole history to the community, so
// only an owner may change visibility, either way; an admin still edits the
// rest and may restate the current visibility.
// Mutation killed: without the owner check the admin's 9002 that opens the
// private channel is accepted.
func TestOnlyOwnersChangeChannelVisibility(t *testing.T) {
	t.Parallel()
	r := relaytest.Start(t)
	owner := r.Dial(t, "")
	owner.Auth(nil)
	admin := r.Dial(t, "")
	admin.Auth(nil)
	outsider := r.Dial(t, "")
	outsider.Auth(nil)
	private := createChannel(t, owner, "secret", true)
	open := createChannel(t, owner, "open", false)
	for _, ch := range []string{private, open} {
		require.True(t, owner.Publish(owner.Sign(9000, "", nostr.Tags{{"h", ch}, {"p", admin.Key.PublicKeyHex(), "admin"}}, 0)).OK)
	}
	secret := owner.Sign(9, "the secret", nostr.Tags{{"h", private}}, 0)
	require.True(t, owner.Publish(secret).OK)

	for _, flags := range []nostr.Tags{{{"public"}}, {{"visibility", "open"}}} {
		ok := admin.Publish(admin.Sign(9002, "", append(nostr.Tags{{"h", private}, {"name", "opened"}}, flags...), 0))
		requireRejected(t, ok, "restricted: only channel owners may change a channel between private and open")
	}
	requireRejected(t, admin.Publish(admin.Sign(9002, "", nostr.Tags{{"h", open}, {"private"}}, 0)), "restricted: only channel owners")
	require.Empty(t, outsider.Req("secret", map[string]any{"ids": []string{secret.ID}}), "still private")
	require.Len(t, outsider.Req("open", map[string]any{"kinds": []int{39000}, "#d": []string{open}}), 1, "still open")

	// Other edits, and restating the current visibility, stay the admins'.
	ok := admin.Publish(admin.Sign(9002, "", nostr.Tags{{"h", private}, {"name", "renamed"}, {"private"}, {"closed"}}, 0))
	require.True(t, ok.OK, ok.Msg)
	meta := admin.Req("meta", map[string]any{"kinds": []int{39000}, "#d": []string{private}})
	require.Equal(t, []string{"renamed"}, tagValues(meta[0], "name"))
	require.True(t, hasFlag(meta[0], "private"))

	// The owner opens it.
	require.True(t, owner.Publish(owner.Sign(9002, "", nostr.Tags{{"h", private}, {"public"}}, 0)).OK)
	require.Equal(t, []string{secret.ID}, ids(outsider.Req("opened", map[string]any{"ids": []string{secret.ID}})))
}

// A 9005 hides members' events, never the channel's lists nor the
// moderation records (9000-9002, 9005, 9007, 9008): an admin could otherwise erase the
// channel's account of membership and the owners' acts. A request naming
// one is refused whole, whoever sends it.
// Mutation killed: without the EventsInChannelKeptFromModeration refusal the
// admin's 9005 naming the members list is accepted.
func TestModerationDeleteKeepsRelayListsAndModerationRecords(t *testing.T) {
	t.Parallel()
	r := relaytest.Start(t)
	owner := r.Dial(t, "")
	owner.Auth(nil)
	admin := r.Dial(t, "")
	admin.Auth(nil)
	member := r.Dial(t, "")
	member.Auth(nil)
	ch := createChannel(t, owner, "mod", true)
	grant := owner.Sign(9000, "", nostr.Tags{{"h", ch}, {"p", admin.Key.PublicKeyHex(), "admin"}}, 0)
	require.True(t, owner.Publish(grant).OK)
	require.True(t, owner.Publish(owner.Sign(9000, "", nostr.Tags{{"h", ch}, {"p", member.Key.PublicKeyHex()}}, 0)).OK)
	edit := owner.Sign(9002, "", nostr.Tags{{"h", ch}, {"about", "rules"}}, 0)
	require.True(t, owner.Publish(edit).OK)
	lists := admin.Req("lists", map[string]any{"kinds": []int{39000, 39001, 39002}, "#d": []string{ch}})
	require.Len(t, lists, 3)
	spam := member.Sign(9, "spam", nostr.Tags{{"h", ch}}, 0)
	require.True(t, member.Publish(spam).OK)

	kept := []string{grant.ID, edit.ID}
	for _, ev := range lists {
		kept = append(kept, ev.ID)
	}
	for _, id := range kept {
		for _, mod := range []*relaytest.Client{admin, owner} {
			requireRejected(t, mod.Publish(mod.Sign(9005, "", nostr.Tags{{"h", ch}, {"e", id}}, 0)),
				"restricted: kind 9005 cannot hide the channel's lists (39000-39002) or moderation events")
		}
	}
	requireRejected(t, admin.Publish(admin.Sign(9005, "", nostr.Tags{{"h", ch}, {"e", spam.ID}, {"e", lists[0].ID}}, 0)), "restricted: kind 9005")
	require.ElementsMatch(t, append(kept, spam.ID), ids(member.Req("all", map[string]any{"ids": append(kept, spam.ID)})), "nothing was hidden")

	require.True(t, admin.Publish(admin.Sign(9005, "", nostr.Tags{{"h", ch}, {"e", spam.ID}}, 0)).OK)
	require.Empty(t, member.Req("spam", map[string]any{"ids": []string{spam.ID}}))

	// A kind in 9000-9009 any member may store (no moderation meaning here)
	// is no record: it stays hideable, or it would be spam no one can hide.
	// Mutation killed: protecting all of 9000-9009 refuses this 9005.
	invite := member.Sign(9009, "buy now", nostr.Tags{{"h", ch}}, 0)
	require.True(t, member.Publish(invite).OK)
	require.True(t, admin.Publish(admin.Sign(9005, "", nostr.Tags{{"h", ch}, {"e", invite.ID}}, 0)).OK)
	require.Empty(t, member.Req("invite", map[string]any{"ids": []string{invite.ID}}))
}

// A member removed from a private channel may still delete what they wrote
// there, but not go on posting through deletions: the deletion is stored in
// the channel for its members, so it must hide a live event of theirs and
// carry nothing but its targets. A member who may write is unaffected.
// Mutations killed: without checkDeletionByFormerWriter the removed member's
// deletion with content is accepted; without its live-target rule the
// second deletion of the same, already deleted, message is; accepting any
// canonical a tag lets a made-up coordinate carry text, any hex e tag a
// made-up id, any k tag a made-up kind.
func TestRemovedMemberDeletesOnlyLiveEventsWithoutContent(t *testing.T) {
	t.Parallel()
	r := relaytest.Start(t)
	owner := r.Dial(t, "")
	owner.Auth(nil)
	member := r.Dial(t, "")
	member.Auth(nil)
	ch := createChannel(t, owner, "secret", true)
	require.True(t, owner.Publish(owner.Sign(9000, "", nostr.Tags{{"h", ch}, {"p", member.Key.PublicKeyHex()}}, 0)).OK)
	first := member.Sign(9, "first", nostr.Tags{{"h", ch}}, 0)
	require.True(t, member.Publish(first).OK)
	second := member.Sign(9, "second", nostr.Tags{{"h", ch}}, 0)
	require.True(t, member.Publish(second).OK)
	require.True(t, member.Publish(member.Sign(30030, "", nostr.Tags{{"d", "s"}, {"h", ch}}, 0)).OK)
	emojiSet := "30030:" + member.Key.PublicKeyHex() + ":s"
	require.True(t, owner.Publish(owner.Sign(9001, "", nostr.Tags{{"h", ch}, {"p", member.Key.PublicKeyHex()}}, 0)).OK)
	deletionsBy := func(c *relaytest.Client) []*nostr.Event {
		t.Helper()
		return owner.Req("deletions", map[string]any{"kinds": []int{5}, "authors": []string{c.Key.PublicKeyHex()}})
	}

	requireRejected(t, member.Publish(member.Sign(5, "still here, read me", nostr.Tags{{"e", first.ID}}, 0)),
		"restricted: you can no longer write in this channel, so a deletion there must have empty content")
	requireRejected(t, member.Publish(member.Sign(5, "", nostr.Tags{{"e", first.ID}, {"alt", "read me"}}, 0)),
		"restricted: you can no longer write in this channel, so a deletion there may carry only e, a and k tags")
	requireRejected(t, member.Publish(member.Sign(5, "", nostr.Tags{{"e", first.ID, "read me"}}, 0)),
		"restricted: you can no longer write in this channel, so a deletion there may carry only e, a and k tags")
	requireRejected(t, member.Publish(member.Sign(5, "", nostr.Tags{{"e", first.ID}, {"a", "30023:" + member.Key.PublicKeyHex() + ":read me"}}, 0)),
		"restricted: you can no longer write in this channel, so a deletion there may carry only e, a and k tags")
	madeUp := hex.EncodeToString([]byte("read me, read me, read me, 32 by")) // 64 hex digits
	requireRejected(t, member.Publish(member.Sign(5, "", nostr.Tags{{"e", first.ID}, {"e", madeUp}}, 0)),
		"restricted: you can no longer write in this channel, so a deletion there may carry only e, a and k tags")
	requireRejected(t, member.Publish(member.Sign(5, "", nostr.Tags{{"e", first.ID}, {"k", "30023"}}, 0)),
		"restricted: you can no longer write in this channel, so a deletion there may carry only e, a and k tags")
	require.Empty(t, deletionsBy(member))
	require.Len(t, owner.Req("first", map[string]any{"ids": []string{first.ID}}), 1, "nothing was deleted")

	deletion := member.Sign(5, "", nostr.Tags{{"e", first.ID}, {"k", "9"}}, 0)
	ok := member.Publish(deletion)
	require.True(t, ok.OK, ok.Msg)
	require.Empty(t, owner.Req("first", map[string]any{"ids": []string{first.ID}}))
	require.Equal(t, []string{deletion.ID}, ids(deletionsBy(member)), "stored where its target was, for the members")

	// The same, now deleted, message again: nothing left to hide.
	requireRejected(t, member.Publish(member.Sign(5, "", nostr.Tags{{"e", first.ID}}, 0)),
		"restricted: you can no longer write in this channel, so a deletion there must name an event of yours that is not yet deleted")
	require.Equal(t, []string{deletion.ID}, ids(deletionsBy(member)), "the refused deletion is not stored")
	ok = member.Publish(member.Sign(5, "", nostr.Tags{{"e", first.ID}, {"e", second.ID}}, 0))
	require.True(t, ok.OK, "one live target is enough: %s", ok.Msg)
	require.Empty(t, owner.Req("second", map[string]any{"ids": []string{second.ID}}))

	// By coordinate alike: a slot with a live version, once.
	ok = member.Publish(member.Sign(5, "", nostr.Tags{{"a", emojiSet}}, 0))
	require.True(t, ok.OK, ok.Msg)
	require.Empty(t, owner.Req("set", map[string]any{"kinds": []int{30030}, "authors": []string{member.Key.PublicKeyHex()}}))
	requireRejected(t, member.Publish(member.Sign(5, "", nostr.Tags{{"a", emojiSet}, {"k", "30030"}}, 0)),
		"restricted: you can no longer write in this channel, so a deletion there must name an event of yours that is not yet deleted")

	// The owner, who may write, deletes with a reason, even what is gone.
	own := owner.Sign(9, "typo", nostr.Tags{{"h", ch}}, 0)
	require.True(t, owner.Publish(own).OK)
	for _, reason := range []string{"typo", "typo, again"} {
		ok = owner.Publish(owner.Sign(5, reason, nostr.Tags{{"e", own.ID}}, 0))
		require.True(t, ok.OK, ok.Msg)
	}
	require.Len(t, deletionsBy(owner), 2)
}
