package relay_test

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/buzzrelay/buzz/internal/config"
	"github.com/buzzrelay/buzz/internal/nostr"
	"github.com/buzzrelay/buzz/internal/relaytest"
)

// ownedAgents is two people (Alice and Bob) each owning an agent named
// Honey, with the owners recorded in users the way authentication records
// them.
type ownedAgents struct {
	alice, bob, aliceHoney, bobHoney *relaytest.Client
	aliceProfile, bobProfile         *nostr.Event
}

func setupOwnedAgents(t *testing.T, r *relaytest.Relay) ownedAgents {
	t.Helper()
	var o ownedAgents
	now := time.Now().Unix()
	connect := func(profile string, createdAt int64) (*relaytest.Client, *nostr.Event) {
		c := r.Dial(t, "")
		c.Auth(nil)
		ev := c.Sign(0, profile, nil, createdAt)
		require.True(t, c.Publish(ev).OK)
		return c, ev
	}
	o.alice, _ = connect(`{"name":"alice","display_name":"Alice"}`, now-100)
	o.bob, _ = connect(`{"name":"bob","display_name":"Bob"}`, now-100)
	// Alice's Honey is older: a limited lookup by name alone finds Bob's.
	o.aliceHoney, o.aliceProfile = connect(`{"name":"Honey","about":"a helpful bee"}`, now-60)
	o.bobHoney, o.bobProfile = connect(`{"name":"Honey","about":"a helpful bee"}`, now-30)
	recordOwner(t, r, o.aliceHoney.Key, o.alice.Key)
	recordOwner(t, r, o.bobHoney.Key, o.bob.Key)
	return o
}

// recordOwner sets the agent's recorded owner directly, as the relay does
// once the agent proves its owner's attestation.
func recordOwner(t *testing.T, r *relaytest.Relay, agent, owner *nostr.SecretKey) {
	t.Helper()
	a, o := agent.PublicKey(), owner.PublicKey()
	tag, err := r.Pool.Exec(context.Background(), `UPDATE users SET agent_owner_pubkey = $3 WHERE community_id = $1 AND pubkey = $2`, r.CommunityID, a[:], o[:])
	require.NoError(t, err)
	require.Equal(t, int64(1), tag.RowsAffected())
}

