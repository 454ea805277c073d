package outbox

import (
	"context"
	"encoding/hex"

	"github.com/google/uuid"

	"github.com/buzzrelay/buzz/internal/clock"
	"github.com/buzzrelay/buzz/internal/db"
	"github.com/buzzrelay/buzz/internal/nostr"
)

// isMessageKind reports whether events of kind notify listeners: stream
// message (9), stream message v2 (40002), forum post (45001) and forum
// comment (45003). Text notes and edits (40003) do not.
func isMessageKind(kind int) bool {
	switch kind {
	case 9, 40002, 45001, 45003:
		return true
	}
	return false
}

// targetOf returns the pubkey a p tag names, if its value hex-decodes to
// exactly 32 bytes (either case); other values are skipped silently.
func targetOf(tag nostr.Tag) (b [32]byte, ok bool) {
	if len(tag) < 2 || tag[0] != "p" || len(tag[1]) != 64 {
		return b, false
	}
	_, err := hex.Decode(b[:], []byte(tag[1]))
	return b, err == nil
}

// Mentions reports whether ev may create outbox rows: a message kind with at
// least one p tag naming a pubkey. Cheap enough for ingest's SideRows.Needs;
// whether a listener registered the target is only known to Enqueue.
func Mentions(ev *nostr.Event) bool {
	if !isMessageKind(ev.Kind) {
		return false
	}
	for _, tag := range ev.Tags {
		if _, ok := targetOf(tag); ok {
			return true
		}
	}
	return false
}

// mentionTargets returns the distinct p-tag pubkeys of ev, first seen first.
func mentionTargets(ev *nostr.Event) [][]byte {
	var out [][]byte
	seen := map[[32]byte]struct{}{}
	for _, tag := range ev.Tags {
		b, ok := targetOf(tag)
		if !ok {
			continue
		}
		if _, dup := seen[b]; !dup {
			seen[b] = struct{}{}
			out = append(out, b[:])
		}
	}
	return out
}

// Enqueue inserts one outbox row per (registered listener, mentioned target)
// of ev, through q: call it in the event's transaction, and only when the
// event row was newly inserted (a duplicate must enqueue nothing). It
// returns at most 10 of the new row ids, the ones to Offer to the local
// Worker after a successful commit, and how many rows were inserted in all.
// Events that are not messages, or mention nobody, cost no query.
// now (at most one; default the wall clock) dates the rows: their retention
// and first due time start then.
func Enqueue(ctx context.Context, q *db.Queries, communityID uuid.UUID, ev *nostr.Event, now ...clock.Clock) (kept []uuid.UUID, inserted int64, err error) {
	if !isMessageKind(ev.Kind) {
		return nil, 0, nil
	}
	targets := mentionTargets(ev)
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
	}
	if len(now) > 0 {
		params.Now = now[0].SQL()
	}
	row, err := q.OutboxEnqueueMentions(ctx, params)
	if err != nil {
		return nil, 0, err
	}
	return row.KeptIds, row.Inserted, nil
}
