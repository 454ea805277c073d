package outbox

import (
	"context"
	"encoding/hex"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/buzzrelay/buzz/internal/clock"
	"github.com/buzzrelay/buzz/internal/db"
	"github.com/buzzrelay/buzz/internal/nostr"
)

// handedOff returns what w's hand-off channel holds now.
func handedOff(w *Worker) []uuid.UUID {
	var ids []uuid.UUID
	for {
		select {
		case id := <-w.handoff:
			ids = append(ids, id)
		default:
			return ids
		}
	}
}

// idleWorker is a worker that is never run: its hand-off channel is
// inspected directly.
func (f *fixture) idleWorker(routes Routes) *Worker {
	d, _, _ := f.deliverer(routes, time.Second, nil)
	return NewWorker(f.pool, routes, d)
}

func TestOnlyMessageKindsAreListenerMentions(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	listener, target := newPubkey(t), newPubkey(t)
	f.register(listener, target)

	for kind, want := range map[int]bool{9: true, 40002: true, 45001: true, 45003: true, 46010: true, 1: false, 40003: false, 7: false, 42: false, 46011: false} {
		ev := message(t, kind, target)
		require.Equal(t, want, Mentions(ev), "kind %d", kind)
		kept, inserted := f.save(ev, nil, true)
		if want {
			require.Len(t, kept, 1, "kind %d", kind)
			require.Equal(t, int64(1), inserted)
			require.Equal(t, kept, f.outboxIDs(ev))
		} else {
			require.Empty(t, kept, "kind %d", kind)
			require.Empty(t, f.outboxIDs(ev), "kind %d", kind)
		}
	}
	require.False(t, Mentions(message(t, 9)), "a message without p tags mentions nobody")
}

func TestMentionTargetsDecodeDedupeAndKeepOrder(t *testing.T) {
	t.Parallel()
	a, b := strings.Repeat("ab", 32), strings.Repeat("0c", 32)
	ev := &nostr.Event{Kind: 9, Tags: nostr.Tags{
		{"p", b},
		{"p", "not-hex"},
		{"p", a[:62]},       // 31 bytes
		{"p", a + "00"},     // 33 bytes
		{"p"},               // no value
		{"e", a},            // not a p tag
		{"p", a, "wss://x"}, // extra elements are fine
		{"p", strings.ToUpper(b)},
		{"p", a},
	}}
	got := mentionTargets(ev, 0)
	require.Equal(t, [][]byte{mustHex(t, b), mustHex(t, a)}, got,
		"values that hex-decode to 32 bytes, either case, deduplicated in first-seen order")
	require.True(t, Mentions(ev))
	require.False(t, Mentions(&nostr.Event{Kind: 9, Tags: nostr.Tags{{"p", "nope"}}}))
}

func TestEnqueueWithoutTargetsRunsNoQuery(t *testing.T) {
	t.Parallel()
	// A nil DBTX would panic if Enqueue ran a query.
	q := db.New(nil)
	for _, ev := range []*nostr.Event{message(t, 9), message(t, 1, newPubkey(t)), message(t, 9, "zz")} {
		kept, inserted, err := Enqueue(context.Background(), q, uuid.New(), ev, 0, clock.Wall())
		require.NoError(t, err)
		require.Empty(t, kept)
		require.Zero(t, inserted)
	}
}

func TestEventInsertEnqueuesRegisteredListenerInSameTransaction(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := newFixture(t)
	listener, target := newPubkey(t), newPubkey(t)
	f.register(listener, target)
	ev := message(t, 45001, target)

	tx, err := f.pool.Begin(ctx)
	require.NoError(t, err)
	defer tx.Rollback(ctx)
	kept, inserted, err := Enqueue(ctx, db.New(tx), f.community, ev, 0, clock.Wall())
	require.NoError(t, err)
	require.Equal(t, int64(1), inserted)
	require.Len(t, kept, 1)
	require.Zero(t, f.outboxCount(), "the row is invisible until the event's transaction commits")
	require.NoError(t, tx.Commit(ctx))

	r, ok := f.row(kept[0])
	require.True(t, ok)
	require.Equal(t, "pending", r.State)
	require.Zero(t, r.Attempts)
	require.Nil(t, r.ClaimID)
	require.LessOrEqual(t, r.DueIn, time.Duration(0), "due at once")
	require.Equal(t, listener, r.ListenerHex)

	var kind int32
	var eventCreated time.Time
	var community uuid.UUID
	var target2, eventID []byte
	require.NoError(t, f.pool.QueryRow(ctx, `
		SELECT event_kind, event_created_at, community_id, target_pubkey, event_id
		FROM operator_listener_outbox WHERE id = $1`, kept[0]).Scan(&kind, &eventCreated, &community, &target2, &eventID))
	require.Equal(t, int32(45001), kind)
	require.Equal(t, ev.CreatedAt, eventCreated.Unix())
	require.Equal(t, f.community, community)
	require.Equal(t, target, hex.EncodeToString(target2))
	require.Equal(t, ev.ID, hex.EncodeToString(eventID))
}

