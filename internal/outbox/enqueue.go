package outbox

import (
	"context"
	"time"

	"github.com/google/uuid"

	"github.com/buzzrelay/buzz/internal/clock"
	"github.com/buzzrelay/buzz/internal/db"
	"github.com/buzzrelay/buzz/internal/nostr"
)

// isMessageKind reports whether events of kind notify listeners: stream
// message (9), stream message v2 (40002), forum post (45001), forum
// comment (45003), and a workflow's approval request (46010), which names
// the approver who must act before the run goes on. Only the relay signs
// 46010 (clients' are refused before any side row), so no user can page a
// listener with it. Text notes and edits (40003) do not notify.
func isMessageKind(kind int) bool {
	switch kind {
	case 9, 40002, 45001, 45003, 46010:
		return true
	}
	return false
}

// Mentions reports whether ev may create outbox rows: a message kind with at
// least one p tag naming a pubkey (nostr.MentionedPubkey, the rule mention
// rows use too). Cheap enough for ingest's SideRows.Needs; whether a
// listener registered the target is only known to Enqueue.
func Mentions(ev *nostr.Event) bool {
	if !isMessageKind(ev.Kind) {
		return false
	}
	for _, tag := range ev.Tags {
		if _, ok := nostr.MentionedPubkey(tag); ok {
			return true
		}
	}
	return false
}

// mentionTargets returns the first maxTargets distinct p-tag pubkeys of ev
// (all when maxTargets <= 0), first seen first.
func mentionTargets(ev *nostr.Event, maxTargets int) [][]byte {
	pubkeys := nostr.MentionedPubkeys(ev.Tags, maxTargets)
	out := make([][]byte, 0, len(pubkeys))
	for _, pk := range pubkeys {
		b, _ := nostr.DecodeHex32(pk)
		out = append(out, b[:])
	}
	return out
}

// Handoff holds the outbox rows Enqueue claimed for the local worker, for
// Offer after the event's transaction commits.
type Handoff struct {
	claims []claim
	// room is the hand-off room the claims hold until Offer or Abandon.
	room *roomReservation
	// leftToPoll counts the rows of listeners the worker routes that the
	// claim had no room for (the hand-off was full): Offer wakes the poll
	// for them, which would otherwise find them only at its idle timer.
	leftToPoll int64
}

// Len is the number of claimed rows.
func (h Handoff) Len() int { return len(h.claims) }

// Empty reports whether there is nothing to Offer: no claimed row and no
// row left for the worker's poll to be woken for.
func (h Handoff) Empty() bool { return len(h.claims) == 0 && h.leftToPoll == 0 }

// IDs are the claimed rows' ids.
func (h Handoff) IDs() []uuid.UUID {
	ids := make([]uuid.UUID, len(h.claims))
	for i, c := range h.claims {
		ids[i] = c.row.ID
	}
	return ids
}

// Enqueue inserts one outbox row per (registered listener, mentioned target)
// of ev, through q: call it in the event's transaction, and only when the
// event row was newly inserted (a duplicate must enqueue nothing). The rows
// of listeners w routes, as many as w's hand-off channel has room for (10
// at most) less what the claims of transactions still open reserved, are
// inserted already claimed for w: Offer the returned Handoff (unless it is
// Empty) to w once the transaction committed, and w delivers them without a
// claim round trip, and polls for the rows of its listeners left pending
// once its hand-off is empty; after a rollback, Abandon it (the claims hold hand-off room until
// one or the other). A nil w (no listeners on this pod) claims nothing; the other
// rows wait for the poll of a pod that routes them. inserted counts every
// row. Events that are not messages, or mention nobody, cost no query. Only
// the first maxTargets mentioned pubkeys count (the relay passes the cap its
// mention rows use, so a delivered mention always has its mention row).
// channelID is the event's channel (nil: none); a target that may not read
// it gets no row. now dates the rows: their retention, first due time and
// lease start then.
func Enqueue(ctx context.Context, q *db.Queries, w *Worker, communityID uuid.UUID, channelID *uuid.UUID, ev *nostr.Event, maxTargets int, now clock.Clock) (h Handoff, inserted int64, err error) {
	if !isMessageKind(ev.Kind) {
		return Handoff{}, 0, nil
	}
	targets := mentionTargets(ev, maxTargets)
	if len(targets) == 0 {
		return Handoff{}, 0, nil
	}
	id := ev.IDBytes()
	claimID := uuid.New()
	params := db.OutboxEnqueueMentionsParams{
		CommunityID:    communityID,
		ChannelID:      channelID,
		EventID:        id[:],
		EventKind:      int32(ev.Kind),
		EventCreatedAt: ev.CreatedAt,
		Targets:        targets,
		Routable:       [][]byte{},
		ClaimID:        claimID,
		Now:            now.SQL(),
	}
	if w != nil {
		// Reserved before the statement, so that concurrent events (the
		// rest of this one's commit group among them) see the room taken.
		// At most one row per (target, listener) can be claimed.
		h.room = w.reserveRoom(len(targets) * len(w.routable))
		params.Routable, params.LeaseMs = w.routable, w.lease.Milliseconds()
		if h.room != nil {
			params.ClaimMax = int32(h.room.rows)
		}
	}
	sent := now.Now()
	row, err := q.OutboxEnqueueMentions(ctx, params)
	if err != nil {
		w.releaseRoom(h.room)
		return Handoff{}, 0, err
	}
	if w.keepRoom(h.room, len(row.ClaimedIds)); len(row.ClaimedIds) == 0 {
		h.room = nil
	}
	h.leftToPoll = row.LeftToPoll
	h.claims = make([]claim, len(row.ClaimedIds))
	for i, rowID := range row.ClaimedIds {
		h.claims[i] = claim{claimID: claimID, row: db.OutboxClaimDueRow{
			ID:             rowID,
			ListenerPubkey: row.ClaimedListeners[i],
			TargetPubkey:   row.ClaimedTargets[i],
			CommunityID:    communityID,
			Host:           row.Host,
			EventID:        id[:],
			EventKind:      int32(ev.Kind),
			EventCreatedAt: time.Unix(ev.CreatedAt, 0),
			Attempts:       1,
			LeaseLeftMs:    row.LeaseLeftMs,
		}, leaseEnds: leaseEndsAfter(sent, row.LeaseLeftMs)}
	}
	w.signAhead(h.claims)
	return h, row.Inserted, nil
}
