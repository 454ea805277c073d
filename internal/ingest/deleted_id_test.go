package ingest_test

import (
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/buzzrelay/buzz/internal/dberr"
	"github.com/buzzrelay/buzz/internal/fanout"
	"github.com/buzzrelay/buzz/internal/ingest"
	"github.com/buzzrelay/buzz/internal/nostr"
)

// An event whose author deleted its id (e tag) before it arrived here is
// refused like an older version of a deleted address: answered as
// superseded, never stored. Only the author's own deletion in the same
// community counts; a deletion hidden by a moderator still does, as for an
// address. A kind 5 cannot be deleted, so one named by another is stored.
// Mutations killed: without the trigger events_deleted_id_refused (061) the
// note arrives Stored and live; with it named to fire after
// events_keep_newest_version, the refused v2 has already removed v1.
func TestEventDeletedBeforeItArrivesStaysDeleted(t *testing.T) {
	t.Parallel()
	f := newFixture(t, "deleted-id.example", 0)
	alice, bob, owner := f.key(), f.key(), f.key()
	live := `SELECT count(*) FROM events WHERE encode(id, 'hex') = $1 AND deleted_at IS NULL`
	arrives := func(ev *nostr.Event) ingest.Outcome {
		t.Helper()
		out, err := f.submit(ev)
		require.NoError(t, err)
		return out
	}

	note := f.sign(alice, nostr.KindTextNote, "deleted elsewhere first", nil, f.base)
	f.store(f.sign(alice, nostr.KindDeletion, "", nostr.Tags{{"e", note.ID}}, f.base+10))
	require.Equal(t, ingest.Superseded, arrives(note))
	require.Zero(t, f.count(`SELECT count(*) FROM events WHERE encode(id, 'hex') = $1`, note.ID), "refused, not stored")
	require.Equal(t, ingest.Superseded, arrives(note), "sent again, the same answer")

	// Another author's deletion naming the id changes nothing.
	bobs := f.sign(bob, nostr.KindTextNote, "bob's", nil, f.base)
	f.store(f.sign(alice, nostr.KindDeletion, "", nostr.Tags{{"e", bobs.ID}}, f.base+10))
	require.Equal(t, ingest.Stored, arrives(bobs))

	// Neither does the author's deletion in another community.
	elsewhere := f.community("deleted-id-other.example")
	moved := f.sign(alice, nostr.KindTextNote, "stored in the other community", nil, f.base)
	f.store(f.sign(alice, nostr.KindDeletion, "", nostr.Tags{{"e", moved.ID}}, f.base+10))
	out, err := f.p.Submit(f.ctx, elsewhere, moved.PubKey, moved)
	require.NoError(t, err)
	require.Equal(t, ingest.Stored, out)

	// A newer version of a replaceable slot, deleted by id: refused, and the
	// version stored before stays the slot's head (the refusal must come
	// before the slot trigger removes older versions).
	v1 := f.store(f.sign(alice, nostr.KindMetadata, `{"name":"v1"}`, nil, f.base))
	v2 := f.sign(alice, nostr.KindMetadata, `{"name":"v2"}`, nil, f.base+5)
	f.store(f.sign(alice, nostr.KindDeletion, "", nostr.Tags{{"e", v2.ID}}, f.base+10))
	require.Equal(t, ingest.Superseded, arrives(v2))
	require.Equal(t, 1, f.count(live, v1.ID), "the older version stays")

	// A deletion hidden by a channel moderator keeps its id deleted.
	ch := f.channel(owner, false)
	f.store(f.sign(alice, ingest.KindJoinRequest, "", nostr.Tags{{"h", ch}}, 0))
	message := f.sign(alice, ingest.KindChat, "in the channel", nostr.Tags{{"h", ch}}, 0)
	deletion := f.store(f.sign(alice, nostr.KindDeletion, "", nostr.Tags{{"e", message.ID}, {"h", ch}}, 0))
	f.store(f.sign(owner, ingest.KindDeleteEvent, "", nostr.Tags{{"h", ch}, {"e", deletion.ID}}, 0))
	require.Zero(t, f.count(live, deletion.ID), "the deletion is hidden")
	require.Equal(t, ingest.Superseded, arrives(message))

	// A deletion named by a later one is not deleted, and one named first
	// is stored when it arrives.
	first := f.sign(alice, nostr.KindDeletion, "", nostr.Tags{{"e", bobs.ID}}, f.base+20)
	f.store(f.sign(alice, nostr.KindDeletion, "", nostr.Tags{{"e", first.ID}}, f.base+30))
	require.Equal(t, ingest.Stored, arrives(first))
	require.Equal(t, 1, f.count(live, first.ID))
}