// Two agents share a name and have different owners: /query with the owner
// returns only that owner's agent, even with limit 1 and the other agent
// newer; the recorded-owner API gives its owner metadata; an unknown owner,
// or an owner who owns no agent, returns []. /count agrees.
//
// Mutations killed: the owner dropped from the SQL (Bob's Honey comes back
// for Alice); the owner applied after the limit (limit 1 gives Bob's newer
// Honey, then nothing for Alice); the recorded-owner route answering
// without the owner's display name from this community.
func TestQueryAgentOwnerReturnsOnlyVerifiedOwnerMatches(t *testing.T) {
	t.Parallel()
	r := relaytest.Start(t)
	o := setupOwnedAgents(t, r)
	aliceHex, bobHex := o.alice.Key.PublicKeyHex(), o.bob.Key.PublicKeyHex()
	byName := func(owner any) map[string]any {
		f := map[string]any{"kinds": []int{0}, "search": "Honey", "limit": 1}
		if owner != "" {
			f["agent_owner"] = owner
		}
		return f
	}

	got := post(t, r, o.alice.Key, "/query", query(byName("")))
	require.Equal(t, http.StatusOK, got.Status, got.Raw)
	require.Equal(t, []string{o.bobProfile.ID}, ids(got.Events), "by name alone, the other owner's agent wins the limit")

	got = post(t, r, o.alice.Key, "/query", query(byName(aliceHex)))
	require.Equal(t, http.StatusOK, got.Status, got.Raw)
	require.Equal(t, []string{o.aliceProfile.ID}, ids(got.Events))
	got = post(t, r, o.bob.Key, "/query", query(byName(bobHex)))
	require.Equal(t, []string{o.bobProfile.ID}, ids(got.Events))
	got = post(t, r, o.alice.Key, "/query", query(byName(nil)))
	require.Equal(t, []string{o.bobProfile.ID}, ids(got.Events), "null is no owner constraint")

	for _, nobody := range []string{relaytest.NewKey(t).PublicKeyHex(), o.aliceHoney.Key.PublicKeyHex()} {
		got = post(t, r, o.alice.Key, "/query", query(byName(nobody)))
		require.Equal(t, http.StatusOK, got.Status, got.Raw)
		require.JSONEq(t, `{"events":[]}`, got.Raw)
	}

	got = post(t, r, o.alice.Key, "/count", query(map[string]any{"kinds": []int{0}, "agent_owner": aliceHex}))
	require.Equal(t, http.StatusOK, got.Status, got.Raw)
	require.Equal(t, int64(1), got.Count)
	got = post(t, r, o.alice.Key, "/count", query(map[string]any{"kinds": []int{0}, "search": "honey"}, map[string]any{"agent_owner": bobHex}))
	require.Equal(t, int64(2), got.Count, "filters are OR-ed; the owner narrows only its own filter")

	// Owner metadata for the returned agent.
	status, raw := getAuthed(t, r, o.alice.Key, "/v1/users/"+o.aliceHoney.Key.PublicKeyHex()+"/recorded-owner")
	require.Equal(t, http.StatusOK, status, "%s", raw)
	require.JSONEq(t, `{"pubkey":"`+o.aliceHoney.Key.PublicKeyHex()+`","agent_owner_pubkey":"`+aliceHex+`","owner_display_name":"Alice","channel_add_policy":"anyone"}`, string(raw))
	// No recorded owner (a person, or a pubkey the community never saw): 404 JSON.
	for _, none := range []string{aliceHex, relaytest.NewKey(t).PublicKeyHex()} {
		status, raw = getAuthed(t, r, o.alice.Key, "/v1/users/"+none+"/recorded-owner")
		require.Equal(t, http.StatusNotFound, status, "%s", raw)
		require.JSONEq(t, `{"error":"invalid: no recorded owner for `+none+`"}`, string(raw))
	}
	status, raw = getAuthed(t, r, nil, "/v1/users/"+o.aliceHoney.Key.PublicKeyHex()+"/recorded-owner")
	require.Equal(t, http.StatusUnauthorized, status, "%s", raw)
}

// authors and agent_owner intersect; an empty intersection is [].
// Mutation killed: an owner constraint OR-ed with authors (or replacing
// them) returns Bob's agent for Alice.
func TestAgentOwnerIntersectsWithAuthors(t *testing.T) {
	t.Parallel()
	r := relaytest.Start(t)
	o := setupOwnedAgents(t, r)
	aliceHex := o.alice.Key.PublicKeyHex()
	both := []string{o.aliceHoney.Key.PublicKeyHex(), o.bobHoney.Key.PublicKeyHex()}

	got := post(t, r, o.alice.Key, "/query", query(map[string]any{"authors": both, "kinds": []int{0}, "agent_owner": aliceHex}))
	require.Equal(t, []string{o.aliceProfile.ID}, ids(got.Events))
	got = post(t, r, o.alice.Key, "/query", query(map[string]any{"authors": []string{o.bobHoney.Key.PublicKeyHex()}, "agent_owner": aliceHex}))
	require.Equal(t, http.StatusOK, got.Status, got.Raw)
	require.JSONEq(t, `{"events":[]}`, got.Raw)

	// The same over WebSocket, REQ and COUNT.
	require.Equal(t, []string{o.aliceProfile.ID}, ids(o.alice.Req("i", map[string]any{"authors": both, "agent_owner": aliceHex})))
	require.Empty(t, o.alice.Req("e", map[string]any{"authors": []string{o.bobHoney.Key.PublicKeyHex()}, "agent_owner": aliceHex}))
	o.alice.Send("COUNT", "c", map[string]any{"authors": both, "agent_owner": aliceHex})
	require.Equal(t, int64(1), o.alice.Expect("COUNT").Count)
}

