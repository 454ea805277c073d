package ingest

import (
	"context"

	"github.com/buzzrelay/buzz/internal/db"
	"github.com/buzzrelay/buzz/internal/nostr"
)

// deletionHandler implements NIP-09: a kind 5 event soft-deletes the
// author's own events named by its e tags, and every version of the author's
// a-coordinates created at or before the deletion. Requests naming other
// authors' events change nothing (the SQL matches on the author).
var deletionHandler = Handler{Validate: validateDeletion, Apply: applyDeletion}

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

func applyDeletion(ctx context.Context, w *Write) error {
	q, tenant, ev := w.Q, w.Tenant, w.Event
	author := ev.PubKeyBytes()
	var ids [][]byte
	for _, v := range ev.Tags.Values("e") {
		if id, ok := nostr.DecodeHex32(v); ok {
			ids = append(ids, id[:])
		}
	}
	if len(ids) > 0 {
		if _, err := q.EventsDeleteByIDs(ctx, db.EventsDeleteByIDsParams{
			CommunityID: tenant.ID(), Ids: ids, Author: author[:],
		}); err != nil {
			return err
		}
		// A deleted reaction event takes its reaction with it.
		if _, err := q.ReactionsRemoveByEvents(ctx, db.ReactionsRemoveByEventsParams{
			CommunityID: tenant.ID(), ReactionEventIds: ids, Author: author[:],
		}); err != nil {
			return err
		}
	}
	for _, v := range ev.Tags.Values("a") {
		c, err := nostr.ParseCoordinate(v)
		if err != nil || c.PubKey != ev.PubKey {
			continue
		}
		params := db.EventsDeleteByAddressParams{
			CommunityID: tenant.ID(), Author: author[:], Kind: int32(c.Kind), Until: ev.CreatedAt,
		}
		if nostr.IsAddressable(c.Kind) {
			params.DTag = &c.D
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
