package ingest

import (
	"context"
	"encoding/hex"
	"errors"
	"slices"
	"strconv"

	"github.com/google/uuid"

	"github.com/buzzrelay/buzz/internal/db"
	"github.com/buzzrelay/buzz/internal/nostr"
)

// deletionHandler implements NIP-09: a kind 5 event soft-deletes the
// author's own events named by its e tags, and every version of the author's
// a-coordinates created at or before the deletion. Requests naming other
// authors' events change nothing (the SQL matches on the author). A request
// naming one of the author's channel moderation events is refused whole: an
// admin who removed members could otherwise hide that they did, as no 9005
// may.
//
// A deletion is stored as readable as its targets: it is bound to the
// channel of the author's own events it names, and refused when those lie
// in several channels or mix a channel with community-global events (the
// client sends one deletion per channel). Otherwise its e and k tags would
// tell every reader which private-channel events were deleted.
var deletionHandler = Handler{Validate: validateDeletion, Prepare: prepareDeletion, Apply: applyDeletion}

// MaxDeletionCoordinates bounds the a tags of one deletion. Each coordinate
// costs round trips and holds a slot lock (an advisory lock, one entry in
// PostgreSQL's shared lock table) until the event's group commits: a
// deletion naming 2,000 made-up slots of its author held a group writer for
// a third of a second, and a group of them filled the lock table ("out of
// shared memory") for every session of the cluster. A group of
// ingest.DefaultGroupMax deletions at this bound holds 512 slot locks.
const MaxDeletionCoordinates = 16

const deletionOfModerationRefused = "a deletion cannot hide the channel's moderation events (9000-9002, 9005, 9007, 9008): they are its account of who did what"