// A malformed agent_owner is refused, never ignored: CLOSED with invalid:
// on the wire (the connection keeps working), 400 JSON naming the filter
// and field over HTTP, for /query and /count alike.
// Mutation killed: a parser that treats a bad value as absent answers with
// every owner's agents instead of refusing.
func TestMalformedAgentOwnerIsRefused(t *testing.T) {
	t.Parallel()
	r := relaytest.Start(t)
	o := setupOwnedAgents(t, r)
	upper := strings.ToUpper(o.alice.Key.PublicKeyHex())
	for _, bad := range []any{upper, "me", "", 42, []string{o.alice.Key.PublicKeyHex()}, "npub1" + strings.Repeat("q", 58)} {
		for _, path := range []string{"/query", "/count"} {
			got := post(t, r, o.alice.Key, path, query(map[string]any{"kinds": []int{0}}, map[string]any{"kinds": []int{0}, "agent_owner": bad}))
			require.Equal(t, http.StatusBadRequest, got.Status, "%s %v: %s", path, bad, got.Raw)
			var body map[string]any
			require.NoError(t, json.Unmarshal([]byte(got.Raw), &body))
			require.Equal(t, map[string]any{
				"error":  "invalid: filter 1: agent_owner must be a 64-char lowercase hex pubkey (or null for no owner constraint)",
				"filter": float64(1),
				"field":  "agent_owner",
			}, body)
		}
		o.alice.Send("REQ", "bad", map[string]any{"agent_owner": bad})
		closed := o.alice.Expect("CLOSED")
		require.Equal(t, "bad", closed.SubID)
		require.Equal(t, "invalid: filter 0: agent_owner must be a 64-char lowercase hex pubkey (or null for no owner constraint)", closed.Msg)
		o.alice.Send("COUNT", "badc", map[string]any{"agent_owner": bad})
		require.True(t, strings.HasPrefix(o.alice.Expect("CLOSED").Msg, "invalid: filter 0: agent_owner"))
	}
	require.Len(t, o.alice.Req("after", map[string]any{"kinds": []int{0}}), 4, "the connection survives")

	status, raw := getAuthed(t, r, o.alice.Key, "/v1/users/"+upper+"/recorded-owner")
	require.Equal(t, http.StatusBadRequest, status, "%s", raw)
	require.JSONEq(t, `{"error":"invalid: pubkey must be 64-char lowercase hex"}`, string(raw))
}

// agent_owner is refused on live delivery: fan-out matches events in memory
// and cannot know who owns their author (an owner may be recorded after the
// subscription opens), so a REQ with an owner is one-shot: stored events,
// EOSE, and nothing live, while an ordinary REQ beside it keeps receiving.
// It holds no live filter values either, so many owner lookups fit in a
// small connection budget.
// Mutation killed: registering owner REQs as live subscriptions uses the
// budget up (the second lookup is refused with rate-limited:).
func TestAgentOwnerRequestIsOneShot(t *testing.T) {
	t.Parallel()
	r := relaytest.Start(t, func(c *config.Config) { c.MaxFilterValues = 4 })
	o := setupOwnedAgents(t, r)
	aliceHex := o.alice.Key.PublicKeyHex()
	watcher := o.alice
	watcher.Send("REQ", "plain", map[string]any{"kinds": []int{1}})
	watcher.Expect("EOSE")
	for _, sub := range []string{"own1", "own2", "own3"} {
		watcher.Send("REQ", sub, map[string]any{"kinds": []int{0, 1}, "authors": []string{o.aliceHoney.Key.PublicKeyHex()}, "agent_owner": aliceHex})
		ev := watcher.Expect("EVENT")
		require.Equal(t, o.aliceProfile.ID, ev.Event.ID)
		require.Equal(t, sub, watcher.Expect("EOSE").SubID)
	}
	note := o.aliceHoney.Sign(1, "buzz", nil, 0)
	require.True(t, o.aliceHoney.Publish(note).OK)
	live := watcher.Expect("EVENT")
	require.Equal(t, "plain", live.SubID, "only the ordinary subscription is live")
	require.Equal(t, note.ID, live.Event.ID)
	watcher.ExpectSilence(300*time.Millisecond, "an agent_owner REQ must not receive live events")
}
