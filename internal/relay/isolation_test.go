package relay_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/buzzrelay/buzz/internal/nostr"
	"github.com/buzzrelay/buzz/internal/relaytest"
)

// TestTenantIsolation runs one divergent two-community fixture against
// every read path: the same person (one key) is in communities A and B, and
// both communities even hold a channel with the same id. Nothing of B may
// ever reach a client of A.
//
// Which assertion fails when a query's community predicate is removed:
//   - eventstore BuildSelect "community_id = $1"        → "REQ {}" and "pinned REQ" (B rows appear)
//   - eventstore BuildCount "community_id = $1"         → "COUNT"
//   - search branch (same builder)                      → "search"
//   - ChannelsReadable "c.community_id = ..."           → "pinned REQ to B's private channel id" (B's channel
//     id becomes readable in A)
//   - ChannelAccess / ChannelLockForChange community    → "write to B's private channel id" (accepted)
//   - EventInsert ON CONFLICT scope (PK leads with community_id) → "same event in both" (duplicate in A)
//   - events_keep_newest_version slot (community_id)    → "A's profile survives B's newer one"
//   - EventsDeleteByIDs community_id                     → "B's deletion does not hide A's copy"
//   - fanout.Hub per-community index                    → "live"
//   - thread parent lookup (community_id)               → "reply across" (accepted)
//   - reaction target lookup (community_id)             → "reaction target event not found" (accepted)
//   - thread_metadata / reactions inserts               → "B's thread/reaction rows landed in A"
//   - HTTP bridge (shares readScope and the builder)    → "HTTP /query", "HTTP /count"
func TestTenantIsolation(t *testing.T) {
	t.Parallel()
	r := relaytest.Start(t)
	r.AddCommunity(t, "b.example")
	person := relaytest.NewKey(t)
	now := time.Now().Unix()

	inB := r.Dial(t, "b.example")
	inB.Auth(person)
	inA := r.Dial(t, "")
	inA.Auth(person)
	watcher := r.Dial(t, "")
	watcher.Auth(nil)
	watcher.Send("REQ", "live", map[string]any{"limit": 0})
	watcher.Expect("EOSE")

	// Community A: an open channel X and a private channel P.
	shared := uuid.NewString()
	require.True(t, inA.Publish(inA.Sign(9007, "", nostr.Tags{{"h", shared}, {"name", "a-only"}}, 0)).OK)
	// A live subscriber pinned to channel X in A: B's channel X must not
	// reach it either (a hub keyed by channel id alone would leak here).
	pinnedWatcher := r.Dial(t, "")
	pinnedWatcher.Auth(nil)
	pinnedWatcher.Send("REQ", "pinned-live", map[string]any{"#h": []string{shared}, "limit": 0})
	pinnedWatcher.Expect("EOSE")
	aMsg := inA.Sign(9, "hello from A", nostr.Tags{{"h", shared}}, now-100)
	require.True(t, inA.Publish(aMsg).OK)
	aProfile := inA.Sign(0, `{"name":"a-profile"}`, nil, now-50)
	require.True(t, inA.Publish(aProfile).OK)
	both := inA.Sign(1, "posted to both communities", nil, now-40)
	require.True(t, inA.Publish(both).OK)

	// Community B: the same channel id X, divergent content, and a private channel.
	require.True(t, inB.Publish(inB.Sign(9007, "", nostr.Tags{{"h", shared}, {"name", "b-only"}}, 0)).OK)
	bPrivate := uuid.NewString()
	require.True(t, inB.Publish(inB.Sign(9007, "", nostr.Tags{{"h", bPrivate}, {"name", "b-private"}, {"visibility", "private"}}, 0)).OK)
	bMsg := inB.Sign(9, "zebra secret in B", nostr.Tags{{"h", shared}}, now-90)
	require.True(t, inB.Publish(bMsg).OK)
	bNote := inB.Sign(1, "zebra note only in B", nil, now-80)
	require.True(t, inB.Publish(bNote).OK)
	require.True(t, inB.Publish(inB.Sign(0, `{"name":"b-profile"}`, nil, now-10)).OK, "B's newer profile")
	bWrap := relaytest.SignEvent(t, relaytest.NewKey(t), 1059, "ciphertext", nostr.Tags{{"p", person.PublicKeyHex()}}, 0)
	require.True(t, inB.Publish(bWrap).OK)
	okBoth := inB.Publish(both)
	require.True(t, okBoth.OK)
	require.Empty(t, okBoth.Msg, "same event in both: new in B")
	require.True(t, inB.Publish(inB.Sign(5, "", nostr.Tags{{"e", both.ID}}, 0)).OK, "B's deletion of its copy")

	// Threads and reactions resolve their targets inside the community: B
	// cannot reply to or react to A's message, only to its own copy.
	requireRejected(t, inB.Publish(inB.Sign(9, "reply across", nostr.Tags{{"h", shared}, {"e", aMsg.ID, "", "reply"}}, 0)), "invalid: reply parent not found")
	requireRejected(t, inB.Publish(inB.Sign(7, "+", nostr.Tags{{"e", aMsg.ID}}, 0)), "invalid: reaction target event not found")
	bReply := inB.Sign(9, "zebra reply in B", nostr.Tags{{"h", shared}, {"e", bMsg.ID, "", "reply"}}, 0)
	require.True(t, inB.Publish(bReply).OK)
	bReaction := inB.Sign(7, "+", nostr.Tags{{"e", bNote.ID}}, 0)
	require.True(t, inB.Publish(bReaction).OK)

	bIDs := map[string]bool{bMsg.ID: true, bNote.ID: true, bWrap.ID: true, bReply.ID: true, bReaction.ID: true}
	requireNoB := func(what string, events []*nostr.Event) {
		t.Helper()
		for _, ev := range events {
			require.False(t, bIDs[ev.ID], "%s: community B's event %s reached A", what, ev.ID)
			if ev.Kind >= 39000 && ev.Kind <= 39002 {
				require.NotEqual(t, []string{"b-only"}, ev.Tags.Values("name"), "%s: B's discovery event reached A", what)
			}
		}
	}

	all := inA.Req("all", map[string]any{})
	requireNoB("REQ {}", all)
	require.Contains(t, ids(all), aMsg.ID)
	pinned := inA.Req("pinned", map[string]any{"#h": []string{shared}})
	requireNoB("pinned REQ", pinned)
	require.Contains(t, ids(pinned), aMsg.ID)
	meta := inA.Req("meta", map[string]any{"kinds": []int{39000}, "#d": []string{shared}})
	require.Len(t, meta, 1)
	require.Equal(t, []string{"a-only"}, meta[0].Tags.Values("name"))

	inA.Send("COUNT", "count", map[string]any{"kinds": []int{9}})
	require.Equal(t, int64(1), inA.Expect("COUNT").Count, "COUNT")
	require.Empty(t, inA.Req("search", map[string]any{"search": "zebra"}), "search")
	require.Empty(t, inA.Req("dms", map[string]any{"kinds": []int{1059}, "#p": []string{person.PublicKeyHex()}}), "DMs")
	require.Equal(t, []string{aProfile.ID}, ids(inA.Req("profile", map[string]any{"kinds": []int{0}, "authors": []string{person.PublicKeyHex()}})), "A's profile survives B's newer one")
	require.Equal(t, []string{both.ID}, ids(inA.Req("both", map[string]any{"ids": []string{both.ID}})), "B's deletion does not hide A's copy")

	require.Empty(t, inA.Req("reactions", map[string]any{"kinds": []int{7}}), "reactions")

	// The HTTP bridge reads through the same scope.
	bridged := post(t, r, person, "/query", query(map[string]any{}))
	require.Equal(t, 200, bridged.Status, bridged.Raw)
	requireNoB("HTTP /query", bridged.Events)
	counted := post(t, r, person, "/count", query(map[string]any{"search": "zebra"}))
	require.Equal(t, int64(0), counted.Count, "HTTP /count")

	// B's private channel id means nothing in A.
	inA.Send("REQ", "bprivate", map[string]any{"#h": []string{bPrivate}})
	require.Equal(t, "restricted: not a channel member", inA.Expect("CLOSED").Msg, "pinned REQ to B's private channel id")
	requireRejected(t, inA.Publish(inA.Sign(9, "sneak", nostr.Tags{{"h", bPrivate}}, 0)), "restricted: channel does not exist or is private to its members")

	// Storage agrees: every row of B's channel id in A's community is A's own.
	var foreign int
	require.NoError(t, r.Pool.QueryRow(context.Background(),
		`SELECT count(*) FROM events WHERE community_id = $1 AND id = ANY($2)`, r.CommunityID,
		[][]byte{idBytes(bMsg), idBytes(bNote), idBytes(bWrap)}).Scan(&foreign))
	require.Zero(t, foreign)
	var threadRows, reactionRows int
	require.NoError(t, r.Pool.QueryRow(context.Background(),
		`SELECT (SELECT count(*) FROM thread_metadata WHERE community_id = $1), (SELECT count(*) FROM reactions WHERE community_id = $1)`,
		r.CommunityID).Scan(&threadRows, &reactionRows))
	require.Zero(t, threadRows, "B's thread rows landed in A")
	require.Zero(t, reactionRows, "B's reaction rows landed in A")

	// Live: the catch-all subscriber in A (which gets community-global
	// events) and the one pinned to channel X got A's event and none of B's
	// (checked last: a read timeout closes the connection).
	requireLiveOnlyA := func(what string, c *relaytest.Client, want *nostr.Event) {
		t.Helper()
		// Until want arrives the wait is a failure bound, so it is long;
		// after it, 300 ms of silence ends the read (a short window there
		// only lets a late event of B's go unseen, never fails wrongly).
		sawWant := false
		for {
			wait := relaytest.Patience
			if sawWant {
				wait = 300 * time.Millisecond
			}
			msg, err := c.TryNext(wait)
			if err != nil {
				require.True(t, sawWant, "%s: the subscriber is live: %v", what, err)
				require.ErrorIs(t, err, context.DeadlineExceeded, "%s: the connection failed instead of falling silent", what)
				break
			}
			require.NotContains(t, string(msg[len(msg)-1]), "zebra", "%s: B's event reached A", what)
			if r := decodeEvent(t, msg); r != nil && r.ID == want.ID {
				sawWant = true
			}
		}
	}
	requireLiveOnlyA("live", watcher, both)
	requireLiveOnlyA("live pinned to channel X", pinnedWatcher, aMsg)
}

// decodeEvent returns the event of an EVENT message, nil for other verbs.
func decodeEvent(t *testing.T, msg []json.RawMessage) *nostr.Event {
	t.Helper()
	var verb string
	require.NoError(t, json.Unmarshal(msg[0], &verb))
	if verb != "EVENT" || len(msg) < 3 {
		return nil
	}
	ev := new(nostr.Event)
	require.NoError(t, json.Unmarshal(msg[2], ev))
	return ev
}

func idBytes(ev *nostr.Event) []byte {
	b := ev.IDBytes()
	return b[:]
}