func TestThreadMessageFansOutOnceToMatchingListeners(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	l1, l2, l3 := newPubkey(t), newPubkey(t), newPubkey(t)
	target, other := newPubkey(t), newPubkey(t)
	f.register(l1, target)
	f.register(l2, target, other)
	f.register(l3, other)

	ev := message(t, 9, target)
	kept, inserted := f.save(ev, nil, true)
	require.Equal(t, int64(2), inserted, "one row per listener registered for the target")
	require.ElementsMatch(t, f.outboxIDs(ev), kept)

	// A duplicate event insert enqueues nothing: save skips Enqueue, and
	// even a second Enqueue of the same event inserts nothing.
	kept, inserted = f.save(ev, nil, true)
	require.Empty(t, kept)
	require.Zero(t, inserted)
	kept, inserted, err := Enqueue(context.Background(), f.q, f.community, ev, 0, clock.Wall())
	require.NoError(t, err)
	require.Empty(t, kept)
	require.Zero(t, inserted)
	require.Len(t, f.outboxIDs(ev), 2)
}

func TestEventAndListenerOutboxRollBackTogether(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	listener, target := newPubkey(t), newPubkey(t)
	f.register(listener, target)
	ev := message(t, 9, target)
	kept, inserted := f.save(ev, nil, false)
	require.Len(t, kept, 1, "enqueued inside the transaction")
	require.Equal(t, int64(1), inserted)

	require.Zero(t, f.outboxCount())
	exists, err := f.q.EventExists(context.Background(), db.EventExistsParams{CommunityID: f.community, ID: mustHex(t, ev.ID)})
	require.NoError(t, err)
	require.False(t, exists)
}

// A committed mention hands off exactly its own outbox ids, and an event
// without a registered mention hands off nothing.
func TestCommittedMentionHandsOffExactlyItsOutboxIDs(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	l1, l2, target := newPubkey(t), newPubkey(t), newPubkey(t)
	f.register(l1, target)
	f.register(l2, target)
	w := f.idleWorker(Routes{l1: "https://l1.example", l2: "https://l2.example"})

	ev := message(t, 9, target)
	f.save(ev, w, true)
	require.ElementsMatch(t, f.outboxIDs(ev), handedOff(w))

	f.save(message(t, 9, newPubkey(t)), w, true) // mentions nobody registered
	f.save(message(t, 1, target), w, true)       // not a message kind
	f.save(message(t, 9), w, true)               // mentions nobody
	require.Empty(t, handedOff(w), "an event without a listener mention hands off nothing")
	require.Equal(t, 2, f.outboxCount())
}

// A rolled-back mention leaves no outbox row and hands off nothing.
func TestRolledBackMentionHandsOffNothing(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	listener, target := newPubkey(t), newPubkey(t)
	f.register(listener, target)
	w := f.idleWorker(Routes{listener: "https://l.example"})

	kept, _ := f.save(message(t, 9, target), w, false)
	require.Len(t, kept, 1)
	require.Empty(t, handedOff(w))
	require.Zero(t, f.outboxCount())
}

// The ids kept for the hand-off are bounded in SQL.
func TestMentionWithFiftyListenersKeepsOnlyTenIDs(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	target := newPubkey(t)
	routes := Routes{}
	for range 50 {
		l := newPubkey(t)
		f.register(l, target)
		routes[l] = "https://" + l[:8] + ".example"
	}
	w := f.idleWorker(routes)
	ev := message(t, 9, target)
	kept, inserted := f.save(ev, w, true)
	require.Equal(t, int64(50), inserted)
	require.Len(t, kept, 10)
	all := f.outboxIDs(ev)
	require.Len(t, all, 50)
	require.Subset(t, all, kept)
	require.ElementsMatch(t, kept, handedOff(w))
	require.Equal(t, 10, len(uniq(kept)))
}

func uniq(ids []uuid.UUID) map[uuid.UUID]bool {
	m := map[uuid.UUID]bool{}
	for _, id := range ids {
		m[id] = true
	}
	return m
}

func TestOfferIsBoundedAndNilSafe(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	w := f.idleWorker(Routes{})
	ids := make([]uuid.UUID, 14)
	for i := range ids {
		ids[i] = uuid.New()
	}
	require.Equal(t, 4, w.Offer(ids), "a full channel drops the rest; the poll covers them")
	require.Equal(t, 4.0, testutil.ToFloat64(w.dropped))
	require.Equal(t, ids[:10], handedOff(w))
	var none *Worker
	require.Zero(t, none.Offer(ids), "no worker on this pod: nothing to hand off to")
}
