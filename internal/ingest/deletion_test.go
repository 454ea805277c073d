package ingest_test

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/buzzrelay/buzz/internal/db"
	"github.com/buzzrelay/buzz/internal/dberr"
	"github.com/buzzrelay/buzz/internal/eventstore"
	"github.com/buzzrelay/buzz/internal/ingest"
	"github.com/buzzrelay/buzz/internal/nostr"
)

// TestLooselySpelledCoordinatesAreRefused: a kind 5 naming a slot by any
// spelling but the canonical one is refused, and the slot's current version
// stays; the canonical spelling deletes it and keeps an older version out.
// Mutation killed: accepting the loose spellings (they hid the current
// version while the trigger, matching the literal coordinate, let an older
// version published afterwards back in).
func TestLooselySpelledCoordinatesAreRefused(t *testing.T) {
	t.Parallel()
	f := newFixture(t, "coordinates.example", 0)
	key := f.key()
	pk := key.PublicKeyHex()
	relays := f.store(f.sign(key, 10002, "", nostr.Tags{{"r", "wss://a.example"}}, f.base+10))
	article := f.store(f.sign(key, 30023, "v2", nostr.Tags{{"d", "d"}}, f.base+10))

	for _, loose := range []string{
		"10002:" + pk, "010002:" + pk + ":", "+10002:" + pk + ":", "10002:" + strings.ToUpper(pk) + ":",
		"030023:" + pk + ":d", "+30023:" + pk + ":d", "30023:" + pk,
	} {
		_, err := f.submit(f.sign(key, nostr.KindDeletion, "", nostr.Tags{{"a", loose}}, f.base+20))
		var rej *ingest.Rejection
		require.True(t, errors.As(err, &rej), "%s: want a rejection, got %v", loose, err)
		require.Equal(t, "invalid", rej.Prefix, loose)
	}
	live := `SELECT count(*) FROM events WHERE encode(id, 'hex') = $1 AND deleted_at IS NULL`
	require.Equal(t, 1, f.count(live, relays.ID))
	require.Equal(t, 1, f.count(live, article.ID))

	f.store(f.sign(key, nostr.KindDeletion, "", nostr.Tags{{"a", "10002:" + pk + ":"}, {"a", "30023:" + pk + ":d"}}, f.base+20))
	require.Zero(t, f.count(live, relays.ID))
	require.Zero(t, f.count(live, article.ID))
	for _, older := range []*nostr.Event{
		f.sign(key, 10002, "", nostr.Tags{{"r", "wss://old.example"}}, f.base+5),
		f.sign(key, 30023, "v1", nostr.Tags{{"d", "d"}}, f.base+5),
	} {
		out, err := f.submit(older)
		require.NoError(t, err)
		require.Equal(t, ingest.Superseded, out, "an older version of a deleted slot stays out")
	}
}

// TestCoordinateRuleIsTheSameInGoAndSQL checks nostr.ParseCoordinate against
// migration 010's nostr_coordinate_is_canonical, and that the events table
// refuses a kind 5 with a loose coordinate from any writer. Mutations
// killed: either rule drifting from the other; dropping the constraint.
func TestCoordinateRuleIsTheSameInGoAndSQL(t *testing.T) {
	t.Parallel()
	f := newFixture(t, "coordinate-sql.example", 0)
	pk := strings.Repeat("0f", 32)
	for _, v := range []string{
		"10002:" + pk + ":", "0:" + pk + ":", "3:" + pk + ":", "30023:" + pk + ":d", "30023:" + pk + ":", "30023:" + pk + ":a:b",
		"39999:" + pk + ":" + strings.Repeat("x", nostr.MaxCoordinateLen-len("39999:"+pk+":")),
		"10002:" + pk, "030023:" + pk + ":d", "+30023:" + pk + ":d", "-0:" + pk + ":", " 3:" + pk + ":",
		"30023:" + strings.ToUpper(pk) + ":d", "30023:" + pk[:62] + ":d", "30023::d", ":" + pk + ":",
		"10002:" + pk + ":x", "1:" + pk + ":", "20001:" + pk + ":", "65536:" + pk + ":", "99999:" + pk + ":",
		"100000:" + pk + ":", "30023:" + pk + ":" + strings.Repeat("x", nostr.MaxCoordinateLen), "", "30023",
	} {
		_, goErr := nostr.ParseCoordinate(v)
		var sqlOK bool
		require.NoError(t, f.pool.QueryRow(f.ctx, `SELECT nostr_coordinate_is_canonical($1)`, v).Scan(&sqlOK))
		require.Equal(t, goErr == nil, sqlOK, "Go and SQL disagree on %q", v)
	}

	key := f.key()
	loose := f.sign(key, nostr.KindDeletion, "", nostr.Tags{{"a", "10002:" + key.PublicKeyHex()}}, 0)
	params, err := eventstore.InsertParams(f.tenant.ID(), loose, nil)
	require.NoError(t, err)
	_, err = db.New(f.pool).EventInsert(f.ctx, params)
	v, ok := dberr.AsViolation(err)
	require.True(t, ok, "want a constraint violation, got %v", err)
	require.Equal(t, "events_deletion_coordinates_canonical", v.Constraint)
}