// validateDeletion also refuses any a tag not spelled canonically: the
// database keeps an older version of a deleted slot out by matching the
// literal coordinate, so a loose spelling would hide the current version
// and let an older one back in.
func validateDeletion(ev *nostr.Event) error {
	targets, coordinates := false, 0
	for _, tag := range ev.Tags {
		if len(tag) < 2 || (tag[0] != "e" && tag[0] != "a") {
			continue
		}
		targets = true
		if tag[0] == "a" {
			if coordinates++; coordinates > MaxDeletionCoordinates {
				return Reject("invalid", "a deletion may name at most %d coordinates (a tags); send several deletions", MaxDeletionCoordinates)
			}
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

// DeletionTargetIDs returns the e tag values that are event ids: the events
// a kind 5 or a 9005 names.
func DeletionTargetIDs(ev *nostr.Event) [][]byte {
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
// what they wrote there, visible to its members only (see
// checkDeletionByFormerWriter for what such a deletion may carry).
func prepareDeletion(ctx context.Context, w *Write) error {
	author := w.ActorBytes()
	scopes := map[uuid.UUID]bool{} // uuid.Nil: community-global; true: a target there is live
	named := deletionTargets{ids: map[string]bool{}, slots: map[string]bool{}, kinds: map[string]bool{}}
	add := func(channel *uuid.UUID, live bool, kind int32) {
		scope := uuid.Nil
		if channel != nil {
			scope = *channel
		}
		scopes[scope] = scopes[scope] || live
		named.kinds[strconv.Itoa(int(kind))] = true
	}
	if ids := DeletionTargetIDs(w.Event); len(ids) > 0 {
		rows, err := w.Q.EventChannelsByAuthorIDs(ctx, db.EventChannelsByAuthorIDsParams{CommunityID: w.Tenant.ID(), Ids: ids, Author: author})
		if err != nil {
			return err
		}
		for _, row := range rows {
			if row.ChannelID != nil && slices.Contains(KindsKeptFromModeration, row.Kind) {
				return Reject("restricted", deletionOfModerationRefused)
			}
			add(row.ChannelID, row.Live, row.Kind)
			named.ids[hex.EncodeToString(row.ID)] = true
		}
	}
	for _, c := range ownCoordinates(w.Event) {
		rows, err := w.Q.EventChannelsByAddress(ctx, db.EventChannelsByAddressParams{
			CommunityID: w.Tenant.ID(), Author: author, Kind: int32(c.Kind), DTag: slotDTag(c), Until: w.Event.CreatedAt,
		})
		if err != nil {
			return err
		}
		for _, row := range rows {
			add(row.ChannelID, row.HasLive, int32(c.Kind))
			named.slots[c.String()] = named.slots[c.String()] || row.HasLive
		}
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
	for scope, hasLive := range scopes {
		if scope == uuid.Nil {
			continue
		}
		err := BindChannelForWrite(ctx, w, scope)
		var rej *Rejection
		if !errors.As(err, &rej) {
			return err // nil: the author may write there, so the deletion is like any event
		}
		w.ChannelID = &scope
		return checkDeletionByFormerWriter(w.Event, hasLive, named)
	}
	return nil
}

// deletionTargets are what a deletion names that exists: the author's event
// ids (hex), their slots with a version to hide (a tag values) and the
// kinds of both (k tag values).
type deletionTargets struct{ ids, slots, kinds map[string]bool }

// checkDeletionByFormerWriter bounds what a deletion stores in a channel its
// author can no longer write in (removed from it, or it is archived or
// deleted). The deletion is kept for the channel's members, so without these
// rules a removed member could go on posting there: naming an old, already
// deleted message again and again, with any text in the content or in tags.
// Such a deletion must hide something still live, and carries nothing but
// its targets: every e, a and k tag names one of the author's events, live
// slots or their kinds, since a made-up id or coordinate carries text too.
func checkDeletionByFormerWriter(ev *nostr.Event, hasLive bool, named deletionTargets) error {
	const cannotWrite = "you can no longer write in this channel, so a deletion there"
	if !hasLive {
		return Reject("restricted", "%s must name an event of yours that is not yet deleted", cannotWrite)
	}
	if ev.Content != "" {
		return Reject("restricted", "%s must have empty content", cannotWrite)
	}
	for _, tag := range ev.Tags {
		if len(tag) != 2 || !named.has(tag) {
			return Reject("restricted", "%s may carry only e, a and k tags with one value each, naming your events there, their live slots and their kinds", cannotWrite)
		}
	}
	return nil
}

// recheckTargetsUnderLock reads the named events again once the deletion's
// insert holds its author's deletion lock (events_record_deletion_targets):
// an event of the author still in flight when prepareDeletion read was not
// there to bind the deletion to its channel or to refuse it, and its
// insert, holding the lock shared, has committed by now. A moderation event
// among them refuses the deletion as prepareDeletion would have, and one in
// another channel than the deletion's would leave the deletion readable
// where its target is not; run again (errDeletionTargetMoved), it gets the
// answer the committed targets give.
func recheckTargetsUnderLock(ctx context.Context, w *Write, ids [][]byte) error {
	rows, err := w.Q.EventChannelsByAuthorIDs(ctx, db.EventChannelsByAuthorIDsParams{CommunityID: w.Tenant.ID(), Ids: ids, Author: w.ActorBytes()})
	if err != nil {
		return err
	}
	for _, row := range rows {
		if row.ChannelID != nil && slices.Contains(KindsKeptFromModeration, row.Kind) {
			return Reject("restricted", deletionOfModerationRefused)
		}
		if !sameChannel(row.ChannelID, w.ChannelID) {
			return errDeletionTargetMoved
		}
	}
	return nil
}

// errDeletionTargetMoved says a target committed, while the deletion was
// being written, in another channel than the one the deletion was bound
// to. Nothing is wrong with the event: a group writer runs it again alone
// (retryAlone), where prepareDeletion reads the committed target; only a
// second such race, or a pipeline without groups, answers it.
var errDeletionTargetMoved = Reject("invalid", "an event this deletion names was stored in another channel while the deletion was being written: send it again")

func sameChannel(a, b *uuid.UUID) bool {
	if a == nil || b == nil {
		return a == b
	}
	return *a == *b
}

// has reports whether tag names one of the targets.
func (t deletionTargets) has(tag nostr.Tag) bool {
	switch tag[0] {
	case "e":
		return t.ids[tag[1]]
	case "a":
		return t.slots[tag[1]]
	case "k":
		return t.kinds[tag[1]]
	}
	return false
}

func applyDeletion(ctx context.Context, w *Write) error {
	q, tenant, ev := w.Q, w.Tenant, w.Event
	author := ev.PubKeyBytes()
	if ids := DeletionTargetIDs(ev); len(ids) > 0 {
		if err := recheckTargetsUnderLock(ctx, w, ids); err != nil {
			return err
		}
		if _, err := q.EventsDeleteByIDs(ctx, db.EventsDeleteByIDsParams{
			CommunityID: tenant.ID(), Ids: ids, Author: author[:], KeptKinds: KindsKeptFromModeration, Now: w.SQLNow(),
		}); err != nil {
			return err
		}
		// A deleted reaction event takes its reaction row with it (trigger
		// reactions_remove_hidden, for every statement that hides a kind 7).
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
		// A version committed meanwhile (the slot lock waited for it) may
		// lie in another channel than prepareDeletion saw.
		rows, err := q.EventChannelsByAddress(ctx, db.EventChannelsByAddressParams{
			CommunityID: tenant.ID(), Author: author[:], Kind: params.Kind, DTag: params.DTag, Until: ev.CreatedAt,
		})
		if err != nil {
			return err
		}
		for _, row := range rows {
			if !sameChannel(row.ChannelID, w.ChannelID) {
				return errDeletionTargetMoved
			}
		}
		if _, err := q.EventsDeleteByAddress(ctx, params); err != nil {
			return err
		}
	}
	return nil
}
