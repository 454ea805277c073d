package relay_test

import (
	"context"
	"encoding/hex"
	"fmt"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/buzzrelay/buzz/internal/db"
	"github.com/buzzrelay/buzz/internal/ingest"
	"github.com/buzzrelay/buzz/internal/nostr"
	"github.com/buzzrelay/buzz/internal/relaytest"
)

// The moderation events of a channel are its account of who did what; no
// 9005 hides them, and neither does their author's own kind 5: an admin who
// removed a member must not be able to hide that they did. A request naming
// one is refused whole and hides nothing, and the connection goes on.
// Mutations killed: without the check in prepareDeletion the admin's kind 5
// of its 9001 is accepted; without the kept kinds in EventsDeleteByIDs the
// statement hides the 9001 and the 9002.
func TestAuthorsCannotHideTheirModerationEventsWithKind5(t *testing.T) {
	t.Parallel()
	r := relaytest.Start(t)
	owner := r.Dial(t, "")
	owner.Auth(nil)
	admin := r.Dial(t, "")
	admin.Auth(nil)
	member := r.Dial(t, "")
	member.Auth(nil)
	ch := createChannel(t, owner, "audit", true)
	grant := owner.Sign(9000, "", nostr.Tags{{"h", ch}, {"p", admin.Key.PublicKeyHex(), "admin"}}, 0)
	require.True(t, owner.Publish(grant).OK)
	require.True(t, admin.Publish(admin.Sign(9000, "", nostr.Tags{{"h", ch}, {"p", member.Key.PublicKeyHex()}}, 0)).OK)
	edit := admin.Sign(9002, "", nostr.Tags{{"h", ch}, {"about", "quiet"}}, 0)
	require.True(t, admin.Publish(edit).OK)
	removal := admin.Sign(9001, "", nostr.Tags{{"h", ch}, {"p", member.Key.PublicKeyHex()}}, 0)
	require.True(t, admin.Publish(removal).OK)
	chat := admin.Sign(9, "hello", nostr.Tags{{"h", ch}}, 0)
	require.True(t, admin.Publish(chat).OK)
	create := owner.Req("create", map[string]any{"kinds": []int{9007}, "#h": []string{ch}})
	require.Len(t, create, 1)

	const refusal = "restricted: a deletion cannot hide the channel's moderation events"
	requireRejected(t, admin.Publish(admin.Sign(5, "", nostr.Tags{{"e", removal.ID}}, 0)), refusal)
	requireRejected(t, admin.Publish(admin.Sign(5, "", nostr.Tags{{"e", removal.ID}, {"h", ch}}, 0)), refusal)
	requireRejected(t, admin.Publish(admin.Sign(5, "", nostr.Tags{{"e", edit.ID}, {"e", chat.ID}, {"h", ch}}, 0)), refusal)
	requireRejected(t, owner.Publish(owner.Sign(5, "", nostr.Tags{{"e", grant.ID}}, 0)), refusal)
	requireRejected(t, owner.Publish(owner.Sign(5, "", nostr.Tags{{"e", create[0].ID}}, 0)), refusal)

	// The statement that hides an author's events leaves them out too,
	// whatever path calls it.
	hidden, err := db.New(r.Pool).EventsDeleteByIDs(context.Background(), db.EventsDeleteByIDsParams{
		CommunityID: r.CommunityID, Ids: [][]byte{mustHex(t, removal.ID), mustHex(t, edit.ID)},
		Author: mustHex(t, admin.Key.PublicKeyHex()), KeptKinds: ingest.KindsKeptFromModeration,
	})
	require.NoError(t, err)
	require.Zero(t, hidden)
	hidden, err = db.New(r.Pool).EventsDeleteByIDs(context.Background(), db.EventsDeleteByIDsParams{
		CommunityID: r.CommunityID, Ids: [][]byte{mustHex(t, removal.ID)}, Author: mustHex(t, admin.Key.PublicKeyHex()),
	})
	require.NoError(t, err)
	require.Zero(t, hidden, "without the list of kinds kept, no channel event is hidden")

	kept := []string{grant.ID, edit.ID, removal.ID, chat.ID, create[0].ID}
	require.ElementsMatch(t, kept, ids(owner.Req("kept", map[string]any{"ids": kept})), "nothing was hidden")

	// The connection goes on, and the admin's own message is still theirs to delete.
	require.True(t, admin.Publish(admin.Sign(5, "", nostr.Tags{{"e", chat.ID}, {"h", ch}}, 0)).OK)
	require.Empty(t, owner.Req("chat", map[string]any{"ids": []string{chat.ID}}))
}

