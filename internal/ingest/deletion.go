package ingest

import (
	"context"
	"strconv"
	"strings"

	"github.com/buzzrelay/buzz/internal/db"
	"github.com/buzzrelay/buzz/internal/nostr"
)

// deletionHandler implements NIP-09: a kind 5 event soft-deletes the
// author's own events named by its e tags, and every version of the author's
// a-coordinates created at or before the deletion. Requests naming other
// authors' events change nothing (the SQL matches on the author).
var deletionHandler = Handler{Validate: validateDeletion, Apply: applyDeletion}

func validateDeletion(ev *nostr.Event) error {
	for _, tag := range ev.Tags {
		if len(tag) >= 2 && (tag[0] == "e" || tag[0] == "a") {
			return nil
		}
	}
	return Reject("invalid", "a deletion request needs at least one e or a tag")
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
	for _, v := range ev.Tags.Values("a") {
		kind, pubkey, d, ok := parseCoordinate(v)
		if !ok || pubkey != ev.PubKey {
			continue
		}
		params := db.EventsDeleteByAddressParams{
			CommunityID: tenant.ID(), Author: author[:], Kind: int32(kind), Until: ev.CreatedAt, Now: w.SQLNow(),
		}
		if nostr.IsAddressable(kind) {
			params.DTag = &d
		} else if !nostr.IsReplaceable(kind) {
			continue
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

// parseCoordinate splits "kind:pubkey:d-tag" (NIP-01 addressable coordinate).
func parseCoordinate(v string) (kind int, pubkey, d string, ok bool) {
	kindStr, rest, found := strings.Cut(v, ":")
	if !found {
		return 0, "", "", false
	}
	pubkey, d, _ = strings.Cut(rest, ":")
	kind, err := strconv.Atoi(kindStr)
	if err != nil || kind < 0 || kind > nostr.MaxKind || !nostr.IsHex64(pubkey) {
		return 0, "", "", false
	}
	return kind, pubkey, d, true
}
