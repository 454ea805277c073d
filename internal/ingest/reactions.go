package ingest

import (
	"context"

	"github.com/buzzrelay/buzz/internal/db"
	"github.com/buzzrelay/buzz/internal/dberr"
	"github.com/buzzrelay/buzz/internal/nostr"
)

// reactionHandler implements NIP-25 with custom emoji: the target is the
// last e tag holding an event id, the channel is the target's (never the
// client's h tag), and each reactor has at most one active row per
// (target, emoji).
var reactionHandler = Handler{Validate: validateReaction, Prepare: prepareReaction, Apply: applyReaction}

// emojiSetHandler checks the shortcodes of emoji sets and lists.
var emojiSetHandler = Handler{Validate: validateEmojiTags}

// reactionTarget returns the last e tag value that is an event id.
func reactionTarget(ev *nostr.Event) ([32]byte, bool) {
	for i := len(ev.Tags) - 1; i >= 0; i-- {
		if tag := ev.Tags[i]; len(tag) >= 2 && tag[0] == "e" {
			if id, ok := nostr.DecodeHex32(tag[1]); ok {
				return id, true
			}
		}
	}
	return [32]byte{}, false
}

func validateReaction(ev *nostr.Event) error {
	if _, ok := reactionTarget(ev); !ok {
		return Reject("invalid", "a reaction needs an e tag with the target event id")
	}
	_, err := ReactionEmoji(ev.Content, ev.Tags)
	return err
}

// prepareReaction binds the reaction to its target's channel, where the
// reactor must be allowed to write. A target the reactor cannot read (in a
// private channel it is not a member of, or a p-gated event such as someone
// else's gift wrap) is answered exactly like an unknown id, so a reaction
// cannot probe what exists. p-gated events take no reactions at all: the
// reaction would be stored where everyone reads it.
func prepareReaction(ctx context.Context, w *Write) error {
	notFound := Reject("invalid", "reaction target event not found")
	id, _ := reactionTarget(w.Event)
	target, err := w.Q.EventReactionTarget(ctx, db.EventReactionTargetParams{CommunityID: w.Tenant.ID(), ID: id[:], ReaderHex: w.Actor, Now: w.Now()})
	if dberr.IsNotFound(err) {
		return notFound
	}
	if err != nil {
		return err
	}
	if nostr.IsPGated(int(target.Kind)) {
		if !target.ReaderIsParty {
			return notFound
		}
		return Reject("invalid", "kind %d events take no reactions", target.Kind)
	}
	w.state = &target
	if target.ChannelID != nil {
		if err := BindChannelForWrite(ctx, w, *target.ChannelID); err != nil {
			if IsUnknownChannel(err) {
				return notFound
			}
			return err
		}
	}
	return nil
}

func applyReaction(ctx context.Context, w *Write) error {
	id, _ := reactionTarget(w.Event)
	target := w.state.(*db.EventReactionTargetRow)
	emoji, _ := ReactionEmoji(w.Event.Content, w.Event.Tags)
	own := w.Event.IDBytes()
	n, err := w.Q.ReactionUpsert(ctx, db.ReactionUpsertParams{
		CommunityID: w.Tenant.ID(), EventCreatedAt: target.CreatedAt, EventID: id[:],
		Pubkey: w.ActorBytes(), Emoji: emoji, ChannelID: target.ChannelID, ReactionEventID: own[:], Now: w.SQLNow(),
	})
	if err != nil {
		return err
	}
	if n == 0 {
		return Reject("duplicate", "reaction already exists")
	}
	return nil
}
