package ingest_test

import (
	"fmt"
	"slices"
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
// (ingest.KindsKeptFromModeration, in Go): each kind around the moderation
// ranges is inserted with an expiration, in a channel and outside one.
// Mutations killed: a kind dropped from (or added to) either list.
func TestModerationExpiryRefusalNamesTheKindsKeptFromModeration(t *testing.T) {
	t.Parallel()
	f := newFixture(t, "moderation-expiry-kinds.example", 0)
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
