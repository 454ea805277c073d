package ingest_test

import (
	"errors"
	"fmt"
	"slices"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/buzzrelay/buzz/internal/ingest"
	"github.com/buzzrelay/buzz/internal/nostr"
)

// TestEveryKindWithAnHTagIsBoundAndAuthorized submits, for every registered
// kind plus unregistered regular, addressable and ephemeral kinds, an event
// naming a private channel in its h tag: an outsider's is refused and not
// stored; a member's is refused or stored bound to that channel, never
// community-global. A kind registered later is covered without editing
// the test. Mutation killed: letting validate-only kinds (emoji sets 30030,
// emoji lists 10030) take the single-INSERT path without the channel check
// stores the outsider's event with no channel, visible in the channel's #h view.
func TestEveryKindWithAnHTagIsBoundAndAuthorized(t *testing.T) {
	t.Parallel()
	f := newFixture(t, "htag.example", 0)
	kinds := ingest.RegisteredKinds(f.p)
	unregistered := []int{1, 30078, 20001}
	for _, kind := range unregistered {
		require.NotContains(t, kinds, kind)
	}
	kinds = append(kinds, unregistered...)
	require.Contains(t, kinds, ingest.KindEmojiSet)

	// Kinds whose handler only validates, or that have none: a member's
	// event must be stored (bound), not merely refused.
	mustStore := []int{1, 30078, ingest.KindEmojiSet, ingest.KindEmojiList}
	for _, kind := range kinds {
		t.Run(fmt.Sprint(kind), func(t *testing.T) {
			member, outsider := f.key(), f.key()
			ch := f.channel(member, true) // a channel per kind: 9008 and 9022 change theirs
			msg := f.store(f.sign(member, ingest.KindChat, "inside", nostr.Tags{{"h", ch}}, 0))
			// Bare (h and d only) and with tags that pull in side rows and handlers.
			for _, tags := range []nostr.Tags{
				{{"h", ch}, {"d", "slot"}},
				{{"h", ch}, {"e", msg.ID}, {"p", member.PublicKeyHex()}, {"d", "slot"}, {"name", "n"}},
			} {
				intruder := f.sign(outsider, kind, "", tags, 0)
				_, err := f.submit(intruder)
				var rej *ingest.Rejection
				require.True(t, errors.As(err, &rej), "kind %d from an outsider: want a rejection, got %v", kind, err)
				require.Zero(t, f.count(`SELECT count(*) FROM events WHERE encode(id, 'hex') = $1`, intruder.ID))

				own := f.sign(member, kind, "", tags, 0)
				out, err := f.submit(own)
				if slices.Contains(mustStore, kind) {
					require.NoError(t, err, "kind %d from a member", kind)
				}
				if err == nil && !nostr.IsEphemeral(kind) {
					require.Contains(t, []ingest.Outcome{ingest.Stored, ingest.Superseded}, out)
					if out == ingest.Stored {
						bound := f.eventChannel(own.ID)
						require.NotNil(t, bound, "kind %d stored community-global", kind)
						require.Equal(t, ch, bound.String())
					}
				}
			}
		})
	}
	// Relay-signed membership notifications are addressed to a user who
	// may no longer read the channel: they alone stay global (p-gated).
	var strays []int
	rows, err := f.pool.Query(f.ctx, `SELECT kind FROM events WHERE channel_id IS NULL AND kind <> ALL($1::int[])
		AND tag_index && ARRAY(SELECT 'h:' || id::text FROM channels)`, ingest.RelayOnlyKinds)
	require.NoError(t, err)
	for rows.Next() {
		var k int
		require.NoError(t, rows.Scan(&k))
		strays = append(strays, k)
	}
	require.Empty(t, strays,
		"no event naming a channel is stored community-global")
}
