package ingest

import (
	"context"

	"github.com/google/uuid"

	"github.com/buzzrelay/buzz/internal/db"
	"github.com/buzzrelay/buzz/internal/nostr"
)

// deletionHandler implements NIP-09: a kind 5 event soft-deletes the
// author's own events named by its e tags, and every version of the author's
// a-coordinates created at or before the deletion. Requests naming other
// authors' events change nothing (the SQL matches on the author).
//
// A deletion is stored as readable as its targets: it is bound to the
// channel of the author's own events it names, and refused when those lie
// in several channels or mix a channel with community-global events (the
// client sends one deletion per channel). Otherwise its e and k tags would
// tell every reader which private-channel events were deleted.
var deletionHandler = Handler{Validate: validateDeletion, Prepare: prepareDeletion, Apply: applyDeletion}

// validateDeletion also refuses any a tag not spelled canonically: the
// database keeps an older version of a deleted slot out by matching the
// literal coordinate, so a loose spelling would hide the current version
// and let an older one back in.
func validateDeletion(ev *nostr.Event) error {
	targets := false
	for _, tag := range ev.Tags {
		if len(tag) < 2 || (tag[0] != "e" && tag[0] != "a") {
			continue
		}
		targets = true
		if tag[0] == "a" {
			if _, err := nostr.ParseCoordinate(tag[1]); err != nil {
				return Reject("invalid", "a tag %q: %v", truncate(tag[1], 80), err)
			}
		}
	}
	if !targets {
		return Reject("invalid", "a deletion request needs at least one e or a tag")
	}
	return nil
}

// truncate shortens s for an error message.
func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "..."
}

// deletionTargetIDs returns the e tag values that are event ids.
func deletionTargetIDs(ev *nostr.Event) [][]byte {
	var ids [][]byte
	for _, v := range ev.Tags.Values("e") {
		if id, ok := nostr.DecodeHex32(v); ok {
			ids = append(ids, id[:])
		}
	}
	return ids
}

// ownCoordinates returns the author's own replaceable/addressable slots the
// a tags name (validateDeletion refused any other spelling).
func ownCoordinates(ev *nostr.Event) []nostr.Coordinate {
	var out []nostr.Coordinate
	for _, v := range ev.Tags.Values("a") {
		if c, err := nostr.ParseCoordinate(v); err == nil && c.PubKey == ev.PubKey {
			out = append(out, c)
		}
	}
	return out
}

// slotDTag is the d_tag column value of a coordinate's slot.
func slotDTag(c nostr.Coordinate) *string {
	if nostr.IsAddressable(c.Kind) {
		return &c.D
	}
	return nil
}

// prepareDeletion binds the deletion to the one channel its targets are
// in (see deletionHandler). An h tag, if any, must name that channel and
// passes the usual write check; without one the deletion follows its
// targets, so an author removed from a private channel can still delete
// what they wrote there, visible to its members only.
func prepareDeletion(ctx context.Context, w *Write) error {
	author := w.ActorBytes()
	scopes := map[uuid.UUID]bool{} // uuid.Nil: community-global
	add := func(channels []*uuid.UUID) {
		for _, ch := range channels {
			if ch == nil {
				scopes[uuid.Nil] = true
			} else {
				scopes[*ch] = true
			}
		}
	}
	if ids := deletionTargetIDs(w.Event); len(ids) > 0 {
		channels, err := w.Q.EventChannelsByAuthorIDs(ctx, db.EventChannelsByAuthorIDsParams{CommunityID: w.Tenant.ID(), Ids: ids, Author: author})
		if err != nil {
			return err
		}
		add(channels)
	}
	for _, c := range ownCoordinates(w.Event) {
		channels, err := w.Q.EventChannelsByAddress(ctx, db.EventChannelsByAddressParams{
			CommunityID: w.Tenant.ID(), Author: author, Kind: int32(c.Kind), DTag: slotDTag(c),
		})
		if err != nil {
			return err
		}
		add(channels)
	}
	if len(scopes) > 1 {
		return Reject("invalid", "a deletion may name events of one channel, or only community-global events: send one deletion per channel")
	}
	if w.Event.Tags.First("h") != nil {
		if err := resolveChannelForWrite(ctx, w); err != nil {
			return err
		}
		for scope := range scopes {
			if scope != *w.ChannelID {
				return Reject("invalid", "the h tag must name the channel of the events being deleted")
			}
		}
		return nil
	}
	for scope := range scopes {
		if scope != uuid.Nil {
			w.ChannelID = &scope
		}
	}
	return nil
}

func applyDeletion(ctx context.Context, w *Write) error {
	q, tenant, ev := w.Q, w.Tenant, w.Event
	author := ev.PubKeyBytes()
	if ids := deletionTargetIDs(ev); len(ids) > 0 {
		if _, err := q.EventsDeleteByIDs(ctx, db.EventsDeleteByIDsParams{
			CommunityID: tenant.ID(), Ids: ids, Author: author[:], Now: w.SQLNow(),
		}); err != nil {
			return err
		}
		// A deleted reaction event takes its reaction with it.
		if _, err := q.ReactionsRemoveByEvents(ctx, db.ReactionsRemoveByEventsParams{
			CommunityID: tenant.ID(), ReactionEventIds: ids, Author: author[:], Now: w.SQLNow(),
		}); err != nil {
			return err
		}
	}
	for _, c := range ownCoordinates(ev) {
		params := db.EventsDeleteByAddressParams{
			CommunityID: tenant.ID(), Author: author[:], Kind: int32(c.Kind), Until: ev.CreatedAt, DTag: slotDTag(c), Now: w.SQLNow(),
		}
		if err := q.EventSlotLock(ctx, db.EventSlotLockParams{
			CommunityID: tenant.ID(), Pubkey: author[:], Kind: params.Kind, DTag: params.DTag,
		}); err != nil {
			return err
		}
		if _, err := q.EventsDeleteByAddress(ctx, params); err != nil {
			return err
		}
	}
	return nil
}