// A channel moderation event whose id its author deleted before it arrived
// is refused with a blocked: answer, neither stored nor applied: the
// author's retraction stands whoever replays the event, and the moderator's
// client is not told it succeeded. Every other kind, in a channel as well,
// is still answered as superseded.
// Mutations killed: the trigger skipping the moderation event as any other
// (each answered Superseded, no error); the rule missing from mapError
// (answered "invalid: ..."); the kind check dropped from the trigger (the
// chat message and the join request refused with blocked:); 064 as it was
// (each stored and applied).
func TestModerationEventDeletedBeforeItArrivesIsRefused(t *testing.T) {
	t.Parallel()
	f := newFixture(t, "deleted-moderation.example", 0)
	owner, bob, carol := f.key(), f.key(), f.key()
	ch := f.channel(owner, true)
	// signedThenDeleted signs an event and stores its author's deletion of
	// its id before it is sent.
	signedThenDeleted := func(key *nostr.SecretKey, kind int, tags nostr.Tags) *nostr.Event {
		t.Helper()
		ev := f.sign(key, kind, "", tags, 0)
		f.store(f.sign(key, nostr.KindDeletion, "", nostr.Tags{{"e", ev.ID}}, ev.CreatedAt))
		return ev
	}
	arrives := func(ev *nostr.Event) ingest.Outcome {
		t.Helper()
		out, err := f.submit(ev)
		require.NoError(t, err)
		return out
	}
	member := func(key *nostr.SecretKey) int {
		return f.count(`SELECT count(*) FROM channel_members
			WHERE channel_id = $1 AND encode(pubkey, 'hex') = $2 AND removed_at IS NULL`, ch, key.PublicKeyHex())
	}
	const refused = "blocked: its author deleted this event before it arrived here, so it is not applied"

	put := signedThenDeleted(owner, ingest.KindPutUser, nostr.Tags{{"h", ch}, {"p", bob.PublicKeyHex()}})
	f.rejected(put, refused)
	require.Zero(t, member(bob), "the retracted grant adds nobody")
	f.rejected(put, refused) // sent again, the same answer

	f.store(f.sign(owner, ingest.KindPutUser, "", nostr.Tags{{"h", ch}, {"p", bob.PublicKeyHex()}}, put.CreatedAt-1))
	remove := signedThenDeleted(owner, ingest.KindRemoveUser, nostr.Tags{{"h", ch}, {"p", bob.PublicKeyHex()}})
	f.rejected(remove, refused)
	require.Equal(t, 1, member(bob), "the retracted removal removes nobody")

	other := uuid.NewString()
	create := signedThenDeleted(owner, ingest.KindCreateGroup, nostr.Tags{{"h", other}, {"name", "created after its deletion"}})
	f.rejected(create, refused)
	require.Zero(t, f.count(`SELECT count(*) FROM channels WHERE id = $1`, other), "no channel is created")

	drop := signedThenDeleted(owner, ingest.KindDeleteGroup, nostr.Tags{{"h", ch}})
	f.rejected(drop, refused)
	require.Equal(t, 1, f.count(`SELECT count(*) FROM channels WHERE id = $1 AND deleted_at IS NULL`, ch), "the channel stays")

	// Any other kind is still answered as superseded, in a channel too.
	message := signedThenDeleted(owner, ingest.KindChat, nostr.Tags{{"h", ch}})
	require.Equal(t, ingest.Superseded, arrives(message))
	require.Zero(t, f.count(`SELECT count(*) FROM events WHERE encode(id, 'hex') = $1`, message.ID))
	open := f.channel(owner, false)
	join := signedThenDeleted(carol, ingest.KindJoinRequest, nostr.Tags{{"h", open}})
	require.Equal(t, ingest.Superseded, arrives(join))
	require.Zero(t, f.count(`SELECT count(*) FROM channel_members WHERE channel_id = $1 AND encode(pubkey, 'hex') = $2`,
		open, carol.PublicKeyHex()), "a refused join request joins nobody")
}

