package ingest

import (
	"context"
	"encoding/hex"
	"errors"

	"github.com/google/uuid"

	"github.com/buzzrelay/buzz/internal/db"
	"github.com/buzzrelay/buzz/internal/dberr"
	"github.com/buzzrelay/buzz/internal/nostr"
)

// EmitWaking is Emit for a relay-signed event written to wake the pubkeys
// it p-tags (a workflow's doorbell, an approval request): in this same
// transaction it also writes the side rows marked Wakes, so its mentions
// get their mention rows and operator-listener outbox rows, capped like a
// user's message. Their after-commit work (the outbox hand-off to this
// process's worker) runs with the write's, after commit only; a rollback
// (a workflow step fenced out by a lost claim, say) leaves no trace of them.
//
// Plain Emit writes none, on purpose: the relay's other events p-tag people
// as data, not to wake them. A members list (39002) names every member of a
// channel, so each membership change would write thousands of mention rows;
// the admins list and the member added/removed notifications (44100/44101)
// describe state that clients read by kind, and nobody should be paged by
// them.
//
// A channel message (kind 9) that replies (NIP-10 e tags) also gets its
// thread metadata, so thread views count and show it like a user's reply.
// Where a user's reply would be refused (the parent is not a live event of
// the channel, or the thread is too deep), the relay's message is stored
// without thread metadata instead: its tags still point at its cause, and a
// workflow's notice must not be lost to the shape of a thread.
func (w *Write) EmitWaking(ctx context.Context, kind int, content string, tags nostr.Tags, channel *uuid.UUID) error {
	if err := w.Emit(ctx, kind, content, tags, channel); err != nil {
		return err
	}
	ev := w.LastEmitted()
	woken := &Write{Tenant: w.Tenant, Event: ev, Actor: ev.PubKey, Q: w.Q, ChannelID: channel, pipeline: w.pipeline}
	if kind == KindChat && channel != nil {
		// A refusal is decided before any statement fails, so the
		// transaction is still good after one.
		var rej *Rejection
		if err := applyThreadReply(ctx, woken); err != nil && !errors.As(err, &rej) {
			return err
		}
	}
	// The side rows' rollback steps are w's even if a later one fails:
	// that error rolls back w's transaction, with what they reserved.
	defer func() { w.onRollback = append(w.onRollback, woken.onRollback...) }()
	for _, s := range w.pipeline.sideRows {
		if s.Wakes && s.Needs(ev) {
			if err := s.Apply(ctx, woken); err != nil {
				return err
			}
		}
	}
	w.afterCommit = append(w.afterCommit, woken.afterCommit...)
	return nil
}

// EmitReaction stores a relay-signed kind 7 with the reaction row a user's
// reaction gets, in this transaction, so the relay's reaction counts
// wherever a user's does. content and tags follow the user rules: the
// target is the last e tag holding an event id, the emoji rules are the
// same, the reaction lives in the target's channel (an h tag must name
// it), and p-gated or unknown targets are refused with a *Rejection, as is
// a target in an archived channel. It runs no other side rows: the relay's
// reaction fires no workflow.
//
// It returns the id of the relay's active reaction. When the relay already
// has this emoji active on the target (two workflows reacting alike to one
// message), nothing new is stored and the earlier reaction's id is
// returned: like any reactor, the relay holds one reaction per target and
// emoji, and the reaction asked for is there.
func (w *Write) EmitReaction(ctx context.Context, content string, tags nostr.Tags) (string, error) {
	draft := &nostr.Event{Kind: nostr.KindReaction, Content: content, Tags: tags}
	if err := validateReaction(draft); err != nil {
		return "", err
	}
	key, err := w.pipeline.relayKey(ctx, w.Tenant.ID())
	if err != nil {
		return "", err
	}
	relay := key.PublicKey()
	targetID, _ := reactionTarget(draft)
	notFound := Reject("invalid", "reaction target event not found")
	target, err := w.Q.EventReactionTarget(ctx, db.EventReactionTargetParams{
		CommunityID: w.Tenant.ID(), ID: targetID[:], ReaderHex: hex.EncodeToString(relay[:]), Now: w.Now(),
	})
	if dberr.IsNotFound(err) {
		return "", notFound
	}
	if err != nil {
		return "", err
	}
	if nostr.IsPGated(int(target.Kind)) {
		return "", Reject("invalid", "kind %d events take no reactions", target.Kind)
	}
	if target.ChannelID != nil {
		access, err := ChannelAccess(ctx, w.Q, db.ChannelAccessParams{CommunityID: w.Tenant.ID(), ID: *target.ChannelID, Pubkey: relay[:]})
		if dberr.IsNotFound(err) {
			return "", notFound
		}
		if err != nil {
			return "", err
		}
		if access.ArchivedAt != nil {
			return "", Reject("restricted", "channel is archived")
		}
		w.ReadChannel(*target.ChannelID, access)
	}
	if err := checkChannelTags(&Write{Event: draft, ChannelID: target.ChannelID}); err != nil {
		return "", err
	}
	emoji, _ := ReactionEmoji(content, tags)
	ev, err := w.relaySign(ctx, nostr.KindReaction, content, tags)
	if err != nil {
		return "", err
	}
	own := ev.IDBytes()
	// The row first: when the relay already reacted alike, no second event
	// is stored for a reaction that does not count.
	n, err := w.Q.ReactionUpsert(ctx, db.ReactionUpsertParams{
		CommunityID: w.Tenant.ID(), EventCreatedAt: target.CreatedAt, EventID: targetID[:],
		Pubkey: relay[:], Emoji: emoji, ChannelID: target.ChannelID, ReactionEventID: own[:], Now: w.SQLNow(),
	})
	if err != nil {
		return "", err
	}
	if n == 0 {
		earlier, err := w.Q.ReactionActiveEventID(ctx, db.ReactionActiveEventIDParams{
			CommunityID: w.Tenant.ID(), EventCreatedAt: target.CreatedAt, EventID: targetID[:], Pubkey: relay[:], Emoji: emoji,
		})
		return hex.EncodeToString(earlier), err
	}
	if err := w.storeEmitted(ctx, ev, target.ChannelID); err != nil {
		return "", err
	}
	return ev.ID, nil
}
