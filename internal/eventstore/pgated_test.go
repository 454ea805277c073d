package eventstore_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/buzzrelay/buzz/internal/db"
	"github.com/buzzrelay/buzz/internal/dbtest"
	"github.com/buzzrelay/buzz/internal/eventstore"
	"github.com/buzzrelay/buzz/internal/nostr"
)

// TestStoredReadsHonourEveryPGatedKind stores, for every kind of the one
// p-gated list, an event addressed to alice: bob's unfiltered read and
// count see none of them, nor does his read naming the kinds (with a
// kind 1 beside them), alice's see all. Mutations killed: a p-gated kind
// listed in Go (ingest, live fan-out) but missing from the stored-read
// scope, as with the literal list the query builder had; the p-gate left
// out of a statement whose filter names kinds, p-gated ones among them.
func TestStoredReadsHonourEveryPGatedKind(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := dbtest.Pool(t)
	q := db.New(pool)
	home, err := q.CommunityCreate(ctx, "pgated.example")
	require.NoError(t, err)
	alice, bob := newKey(t), newKey(t)
	kinds := nostr.PGatedKinds()
	require.Contains(t, kinds, nostr.KindGiftWrap)
	for i, kind := range kinds {
		require.True(t, nostr.IsPGated(kind))
		ev := &nostr.Event{Kind: kind, CreatedAt: time.Now().Unix() - int64(i), Content: fmt.Sprint(kind), Tags: nostr.Tags{{"p", alice.PublicKeyHex()}}}
		require.NoError(t, ev.Sign(newKey(t)))
		params, err := eventstore.InsertParams(home.ID, ev, nil)
		require.NoError(t, err)
		_, err = q.EventInsert(ctx, params)
		require.NoError(t, err)
	}
	require.False(t, nostr.IsPGated(nostr.KindTextNote))

	store := eventstore.New(pool, 100)
	for reader, want := range map[string]int{alice.PublicKeyHex(): len(kinds), bob.PublicKeyHex(): 0} {
		scope := eventstore.Scope{Reader: reader}
		for _, f := range []nostr.Filter{{}, {Kinds: append([]int{nostr.KindTextNote}, kinds...)}} {
			seen := 0
			require.NoError(t, store.Query(ctx, home.ID, scope, nostr.Filters{f}, func(*nostr.Event, *uuid.UUID) error {
				seen++
				return nil
			}))
			require.Equal(t, want, seen, "filter %+v", f)
		}
		count, _, err := store.Count(ctx, home.ID, scope, nostr.Filters{{}})
		require.NoError(t, err)
		require.EqualValues(t, want, count)
	}
}

func newKey(t testing.TB) *nostr.SecretKey {
	t.Helper()
	k, err := nostr.GenerateSecretKey()
	require.NoError(t, err)
	return k
}