// NIP-29 clients read a channel's roles list (39003) beside its other lists,
// by the channel's d tag; the relay writes none, so one a client stored
// would stand among the relay's lists as if it were the relay's. Every
// client's is refused, member or outsider, with or without an h tag.
// Mutation killed: without 39003 in RelayOnlyKinds all three are stored and
// served to a REQ for the channel's lists.
func TestClientsCannotPublishAChannelRolesList(t *testing.T) {
	t.Parallel()
	r := relaytest.Start(t)
	owner := r.Dial(t, "")
	owner.Auth(nil)
	outsider := r.Dial(t, "")
	outsider.Auth(nil)
	ch := createChannel(t, owner, "roles", true)
	const refusal = "restricted: only the relay publishes kind 39003"
	requireRejected(t, owner.Publish(owner.Sign(39003, "", nostr.Tags{{"d", ch}, {"h", ch}, {"role", "admin"}}, 0)), refusal)
	requireRejected(t, owner.Publish(owner.Sign(39003, "", nostr.Tags{{"d", ch}, {"role", "admin"}}, 0)), refusal)
	requireRejected(t, outsider.Publish(outsider.Sign(39003, "", nostr.Tags{{"d", ch}, {"role", "owner"}}, 0)), refusal)
	for _, c := range []*relaytest.Client{owner, outsider} {
		lists := c.Req("lists", map[string]any{"kinds": []int{39000, 39001, 39002, 39003}, "#d": []string{ch}})
		for _, ev := range lists {
			require.NotEqual(t, 39003, ev.Kind)
			require.NotEqual(t, c.Key.PublicKeyHex(), ev.PubKey)
		}
	}
	require.True(t, outsider.Publish(outsider.Sign(1, "still here", nil, 0)).OK, "the connection goes on")
}