// TestDeletionIsAsReadableAsItsTargets: a kind 5 is stored in the channel of
// the author's events it names (by id or coordinate), global for global
// targets, and refused when its targets span channels or mix a channel with
// global events. Mutation killed: storing every deletion community-global
// (any reader learnt the deleted private ids and their k tags).
func TestDeletionIsAsReadableAsItsTargets(t *testing.T) {
	t.Parallel()
	f := newFixture(t, "deletion-scope.example", 0)
	alice := f.key()
	private, other := f.channel(alice, true), f.channel(alice, false)
	inPrivate := f.store(f.sign(alice, ingest.KindChat, "secret", nostr.Tags{{"h", private}}, 0))
	inOther := f.store(f.sign(alice, ingest.KindChat, "elsewhere", nostr.Tags{{"h", other}}, 0))
	global := f.store(f.sign(alice, nostr.KindTextNote, "hello all", nil, 0))
	set := f.store(f.sign(alice, ingest.KindEmojiSet, "", nostr.Tags{{"d", "s"}, {"h", private}}, 0))
	setCoord := "30030:" + alice.PublicKeyHex() + ":s"

	for _, tags := range []nostr.Tags{
		{{"e", inPrivate.ID}, {"e", global.ID}},
		{{"e", inPrivate.ID}, {"e", inOther.ID}},
		{{"a", setCoord}, {"e", global.ID}},
	} {
		f.rejected(f.sign(alice, nostr.KindDeletion, "", tags, 0),
			"invalid: a deletion may name events of one channel, or only community-global events: send one deletion per channel")
	}
	f.rejected(f.sign(alice, nostr.KindDeletion, "", nostr.Tags{{"e", inPrivate.ID}, {"h", other}}, 0),
		"invalid: the h tag must name the channel of the events being deleted")

	byID := f.store(f.sign(alice, nostr.KindDeletion, "", nostr.Tags{{"e", inPrivate.ID}, {"k", "9"}}, 0))
	require.NotNil(t, f.eventChannel(byID.ID))
	require.Equal(t, private, f.eventChannel(byID.ID).String())
	byCoord := f.store(f.sign(alice, nostr.KindDeletion, "", nostr.Tags{{"a", setCoord}, {"h", private}}, 0))
	require.NotNil(t, f.eventChannel(byCoord.ID))
	require.Equal(t, private, f.eventChannel(byCoord.ID).String())
	globalDeletion := f.store(f.sign(alice, nostr.KindDeletion, "", nostr.Tags{{"e", global.ID}, {"e", fmt.Sprintf("%064x", 5)}}, 0))
	require.Nil(t, f.eventChannel(globalDeletion.ID))

	live := `SELECT count(*) FROM events WHERE encode(id, 'hex') = $1 AND deleted_at IS NULL`
	for _, gone := range []*nostr.Event{inPrivate, set, global} {
		require.Zero(t, f.count(live, gone.ID))
	}
	require.Equal(t, 1, f.count(live, inOther.ID))
}

