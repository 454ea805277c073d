package ingest_test

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/buzzrelay/buzz/internal/dberr"
	"github.com/buzzrelay/buzz/internal/ingest"
	"github.com/buzzrelay/buzz/internal/nostr"
)

const moderationExpiryRefused = "invalid: a channel's moderation events (9000-9002, 9005, 9007, 9008) are its lasting account of who did what: they cannot carry an expiration tag"

// A channel's moderation event carrying a NIP-40 expiration is refused,
// and nothing of it applies: it is the channel's lasting account of who
// did what, which no 9005 and not its author's own kind 5 may hide, and an
// expiration hid it all the same. Before, an owner's removal dated to
// expire a minute later was stored and applied; once the minute passed no
// read served it and the purge deleted its row, while the member stayed
// removed: the admin who removed members had hidden that they did. A
// member's message with an expiration is still stored (it is no account).
// Mutation killed: migration 069's constraint dropped (the removal, the
// grant and the hide are stored and applied, and this test fails on its
// first refusal, as it did before the migration).
func TestModerationEventsCannotExpire(t *testing.T) {
	t.Parallel()
	f := newFixture(t, "moderation-expiry.example", 0)
	owner, member, other := f.key(), f.key(), f.key()
	ch := f.channel(owner, true)
	f.store(f.sign(owner, ingest.KindPutUser, "", nostr.Tags{{"h", ch}, {"p", member.PublicKeyHex()}}, 0))
	note := f.store(f.sign(member, ingest.KindChat, "hello", nostr.Tags{{"h", ch}}, 0))
	expiration := nostr.Tag{"expiration", fmt.Sprint(time.Now().Add(time.Minute).Unix())}

	f.rejected(f.sign(owner, ingest.KindRemoveUser, "", nostr.Tags{{"h", ch}, {"p", member.PublicKeyHex()}, expiration}, 0), moderationExpiryRefused)
	require.Contains(t, f.activeMembers(ch), member.PublicKeyHex(), "the refused removal was applied")
	f.rejected(f.sign(owner, ingest.KindPutUser, "", nostr.Tags{{"h", ch}, {"p", other.PublicKeyHex()}, expiration}, 0), moderationExpiryRefused)
	require.NotContains(t, f.activeMembers(ch), other.PublicKeyHex(), "the refused grant was applied")
	f.rejected(f.sign(owner, ingest.KindDeleteEvent, "", nostr.Tags{{"h", ch}, {"e", note.ID}, expiration}, 0), moderationExpiryRefused)
	require.Zero(t, f.count(`SELECT count(*) FROM events WHERE encode(id, 'hex') = $1 AND deleted_at IS NOT NULL`, note.ID), "the refused hide was applied")
	f.rejected(f.sign(owner, ingest.KindEditMetadata, "", nostr.Tags{{"h", ch}, {"name", "renamed"}, expiration}, 0), moderationExpiryRefused)
	f.rejected(f.sign(owner, ingest.KindCreateGroup, "", nostr.Tags{{"h", uuid.NewString()}, {"name", "short-lived"}, expiration}, 0), moderationExpiryRefused)

	// Not an account: a member's message and a join may still expire.
	f.store(f.sign(member, ingest.KindChat, "gone soon", nostr.Tags{{"h", ch}, expiration}, 0))
	f.store(f.sign(other, ingest.KindJoinRequest, "", nostr.Tags{{"h", f.channel(owner, false)}, expiration}, 0))
}

// The constraint that keeps moderation events from expiring names exactly
// the channel kinds the relay keeps from moderation and deletion
// (ingest.KindsKeptFromModeration, in Go): its condition, read from the
// database, refuses exactly those of the 65,536 kinds with an expiration
// in a channel, and none outside a channel or without an expiration; then
// each kind around the moderation ranges is inserted with an expiration,
// in a channel and outside one, and refused by the constraint's name.
// Mutations killed: a kind dropped from (or added to) either list, any
// kind (the inserts alone tried only the kinds around the ranges, and
// missed 44101 added to the constraint).
func TestModerationExpiryRefusalNamesTheKindsKeptFromModeration(t *testing.T) {
	t.Parallel()
	f := newFixture(t, "moderation-expiry-kinds.example", 0)
	var def string
	require.NoError(t, f.pool.QueryRow(f.ctx, `SELECT pg_get_constraintdef(oid) FROM pg_constraint
		WHERE conname = 'events_moderation_never_expires' AND conrelid = 'events'::regclass`).Scan(&def))
	check, ok := strings.CutPrefix(strings.TrimSuffix(def, " NOT VALID"), "CHECK ")
	require.True(t, ok, def)
	refused := func(expiresAt, channelID string) []int32 {
		t.Helper()
		var kinds []int32
		require.NoError(t, f.pool.QueryRow(f.ctx, `SELECT coalesce(array_agg(kind ORDER BY kind), '{}') FROM (
			SELECT k AS kind, `+expiresAt+` AS expires_at, `+channelID+` AS channel_id FROM generate_series(0, 65535) k) events
			WHERE NOT `+check).Scan(&kinds))
		return kinds
	}
	require.Equal(t, slices.Sorted(slices.Values(ingest.KindsKeptFromModeration)), refused("now()", "gen_random_uuid()"))
	require.Empty(t, refused("now()", "NULL::uuid"), "refused outside a channel")
	require.Empty(t, refused("NULL::timestamptz", "gen_random_uuid()"), "refused without an expiration")

	ch := uuid.MustParse(f.channel(f.key(), true))
	author := f.key().PublicKeyHex()
	events := 0
	for _, kinds := range [][2]int32{{8999, 9011}, {38999, 39004}} {
		for kind := kinds[0]; kind <= kinds[1]; kind++ {
			for _, channel := range []*uuid.UUID{&ch, nil} {
				events++
				var dTag *string
				if kind >= 30000 {
					dTag = new(string)
				}
				_, err := f.pool.Exec(f.ctx, `INSERT INTO events (community_id, id, pubkey, created_at, kind, tags, content, sig, channel_id, d_tag, expires_at)
					VALUES ($1, decode($2, 'hex'), decode($3, 'hex'), now(), $4, '[]', '', decode(repeat('00', 64), 'hex'), $5, $6, now() + interval '1 hour')`,
					f.tenant.ID(), fmt.Sprintf("%064x", events), author, kind, channel, dTag)
				if channel != nil && slices.Contains(ingest.KindsKeptFromModeration, kind) {
					v, ok := dberr.AsViolation(err)
					require.True(t, ok, "kind %d in a channel: want the named refusal, got %v", kind, err)
					require.Equal(t, "events_moderation_never_expires", v.Constraint)
					continue
				}
				require.NoError(t, err, "kind %d in a channel: %v", kind, channel != nil)
			}
		}
	}
}