// Owners and admins changing one member at once, each from its own
// connection, in parallel for real: an add racing a removal, and two role
// changes, and two renames dated alike. After every round the relay's
// lists match the tables.
func TestRacingModerationLeavesTheListsMatchingTheTable(t *testing.T) {
	t.Parallel()
	r := relaytest.Start(t)
	owner := r.Dial(t, "")
	owner.Auth(nil)
	coOwner := r.Dial(t, "")
	coOwner.Auth(nil)
	admin := r.Dial(t, "")
	admin.Auth(nil)
	target := relaytest.NewKey(t).PublicKeyHex()
	ch := createChannel(t, owner, "race", true)
	require.True(t, owner.Publish(owner.Sign(9000, "", nostr.Tags{{"h", ch}, {"p", coOwner.Key.PublicKeyHex(), "owner"}}, 0)).OK)
	require.True(t, owner.Publish(owner.Sign(9000, "", nostr.Tags{{"h", ch}, {"p", admin.Key.PublicKeyHex(), "admin"}}, 0)).OK)

	race := func(a, b *relaytest.Client, evA, evB *nostr.Event) [2]relaytest.Reply {
		var replies [2]relaytest.Reply
		var wg sync.WaitGroup
		for i, pair := range []struct {
			c  *relaytest.Client
			ev *nostr.Event
		}{{a, evA}, {b, evB}} {
			wg.Add(1)
			go func() { defer wg.Done(); replies[i] = pair.c.Publish(pair.ev) }()
		}
		wg.Wait()
		return replies
	}
	outcomes := map[string]int{}
	for round := range 12 {
		// An add (admin) racing a removal (owner) of the same member.
		add := admin.Sign(9000, fmt.Sprint(round), nostr.Tags{{"h", ch}, {"p", target}}, 0)
		rm := owner.Sign(9001, fmt.Sprint(round), nostr.Tags{{"h", ch}, {"p", target}}, 0)
		replies := race(admin, owner, add, rm)
		require.True(t, replies[0].OK, replies[0].Msg)
		outcomes[fmt.Sprintf("add ok, remove ok=%v", replies[1].OK)]++
		requireListsMatchTable(t, r, owner, ch)
		// Two owners giving the member different roles at once.
		up := owner.Sign(9000, fmt.Sprint(round), nostr.Tags{{"h", ch}, {"p", target, "admin"}}, 0)
		down := coOwner.Sign(9000, fmt.Sprint(round), nostr.Tags{{"h", ch}, {"p", target, "guest"}}, 0)
		replies = race(owner, coOwner, up, down)
		require.True(t, replies[0].OK, replies[0].Msg)
		require.True(t, replies[1].OK, replies[1].Msg)
		requireListsMatchTable(t, r, owner, ch)
		// Two renames at once, dated alike: the one metadata event served
		// names what the table holds.
		now := time.Now().Unix()
		renameA := owner.Sign(9002, "", nostr.Tags{{"h", ch}, {"name", fmt.Sprint("owner ", round)}}, now)
		renameB := admin.Sign(9002, "", nostr.Tags{{"h", ch}, {"name", fmt.Sprint("admin ", round)}}, now)
		replies = race(owner, admin, renameA, renameB)
		require.True(t, replies[0].OK, replies[0].Msg)
		require.True(t, replies[1].OK, replies[1].Msg)
		var name string
		require.NoError(t, r.Pool.QueryRow(context.Background(),
			`SELECT name FROM channels WHERE community_id = $1 AND id = $2::uuid`, r.CommunityID, ch).Scan(&name))
		meta := owner.Req("meta", map[string]any{"kinds": []int{39000}, "#d": []string{ch}})
		require.Len(t, meta, 1)
		require.Equal(t, []string{name}, tagValues(meta[0], "name"))
	}
	t.Log(outcomes)
}

func requireListsMatchTable(t *testing.T, r *relaytest.Relay, reader *relaytest.Client, ch string) {
	t.Helper()
	rows, err := r.Pool.Query(context.Background(),
		`SELECT pubkey, role::text FROM channel_members WHERE community_id = $1 AND channel_id = $2::uuid AND removed_at IS NULL`,
		r.CommunityID, ch)
	require.NoError(t, err)
	var members, admins []string
	for rows.Next() {
		var pk []byte
		var role string
		require.NoError(t, rows.Scan(&pk, &role))
		members = append(members, hex.EncodeToString(pk))
		if role == "owner" || role == "admin" {
			admins = append(admins, hex.EncodeToString(pk)+":"+role)
		}
	}
	require.NoError(t, rows.Err())
	lists := reader.Req("lists", map[string]any{"kinds": []int{39001, 39002}, "#d": []string{ch}})
	require.Len(t, lists, 2)
	for _, ev := range lists {
		var got []string
		for _, tag := range ev.Tags {
			if tag[0] != "p" {
				continue
			}
			if ev.Kind == 39001 {
				got = append(got, tag[1]+":"+tag[2])
			} else {
				got = append(got, tag[1])
			}
		}
		want := members
		if ev.Kind == 39001 {
			want = admins
		}
		sort.Strings(got)
		sort.Strings(want)
		require.Equal(t, want, got, "kind %d", ev.Kind)
	}
}

func mustHex(t *testing.T, s string) []byte {
	t.Helper()
	b, err := hex.DecodeString(s)
	require.NoError(t, err)
	return b
}