// A retracted moderation event refused by the group writer fails only
// itself. A moderation event changes its channel's row, so it is a group of
// its own (takeLocked); the events queued around it, plain notes, chat
// messages and another moderator's grant, are stored and applied in the
// groups before and after it.
func TestRetractedModerationEventRefusedAloneInItsGroup(t *testing.T) {
	t.Parallel()
	f := newFixture(t, "deleted-moderation-group.example", 0)
	f.grouped(ingest.Options{})
	f.recordTransactions()
	owner, bob, carol := f.key(), f.key(), f.key()
	ch := f.channel(owner, false)
	retracted := f.sign(owner, ingest.KindPutUser, "", nostr.Tags{{"h", ch}, {"p", bob.PublicKeyHex()}}, 0)
	f.store(f.sign(owner, nostr.KindDeletion, "", nostr.Tags{{"e", retracted.ID}}, retracted.CreatedAt))

	g := f.holdWriter()
	before := []*nostr.Event{
		f.sign(owner, 1111, "plain before", nil, 0),
		f.sign(owner, ingest.KindChat, "said before", nostr.Tags{{"h", ch}}, 0),
	}
	grant := f.sign(owner, ingest.KindPutUser, "", nostr.Tags{{"h", ch}, {"p", carol.PublicKeyHex()}}, 0)
	after := []*nostr.Event{
		f.sign(owner, 1111, "plain after", nil, 0),
		f.sign(owner, ingest.KindChat, "said after", nostr.Tags{{"h", ch}}, 0),
	}
	batch := []*nostr.Event{before[0], before[1], retracted, grant, after[0], after[1]}
	// Queued one at a time, so the groups are [before], [retracted],
	// [grant], [after].
	var results []chan result
	for i, ev := range batch {
		results = append(results, f.submitTogether([]*nostr.Event{ev})...)
		waitQueued(t, f.p, i+1)
	}
	g.open(t)

	for i, ev := range batch {
		got := <-results[i]
		if ev == retracted {
			requireRejection(t, got.err, "blocked: its author deleted this event before it arrived here, so it is not applied")
			continue
		}
		require.NoError(t, got.err, "event %d", i)
		require.Equal(t, ingest.Stored, got.outcome, "event %d", i)
	}
	require.Zero(t, f.count(`SELECT count(*) FROM events WHERE encode(id, 'hex') = $1`, retracted.ID))
	require.Equal(t, 1, f.transactions(before...), "the events before it commit in one group")
	require.Equal(t, 1, f.transactions(after...), "the events after it commit in one group")
	members := func(key *nostr.SecretKey) int {
		return f.count(`SELECT count(*) FROM channel_members
			WHERE channel_id = $1 AND encode(pubkey, 'hex') = $2 AND removed_at IS NULL`, ch, key.PublicKeyHex())
	}
	require.Zero(t, members(bob), "the retracted grant adds nobody")
	require.Equal(t, 1, members(carol), "the next grant took effect")
}

