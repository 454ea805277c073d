package ingest_test

import (
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/buzzrelay/buzz/internal/ingest"
	"github.com/buzzrelay/buzz/internal/nostr"
)

type reactionRow struct {
	emoji, reactionEvent string
	channel              *uuid.UUID
	removed              bool
}

func (f *fixture) reactions(target string) []reactionRow {
	f.t.Helper()
	rows, err := f.pool.Query(f.ctx, `
		SELECT emoji, coalesce(encode(reaction_event_id, 'hex'), ''), channel_id, removed_at IS NOT NULL
		FROM reactions WHERE community_id = $1 AND encode(event_id, 'hex') = $2 ORDER BY emoji, created_at`, f.tenant.ID(), target)
	require.NoError(f.t, err)
	defer rows.Close()
	var out []reactionRow
	for rows.Next() {
		var r reactionRow
		require.NoError(f.t, rows.Scan(&r.emoji, &r.reactionEvent, &r.channel, &r.removed))
		out = append(out, r)
	}
	require.NoError(f.t, rows.Err())
	return out
}

func (f *fixture) eventChannel(id string) *uuid.UUID {
	f.t.Helper()
	var ch *uuid.UUID
	require.NoError(f.t, f.pool.QueryRow(f.ctx, `SELECT channel_id FROM events WHERE encode(id, 'hex') = $1`, id).Scan(&ch))
	return ch
}

// A reaction takes its channel from the target event, never from the
// client's h tag: an h tag naming another channel is refused (it would show
// the reaction under that channel), and a global target gives a global
// reaction.
func TestReactionChannelComesFromTheTarget(t *testing.T) {
	t.Parallel()
	f := newFixture(t, "react-channel.example", 0)
	alice, bob := f.key(), f.key()
	ch, decoy := f.channel(alice, false), f.channel(bob, false)
	chID := uuid.MustParse(ch)
	msg := f.store(f.sign(alice, 9, "hello", nostr.Tags{{"h", ch}}, f.base))
	note := f.store(f.sign(alice, 1, "global", nil, f.base))

	_, err := f.p.Submit(f.ctx, f.tenant, bob.PublicKeyHex(), f.sign(bob, 7, "", nostr.Tags{{"e", msg.ID}, {"h", decoy}}, 0))
	require.ErrorContains(t, err, "invalid: every h tag must name the event's channel")

	// The target is the last e tag holding an event id.
	r := f.store(f.sign(bob, 7, "", nostr.Tags{{"e", note.ID}, {"e", msg.ID}, {"e", "junk"}, {"p", alice.PublicKeyHex()}}, 0))
	require.Equal(t, &chID, f.eventChannel(r.ID))
	require.Equal(t, []reactionRow{{emoji: "+", reactionEvent: r.ID, channel: &chID}}, f.reactions(msg.ID))
	require.Empty(t, f.reactions(note.ID))

	_, err = f.p.Submit(f.ctx, f.tenant, bob.PublicKeyHex(), f.sign(bob, 7, "🔥", nostr.Tags{{"e", note.ID}, {"h", decoy}}, 0))
	require.ErrorContains(t, err, "invalid: kind 7 cannot carry an h tag", "a global target binds no channel")
	g := f.store(f.sign(bob, 7, "🔥", nostr.Tags{{"e", note.ID}}, 0))
	require.Nil(t, f.eventChannel(g.ID))
	require.Equal(t, []reactionRow{{emoji: "🔥", reactionEvent: g.ID}}, f.reactions(note.ID))
}