// A moderator hiding a member's address deletion (a 9005 naming the kind
// 5, which moderation may hide: its text is the member's) hides the
// deletion event, not its effect: an older version of the deleted address
// stays out, as it did before the 9005.
// Mutation killed: the slot trigger counting only deletions not hidden
// (deleted_at IS NULL), as before migration 023: v0b is stored and live.
func TestHiddenDeletionKeepsItsAddressDeleted(t *testing.T) {
	t.Parallel()
	f := newFixture(t, "hidden-deletion.example", 0)
	owner, member := f.key(), f.key()
	ch := f.channel(owner, false)
	f.store(f.sign(member, ingest.KindJoinRequest, "", nostr.Tags{{"h", ch}}, 0))
	now := time.Now().Unix()
	f.store(f.sign(member, 30023, "v1", nostr.Tags{{"d", "slot"}, {"h", ch}}, now-100))
	deletion := f.store(f.sign(member, nostr.KindDeletion, "", nostr.Tags{{"a", "30023:" + member.PublicKeyHex() + ":slot"}}, now-50))
	older := func(content string, createdAt int64) ingest.Outcome {
		out, err := f.submit(f.sign(member, 30023, content, nostr.Tags{{"d", "slot"}, {"h", ch}}, createdAt))
		require.NoError(t, err)
		return out
	}
	require.Equal(t, ingest.Superseded, older("v0", now-90))

	f.store(f.sign(owner, ingest.KindDeleteEvent, "", nostr.Tags{{"h", ch}, {"e", deletion.ID}}, 0))
	require.Equal(t, 1, f.count(`SELECT count(*) FROM events WHERE encode(id, 'hex') = $1 AND deleted_at IS NOT NULL`, deletion.ID), "the deletion is hidden")
	require.Equal(t, ingest.Superseded, older("v0b", now-80), "the address stays deleted")
	require.Zero(t, f.count(`SELECT count(*) FROM events WHERE community_id = $1 AND kind = 30023 AND deleted_at IS NULL`, f.tenant.ID()))
}

// TestDeletionCoordinatesAreBounded: a kind 5 naming more than
// MaxDeletionCoordinates a tags is refused before it reaches the database;
// each coordinate took a slot lock held until the group committed, and a
// group of deletions naming 2,000 made-up slots each filled PostgreSQL's
// lock table ("out of shared memory") for every session. Mutation killed:
// validateDeletion without the bound (the 17-coordinate deletion is stored).
func TestDeletionCoordinatesAreBounded(t *testing.T) {
	t.Parallel()
	f := newFixture(t, "coordinate-bound.example", 0)
	key := f.key()
	pk := key.PublicKeyHex()
	tags := nostr.Tags{}
	for i := 0; i < ingest.MaxDeletionCoordinates; i++ {
		tags = append(tags, nostr.Tag{"a", fmt.Sprintf("30023:%s:d%d", pk, i)})
	}
	f.store(f.sign(key, nostr.KindDeletion, "", tags, f.base+10))
	over := append(tags, nostr.Tag{"a", "30023:" + pk + ":one-more"}, nostr.Tag{"e", strings.Repeat("a", 64)})
	f.rejected(f.sign(key, nostr.KindDeletion, "", over, f.base+11),
		fmt.Sprintf("invalid: a deletion may name at most %d coordinates (a tags); send several deletions", ingest.MaxDeletionCoordinates))
}

// TestAddressableDTagFitsItsCoordinate: an addressable event whose
// coordinate (<kind>:<pubkey>:<d>) is longer than nostr.MaxCoordinateLen
// is refused with invalid:. Such a slot could not be deleted by
// coordinate (a deletion's a tag is bounded), and a d tag beyond about
// 2,700 bytes failed the address index: an internal error the client was
// told to retry. Mutation killed: validate without the check (the 954-byte
// d tag is stored, the 2,800-byte one answers an internal error).
func TestAddressableDTagFitsItsCoordinate(t *testing.T) {
	t.Parallel()
	f := newFixture(t, "long-d.example", 0)
	key := f.key()
	pk := key.PublicKeyHex()
	longest := strings.Repeat("d", nostr.MaxCoordinateLen-len("30023:"+pk+":"))
	article := f.store(f.sign(key, 30023, "fits", nostr.Tags{{"d", longest}}, f.base+10))
	f.store(f.sign(key, nostr.KindDeletion, "", nostr.Tags{{"a", "30023:" + pk + ":" + longest}}, f.base+20))
	require.Zero(t, f.count(`SELECT count(*) FROM events WHERE encode(id, 'hex') = $1 AND deleted_at IS NULL`, article.ID),
		"the longest d tag accepted can be deleted by its coordinate")

	want := "invalid: d tag too long: the event's coordinate <kind>:<pubkey>:<d> must be at most 1024 bytes, so that a deletion can name it"
	// Incompressible, so that PostgreSQL cannot squeeze it into the index.
	var noise strings.Builder
	for i := 0; noise.Len() < 2800; i++ {
		sum := sha256.Sum256([]byte(fmt.Sprint(i)))
		noise.WriteString(hex.EncodeToString(sum[:]))
	}
	for _, d := range []string{longest + "d", noise.String()} {
		f.rejected(f.sign(key, 30023, "too long", nostr.Tags{{"d", d}}, f.base+30), want)
	}
}
