package outbox

import (
	"context"

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

// Enqueue inserts one outbox row per (registered listener, mentioned target)
// of ev, through q: call it in the event's transaction, and only when the
// event row was newly inserted (a duplicate must enqueue nothing). It
// returns at most 10 of the new row ids, the ones to Offer to the local
// Worker after a successful commit, and how many rows were inserted in all.
// Events that are not messages, or mention nobody, cost no query. Only the
// first maxTargets mentioned pubkeys count (the relay passes the cap its
// mention rows use, so a delivered mention always has its mention row). now
// dates the rows: their retention and first due time start then.
func Enqueue(ctx context.Context, q *db.Queries, communityID uuid.UUID, ev *nostr.Event, maxTargets int, now clock.Clock) (kept []uuid.UUID, inserted int64, err error) {
	if !isMessageKind(ev.Kind) {
		return nil, 0, nil
	}
	targets := mentionTargets(ev, maxTargets)
	if len(targets) == 0 {
		return nil, 0, nil
	}
	id := ev.IDBytes()
	params := db.OutboxEnqueueMentionsParams{
		Keep:           handoffCapacity,
		CommunityID:    communityID,
		EventID:        id[:],
		EventKind:      int32(ev.Kind),
		EventCreatedAt: ev.CreatedAt,
		Targets:        targets,
		Now:            now.SQL(),
	}
	row, err := q.OutboxEnqueueMentions(ctx, params)
	if err != nil {
		return nil, 0, err
	}
	return row.KeptIds, row.Inserted, nil
}
