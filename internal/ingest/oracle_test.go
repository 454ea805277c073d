package ingest_test

import (
	"errors"
	"fmt"
	"testing"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/buzzrelay/buzz/internal/ingest"
	"github.com/buzzrelay/buzz/internal/nostr"
)

// TestUnreadableAndUnknownAnswerAlike: for every write that names a channel
// or a target event, an outsider gets the same answer for a private
// channel (or its event) as for an id that does not exist, so the answers
// reveal nothing. Mutations killed: a reaction to a private-channel event
// answering "restricted:" (unknown ids answer "not found"); 9021 and the
// admin kinds answering "channel is private" / "only owners and admins"
// for a private channel but "unknown channel" for a random UUID.
func TestUnreadableAndUnknownAnswerAlike(t *testing.T) {
	t.Parallel()
	f := newFixture(t, "oracle.example", 0)
	owner, outsider := f.key(), f.key()
	private := f.channel(owner, true)
	secret := f.store(f.sign(owner, ingest.KindChat, "members only", nostr.Tags{{"h", private}}, 0))
	unknownChannel, unknownEvent := uuid.NewString(), fmt.Sprintf("%064x", 99)

	answer := func(ev *nostr.Event) string {
		t.Helper()
		_, err := f.submit(ev)
		var rej *ingest.Rejection
		require.True(t, errors.As(err, &rej), "want a rejection, got %v", err)
		return rej.Error()
	}
	for _, kind := range []int{ingest.KindChat, ingest.KindJoinRequest, ingest.KindLeaveRequest, ingest.KindPutUser,
		ingest.KindRemoveUser, ingest.KindEditMetadata, ingest.KindDeleteEvent, ingest.KindDeleteGroup, 1, ingest.KindEmojiSet} {
		tags := func(ch string) nostr.Tags {
			return nostr.Tags{{"h", ch}, {"p", owner.PublicKeyHex()}, {"e", secret.ID}, {"d", "x"}, {"name", "n"}}
		}
		forPrivate := answer(f.sign(outsider, kind, "", tags(private), 0))
		forUnknown := answer(f.sign(outsider, kind, "", tags(unknownChannel), 0))
		require.Equal(t, forUnknown, forPrivate, "kind %d", kind)
	}

	react := func(target string) string {
		return answer(f.sign(outsider, nostr.KindReaction, "+", nostr.Tags{{"e", target}}, 0))
	}
	require.Equal(t, react(unknownEvent), react(secret.ID))
}

// TestReactionsToGiftWrapsAreRefused: someone else's gift wrap answers like
// an unknown id; the recipient's own cannot take a reaction either (it
// would be stored where everyone reads it). Mutation killed: the reaction
// target lookup ignoring p-gating (the outsider's reaction was stored).
func TestReactionsToGiftWrapsAreRefused(t *testing.T) {
	t.Parallel()
	f := newFixture(t, "wrap-reaction.example", 0)
	alice, mallory := f.key(), f.key()
	wrap := f.sign(f.key(), nostr.KindGiftWrap, "ciphertext", nostr.Tags{{"p", alice.PublicKeyHex()}}, 0)
	_, err := f.p.Submit(f.ctx, f.tenant, alice.PublicKeyHex(), wrap)
	require.NoError(t, err)

	f.rejected(f.sign(mallory, nostr.KindReaction, "+", nostr.Tags{{"e", wrap.ID}}, 0), "invalid: reaction target event not found")
	f.rejected(f.sign(alice, nostr.KindReaction, "+", nostr.Tags{{"e", wrap.ID}}, 0), "invalid: kind 1059 events take no reactions")
	require.Zero(t, f.count(`SELECT count(*) FROM reactions`))
}

// TestDatabaseRulesAnswerWithFixedTexts: a write the schema refuses (the
// last owner leaving) is answered with the rule's fixed text, never the
// server's message, which quoted the channel id. Mutation killed: mapError
// forwarding pgErr.Message for 23514.
func TestDatabaseRulesAnswerWithFixedTexts(t *testing.T) {
	t.Parallel()
	f := newFixture(t, "fixed-texts.example", 0)
	owner := f.key()
	ch := f.channel(owner, false)
	f.rejected(f.sign(owner, ingest.KindLeaveRequest, "", nostr.Tags{{"h", ch}}, 0),
		"restricted: a channel must keep an owner: make someone else owner first")
}