// A deletion by id and its target committing at the same moment, on two
// pipelines (as on two relay processes), never leave the target live,
// whichever commits first. Each case holds one event's transaction open at
// its end, submits the other, waits until the other waits for a lock (or is
// done), then lets the first commit: the interleaving in which each misses
// the other's uncommitted row. Then both are raced freely, many times.
//
// Mutations killed: without either advisory lock of 061 (the shared one in
// events_refuse_deleted_id, the exclusive one in
// events_record_deletion_targets, or both), in "deletion first" the
// target's probe misses the uncommitted deletion target, and in "target
// first" the deletion's UPDATE misses the uncommitted target: the target
// stays live, in every case, and in 11-24 of the 200 free races.
func TestIDDeletionRacingItsTarget(t *testing.T) {
	t.Parallel()
	for _, first := range []string{"deletion", "target"} {
		t.Run(first+" first", func(t *testing.T) {
			t.Parallel()
			f := newFixture(t, "id-delrace-"+first+".example", 4)
			key := f.key()
			target := f.sign(key, nostr.KindTextNote, "late note", nil, f.base)
			deletion := f.sign(key, nostr.KindDeletion, "", nostr.Tags{{"e", target.ID}}, f.base+10)
			held, other := deletion, target
			if first == "target" {
				held, other = target, deletion
			}

			require.NoError(t, commitAfterBlocked(t, f, held, other))
			require.Zero(t, f.count(`SELECT count(*) FROM events WHERE encode(id, 'hex') = $1 AND deleted_at IS NULL`, target.ID),
				"a deleted note came back")
		})
	}

	t.Run("raced freely", func(t *testing.T) {
		t.Parallel()
		f := newFixture(t, "id-delrace-free.example", 8)
		secondProcess := ingest.New(f.pool, fanout.NewHub(), ingest.Options{MaxFutureSkew: time.Minute})
		const rounds = 200
		targets := make([]string, 0, rounds)
		for i := range rounds {
			key := f.key()
			target := f.sign(key, nostr.KindTextNote, "late note", nil, f.base+int64(i))
			deletion := f.sign(key, nostr.KindDeletion, "", nostr.Tags{{"e", target.ID}}, f.base+int64(i)+1)
			targets = append(targets, target.ID)
			var wg sync.WaitGroup
			start := make(chan struct{})
			for j, ev := range []*nostr.Event{target, deletion} {
				p := f.p
				if (i+j)%2 == 1 {
					p = secondProcess
				}
				wg.Go(func() {
					<-start
					_, err := p.Submit(f.ctx, f.tenant, ev.PubKey, ev)
					require.NoError(t, err)
				})
			}
			close(start)
			wg.Wait()
		}
		require.Zero(t, f.count(`SELECT count(*) FROM events WHERE encode(id, 'hex') = ANY($1) AND deleted_at IS NULL`, targets),
			"a deleted note came back")
	})
}

// The database's refusal of a deleted id (events_refuse_deleted_id, in
// SQL) raises its named error for exactly the channel kinds the relay keeps
// from moderation and deletion (ingest.KindsKeptFromModeration, in Go) and
// silently skips every other: a kind added to one list and not the other
// would be answered as a success it is not, or as blocked where a
// superseded answer is due. Each kind around the moderation ranges is
// inserted, with its author's deletion of its id recorded first, in a
// channel and outside one.
// Mutations killed: a kind dropped from (or added to) either list.
func TestDeletedIDRefusalNamesTheKindsKeptFromModeration(t *testing.T) {
	t.Parallel()
	f := newFixture(t, "deleted-id-kinds.example", 0)
	owner := f.key()
	ch := uuid.MustParse(f.channel(owner, true))
	author := f.key().PublicKeyHex()
	var kinds []int32
	for k := int32(8999); k <= 9011; k++ {
		kinds = append(kinds, k)
	}
	for k := int32(38999); k <= 39004; k++ {
		kinds = append(kinds, k)
	}
	events := 0
	for _, kind := range kinds {
		for _, channel := range []*uuid.UUID{&ch, nil} {
			events++
			id := fmt.Sprintf("%064x", events)
			var dTag *string
			if kind >= 30000 {
				dTag = new(string)
			}
			_, err := f.pool.Exec(f.ctx, `INSERT INTO event_deletion_targets (community_id, target_id, author)
				VALUES ($1, decode($2, 'hex'), decode($3, 'hex'))`, f.tenant.ID(), id, author)
			require.NoError(t, err)
			stored, err := f.pool.Exec(f.ctx, `INSERT INTO events (community_id, id, pubkey, created_at, kind, tags, content, sig, channel_id, d_tag)
				VALUES ($1, decode($2, 'hex'), decode($3, 'hex'), now(), $4, '[]', '', decode(repeat('00', 64), 'hex'), $5, $6)`,
				f.tenant.ID(), id, author, kind, channel, dTag)
			if channel != nil && slices.Contains(ingest.KindsKeptFromModeration, kind) {
				v, ok := dberr.AsViolation(err)
				require.True(t, ok, "kind %d in a channel: want the named refusal, got %v", kind, err)
				require.Equal(t, "events_moderation_deleted_before_arrival", v.Constraint)
				continue
			}
			require.NoError(t, err, "kind %d in a channel: %v", kind, channel != nil)
			require.Zero(t, stored.RowsAffected(), "kind %d in a channel: %v is skipped", kind, channel != nil)
		}
	}
}