func TestReactionTargetMustBeLiveAndWritable(t *testing.T) {
	t.Parallel()
	f := newFixture(t, "react-access.example", 0)
	alice, bob := f.key(), f.key()
	private := f.channel(alice, true)
	secret := f.store(f.sign(alice, 9, "members only", nostr.Tags{{"h", private}}, f.base))
	gone := f.store(f.sign(alice, 1, "deleted", nil, f.base))
	f.store(f.sign(alice, 5, "", nostr.Tags{{"e", gone.ID}}, f.base+1))

	f.rejected(f.sign(bob, 7, "+", nostr.Tags{{"e", fmt.Sprintf("%064x", 7)}}, 0), "invalid: reaction target event not found")
	f.rejected(f.sign(bob, 7, "+", nostr.Tags{{"e", gone.ID}}, 0), "invalid: reaction target event not found")
	f.rejected(f.sign(bob, 7, "+", nostr.Tags{{"e", "abc"}}, 0), "invalid: a reaction needs an e tag with the target event id")
	f.rejected(f.sign(bob, 7, "+", nostr.Tags{{"e", secret.ID}}, 0), "invalid: reaction target event not found")
	// Same target id in another community: not found there.
	other := f.community("react-access-other.example")
	cross := f.sign(alice, 7, "+", nostr.Tags{{"e", secret.ID}}, 0)
	_, err := f.p.Submit(f.ctx, other, cross.PubKey, cross)
	require.EqualError(t, err, "invalid: reaction target event not found")

	f.store(f.sign(alice, 7, "+", nostr.Tags{{"e", secret.ID}}, 0))
	require.Equal(t, 1, f.count(`SELECT count(*) FROM reactions`))
}

// One active row per (target, reactor, emoji): a second reaction event with
// the same emoji is refused and not stored; deleting the reaction event
// (NIP-09, same author) removes the row, and reacting again brings it back.
func TestReactionDuplicatesAndDeletion(t *testing.T) {
	t.Parallel()
	f := newFixture(t, "react-dup.example", 0)
	alice, bob := f.key(), f.key()
	note := f.store(f.sign(alice, 1, "note", nil, f.base))
	e := nostr.Tag{"e", note.ID}

	first := f.store(f.sign(bob, 7, "+", nostr.Tags{e, {"p", alice.PublicKeyHex()}}, f.base+1))
	// Empty content is "+": the same reaction.
	again := f.sign(bob, 7, "", nostr.Tags{e, {"p", alice.PublicKeyHex()}}, f.base+2)
	f.rejected(again, "duplicate: reaction already exists")
	require.Zero(t, f.count(`SELECT count(*) FROM event_mentions WHERE encode(event_id, 'hex') = $1`, again.ID), "the refused event's side rows roll back")
	// Another emoji, and another reactor, are separate reactions.
	f.store(f.sign(bob, 7, "-", nostr.Tags{e}, f.base+3))
	f.store(f.sign(alice, 7, "+", nostr.Tags{e}, f.base+4))
	// Resubmitting the same event is an event duplicate, not a reaction one.
	out, err := f.submit(first)
	require.NoError(t, err)
	require.Equal(t, ingest.Duplicate, out)

	// Only the reactor's own deletion removes the reaction.
	f.store(f.sign(alice, 5, "", nostr.Tags{{"e", first.ID}}, f.base+5))
	require.Equal(t, 3, f.count(`SELECT count(*) FROM reactions WHERE removed_at IS NULL`))
	f.store(f.sign(bob, 5, "", nostr.Tags{{"e", first.ID}}, f.base+6))
	require.Equal(t, 2, f.count(`SELECT count(*) FROM reactions WHERE removed_at IS NULL`))

	// Reacting again revives the row with the new reaction event.
	revived := f.store(f.sign(bob, 7, "+", nostr.Tags{e}, f.base+7))
	var live string
	require.NoError(t, f.pool.QueryRow(f.ctx, `
		SELECT encode(reaction_event_id, 'hex') FROM reactions
		WHERE encode(pubkey, 'hex') = $1 AND emoji = '+' AND removed_at IS NULL`, bob.PublicKeyHex()).Scan(&live))
	require.Equal(t, revived.ID, live)
	require.Equal(t, 3, f.count(`SELECT count(*) FROM reactions`))
}

