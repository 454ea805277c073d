package eventstore_test

import (
	"context"
	"testing"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/buzzrelay/buzz/internal/db"
	"github.com/buzzrelay/buzz/internal/dbtest"
	"github.com/buzzrelay/buzz/internal/eventstore"
	"github.com/buzzrelay/buzz/internal/nostr"
)

// The agent_owner constraint is part of every read shape's WHERE clause:
// the history page, a search alone (ranked pages) or beside other filters,
// and COUNT. It narrows the rows before the limit, intersects with authors,
// and only this community's recorded owners count.
//
// Mutations killed: leaving the owner out of conditions (every query below
// returns other owners' agents); applying it after the limit (limit 1
// returns the newer agent of the other owner, then nothing); matching
// owners recorded in another community (the cross-community agent appears).
func TestAgentOwnerNarrowsEveryReadBeforeTheLimit(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := dbtest.Pool(t)
	q := db.New(pool)
	home, err := q.CommunityCreate(ctx, "owners.example")
	require.NoError(t, err)
	other, err := q.CommunityCreate(ctx, "elsewhere.example")
	require.NoError(t, err)

	newKey := func() *nostr.SecretKey {
		k, err := nostr.GenerateSecretKey()
		require.NoError(t, err)
		return k
	}
	recordUser := func(community uuid.UUID, key *nostr.SecretKey, owner *nostr.SecretKey) {
		var ownerBytes []byte
		if owner != nil {
			b := owner.PublicKey()
			ownerBytes = b[:]
		}
		pub := key.PublicKey()
		_, err := pool.Exec(ctx, `INSERT INTO users (community_id, pubkey, agent_owner_pubkey) VALUES ($1, $2, $3)
			ON CONFLICT (community_id, pubkey) DO UPDATE SET agent_owner_pubkey = EXCLUDED.agent_owner_pubkey`, community, pub[:], ownerBytes)
		require.NoError(t, err)
	}
	profile := func(community uuid.UUID, key *nostr.SecretKey, createdAt int64) *nostr.Event {
		ev := &nostr.Event{Kind: 0, CreatedAt: createdAt, Content: `{"name":"Honey","about":"helpful bee"}`, Tags: nostr.Tags{}}
		require.NoError(t, ev.Sign(key))
		params, err := eventstore.InsertParams(community, ev, nil)
		require.NoError(t, err)
		_, err = q.EventInsert(ctx, params)
		require.NoError(t, err)
		return ev
	}

	alice, bob := newKey(), newKey()
	for _, owner := range []*nostr.SecretKey{alice, bob} {
		recordUser(home.ID, owner, nil)
		recordUser(other.ID, owner, nil)
	}
	// Alice's Honey is the oldest; bob owns five newer agents of the same name.
	aliceHoney := newKey()
	recordUser(home.ID, aliceHoney, alice)
	mine := profile(home.ID, aliceHoney, 1_700_000_000)
	var bobs []*nostr.Event
	for i := range 5 {
		agent := newKey()
		recordUser(home.ID, agent, bob)
		bobs = append(bobs, profile(home.ID, agent, 1_700_000_100+int64(i)))
	}
	// Owned by alice only in another community: not alice's agent here.
	elsewhere := newKey()
	recordUser(home.ID, elsewhere, nil)
	recordUser(other.ID, elsewhere, alice)
	profile(home.ID, elsewhere, 1_700_000_200)
	profile(other.ID, elsewhere, 1_700_000_200)

	store := eventstore.New(pool, 100)
	scope := eventstore.Scope{Reader: alice.PublicKeyHex()}
	read := func(filters ...nostr.Filter) []string {
		t.Helper()
		got := []string{}
		require.NoError(t, store.Query(ctx, home.ID, scope, filters, func(ev *nostr.Event, _ *uuid.UUID) error {
			got = append(got, ev.ID)
			return nil
		}))
		return got
	}
	count := func(filters ...nostr.Filter) int64 {
		t.Helper()
		n, _, err := store.Count(ctx, home.ID, scope, filters)
		require.NoError(t, err)
		return n
	}
	one := func() *int { n := 1; return &n }
	aliceHex, bobHex := alice.PublicKeyHex(), bob.PublicKeyHex()

	require.NotEqual(t, []string{mine.ID}, read(nostr.Filter{Kinds: []int{0}, Limit: one()}), "without the owner, limit 1 crowds alice's agent out")
	require.Equal(t, []string{mine.ID}, read(nostr.Filter{Kinds: []int{0}, Limit: one(), AgentOwner: aliceHex}))
	require.Equal(t, []string{mine.ID}, read(nostr.Filter{Kinds: []int{0}, Search: "Honey", Limit: one(), AgentOwner: aliceHex}), "single search filter (ranked pages)")
	require.Equal(t, []string{mine.ID}, read(
		nostr.Filter{Kinds: []int{0}, Search: "honey", Limit: one(), AgentOwner: aliceHex},
		nostr.Filter{IDs: []string{"0000000000000000000000000000000000000000000000000000000000000000"}},
	), "search beside another filter (time-merged branches)")
	require.Len(t, read(nostr.Filter{Kinds: []int{0}, AgentOwner: bobHex}), 5)
	require.Equal(t, []string{bobs[4].ID}, read(nostr.Filter{Kinds: []int{0}, AgentOwner: bobHex, Limit: one()}))

	// Intersection with authors; an empty intersection is empty.
	require.Equal(t, []string{mine.ID}, read(nostr.Filter{Authors: []string{aliceHoney.PublicKeyHex(), bobs[0].PubKey}, AgentOwner: aliceHex}))
	require.Empty(t, read(nostr.Filter{Authors: []string{bobs[0].PubKey}, AgentOwner: aliceHex}))
	require.Empty(t, read(nostr.Filter{Authors: []string{elsewhere.PublicKeyHex()}, AgentOwner: aliceHex}), "an owner recorded in another community does not count here")
	// An owner nobody names, and an agent (which owns nothing), match nothing.
	require.Empty(t, read(nostr.Filter{Kinds: []int{0}, AgentOwner: newKey().PublicKeyHex()}))
	require.Empty(t, read(nostr.Filter{AgentOwner: aliceHoney.PublicKeyHex()}))

	require.Equal(t, int64(1), count(nostr.Filter{Kinds: []int{0}, AgentOwner: aliceHex}))
	require.Equal(t, int64(5), count(nostr.Filter{Search: "Honey", AgentOwner: bobHex}))
	require.Equal(t, int64(6), count(nostr.Filter{AgentOwner: aliceHex}, nostr.Filter{AgentOwner: bobHex}))
	require.Equal(t, int64(0), count(nostr.Filter{Authors: []string{bobs[0].PubKey}, AgentOwner: aliceHex}))

	// The owner is a bound parameter like every other value.
	sql, args, ok := eventstore.BuildSelect(home.ID, scope, nostr.Filters{{AgentOwner: aliceHex}}, 100)
	require.True(t, ok)
	require.NotContains(t, sql, aliceHex)
	pub := alice.PublicKey()
	require.Contains(t, args, pub[:])
}