// A moderator's 9005 hiding a member's reaction removes its row as the
// author's own kind 5 does: the hidden reaction no longer counts, and the
// member's next identical reaction is stored (it would otherwise be refused
// as a duplicate of a reaction nobody can see, and fire no workflow).
// Mutation killed: dropping the trigger reactions_remove_hidden (migration
// 025) leaves the hidden reaction's row active, which then refuses the new
// reaction as "duplicate: reaction already exists"; it also fails
// TestReactionDuplicatesAndDeletion, whose kind 5 relies on the same trigger.
func TestModeratorHidingAReactionRemovesItsRow(t *testing.T) {
	t.Parallel()
	f := newFixture(t, "react-9005.example", 0)
	owner, bob := f.key(), f.key()
	ch := f.channel(owner, false)
	msg := f.store(f.sign(owner, 9, "hello", nostr.Tags{{"h", ch}}, f.base))
	hidden := f.store(f.sign(bob, 7, "+", nostr.Tags{{"e", msg.ID}}, f.base+1))
	f.store(f.sign(owner, ingest.KindDeleteEvent, "", nostr.Tags{{"h", ch}, {"e", hidden.ID}}, f.base+2))
	require.Zero(t, f.count(`SELECT count(*) FROM reactions WHERE removed_at IS NULL`), "the hidden reaction no longer counts")

	again := f.store(f.sign(bob, 7, "+", nostr.Tags{{"e", msg.ID}}, f.base+3))
	chID := uuid.MustParse(ch)
	require.Equal(t, []reactionRow{{emoji: "+", reactionEvent: again.ID, channel: &chID}}, f.reactions(msg.ID))
}

// Identical reactions racing: exactly one is stored, the rest are refused as
// duplicates and leave no event row. Mutation killed (tried): dropping the
// upsert's "WHERE reactions.removed_at IS NOT NULL" stores all twelve.
func TestConcurrentIdenticalReactionsStoreOne(t *testing.T) {
	t.Parallel()
	f := newFixture(t, "react-race.example", 16)
	alice, bob := f.key(), f.key()
	note := f.store(f.sign(alice, 1, "note", nil, f.base))
	var wg sync.WaitGroup
	start := make(chan struct{})
	results := make(chan error, 12)
	for i := 0; i < 12; i++ {
		ev := f.sign(bob, 7, "🎉", nostr.Tags{{"e", note.ID}}, f.base+int64(i)+1)
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			_, err := f.submit(ev)
			results <- err
		}()
	}
	close(start)
	wg.Wait()
	close(results)
	stored := 0
	for err := range results {
		if err == nil {
			stored++
			continue
		}
		require.EqualError(t, err, "duplicate: reaction already exists")
	}
	require.Equal(t, 1, stored)
	require.Equal(t, 1, f.count(`SELECT count(*) FROM events WHERE kind = 7`))
	require.Equal(t, 1, f.count(`SELECT count(*) FROM reactions`))
}

// Storage regression: a 64-character shortcode reaction is 66
// characters with its colons, and is stored as sent.
func TestReactionStoresSixtySixCharacterCustomEmoji(t *testing.T) {
	t.Parallel()
	f := newFixture(t, "react-66.example", 0)
	alice, bob := f.key(), f.key()
	ch := f.channel(alice, false)
	msg := f.store(f.sign(alice, 9, "party", nostr.Tags{{"h", ch}}, f.base))
	code := strings.Repeat("party_parrot", 5) + "_max"
	require.Len(t, code, 64)
	f.store(f.sign(bob, 30030, "", nostr.Tags{{"d", "buzz:custom-emoji"}, {"emoji", code, "https://x.example/p.gif"}}, 0))
	r := f.store(f.sign(bob, 7, ":"+code+":", nostr.Tags{{"e", msg.ID}, {"emoji", code, "https://x.example/p.gif"}}, 0))
	var emoji string
	var length int
	require.NoError(t, f.pool.QueryRow(f.ctx, `SELECT emoji, char_length(emoji) FROM reactions WHERE encode(reaction_event_id, 'hex') = $1`, r.ID).Scan(&emoji, &length))
	require.Equal(t, ":"+code+":", emoji)
	require.Equal(t, 66, length)
	// One more character is refused before it reaches the column.
	f.rejected(f.sign(bob, 7, ":"+code+"x:", nostr.Tags{{"e", msg.ID}, {"emoji", code + "x"}}, 0),
		"invalid: emoji shortcode exceeds 64 bytes (got 65)")
}
