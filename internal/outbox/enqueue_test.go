package outbox

import (
	"context"
	"encoding/hex"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/buzzrelay/buzz/internal/clock"
	"github.com/buzzrelay/buzz/internal/db"
	"github.com/buzzrelay/buzz/internal/eventstore"
	"github.com/buzzrelay/buzz/internal/nostr"
)

// handedOff returns what w's hand-off channel holds now.
func handedOff(w *Worker) []claim {
	var claims []claim
	for {
		select {
		case c := <-w.handoff:
			claims = append(claims, c)
		default:
			return claims
		}
	}
}

func idsOf(claims []claim) []uuid.UUID {
	ids := make([]uuid.UUID, len(claims))
	for i, c := range claims {
		ids[i] = c.row.ID
	}
	return ids
}

// claimedMention saves a mention of a fresh target registered by l through
// an idle worker routing l, and returns the row claimed at insert for it.
func (f *fixture) claimedMention(l *testListener) claim {
	f.t.Helper()
	target := newPubkey(f.t)
	f.register(l.pubHex, target)
	w := f.idleWorker(routesOf(l))
	f.save(message(f.t, 9, target), w, true)
	claims := handedOff(w)
	require.Len(f.t, claims, 1)
	return claims[0]
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
		_, inserted := f.save(ev, nil, true)
		if want {
			require.Equal(t, int64(1), inserted, "kind %d", kind)
			require.Len(t, f.outboxIDs(ev), 1, "kind %d", kind)
		} else {
			require.Zero(t, inserted, "kind %d", kind)
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
	f0 := newFixture(t)
	for _, ev := range []*nostr.Event{message(t, 9), message(t, 1, newPubkey(t)), message(t, 9, "zz")} {
		claimed, inserted, err := Enqueue(context.Background(), q, f0.idleWorker(Routes{}), uuid.New(), nil, ev, 0, clock.Wall())
		require.NoError(t, err)
		require.Zero(t, claimed.Len())
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
	// No worker on this pod: the row is left to the poll of a pod that
	// routes its listener.
	claimed, inserted, err := Enqueue(ctx, db.New(tx), nil, f.community, nil, ev, 0, clock.Wall())
	require.NoError(t, err)
	require.Equal(t, int64(1), inserted)
	require.Zero(t, claimed.Len())
	require.Zero(t, f.outboxCount(), "the row is invisible until the event's transaction commits")
	require.NoError(t, tx.Commit(ctx))
	kept := f.outboxIDs(ev)
	require.Len(t, kept, 1)

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
	_, inserted := f.save(ev, nil, true)
	require.Equal(t, int64(2), inserted, "one row per listener registered for the target")
	require.Len(t, f.outboxIDs(ev), 2)

	// A duplicate event insert enqueues nothing: save skips Enqueue, and
	// even a second Enqueue of the same event inserts nothing.
	_, inserted = f.save(ev, nil, true)
	require.Zero(t, inserted)
	claimed, inserted, err := Enqueue(context.Background(), f.q, nil, f.community, nil, ev, 0, clock.Wall())
	require.NoError(t, err)
	require.Zero(t, claimed.Len())
	require.Zero(t, inserted)
	require.Len(t, f.outboxIDs(ev), 2)
}

// channel creates a channel of visibility in f's community with members
// (removed lists members whose membership was removed) and returns its id.
func (f *fixture) channel(visibility string, members, removed []string) uuid.UUID {
	f.t.Helper()
	ctx := context.Background()
	id := uuid.New()
	_, err := f.pool.Exec(ctx, `INSERT INTO channels (community_id, id, name, visibility, created_by)
		VALUES ($1, $2, 'c', $3::channel_visibility, $4)`, f.community, id, visibility, mustHex(f.t, newPubkey(f.t)))
	require.NoError(f.t, err)
	for _, pk := range append(members, removed...) {
		_, err = f.pool.Exec(ctx, `INSERT INTO channel_members (community_id, channel_id, pubkey) VALUES ($1, $2, $3)`,
			f.community, id, mustHex(f.t, pk))
		require.NoError(f.t, err)
	}
	for _, pk := range removed {
		_, err = f.pool.Exec(ctx, `UPDATE channel_members SET removed_at = now() WHERE community_id = $1 AND channel_id = $2 AND pubkey = $3`,
			f.community, id, mustHex(f.t, pk))
		require.NoError(f.t, err)
	}
	return id
}

// A mention pages a target's listener only when the target may read the
// event: a private channel's active member yes; an outsider or a removed
// member no (the POST would tell them the channel's event id, kind and
// time); anyone for an open channel or an event without a channel.
// Mutations killed: no read check in OutboxEnqueueMentions (the outsider
// and the removed member of the private channel get rows); the check
// ignoring removed_at (the removed member gets one); the check ignoring
// visibility = 'open' (the open channel's outsider gets none); a NULL
// channel treated as unreadable (the channel-less mention gets none).
func TestMentionIsEnqueuedOnlyForTargetsThatMayReadItsChannel(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	listener := newPubkey(t)
	member, removed, outsider := newPubkey(t), newPubkey(t), newPubkey(t)
	f.register(listener, member, removed, outsider)
	private := f.channel("private", []string{member}, []string{removed})
	open := f.channel("open", nil, nil)

	enqueued := func(channel *uuid.UUID) []string {
		t.Helper()
		ev := message(t, 9, member, removed, outsider)
		_, _, err := Enqueue(context.Background(), f.q, nil, f.community, channel, ev, 0, clock.Wall())
		require.NoError(t, err)
		id := ev.IDBytes()
		rows, err := f.pool.Query(context.Background(),
			`SELECT encode(target_pubkey, 'hex') FROM operator_listener_outbox WHERE event_id = $1`, id[:])
		require.NoError(t, err)
		targets, err := pgx.CollectRows(rows, pgx.RowTo[string])
		require.NoError(t, err)
		return targets
	}
	require.ElementsMatch(t, []string{member}, enqueued(&private), "private channel: only its active member")
	require.ElementsMatch(t, []string{member, removed, outsider}, enqueued(&open), "open channel: everyone")
	require.ElementsMatch(t, []string{member, removed, outsider}, enqueued(nil), "no channel: everyone")
}

func TestEventAndListenerOutboxRollBackTogether(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	listener, target := newPubkey(t), newPubkey(t)
	f.register(listener, target)
	ev := message(t, 9, target)
	_, inserted := f.save(ev, nil, false)
	require.Equal(t, int64(1), inserted, "enqueued inside the transaction")

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
	require.ElementsMatch(t, f.outboxIDs(ev), idsOf(handedOff(w)))

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

// The rows claimed for the hand-off are bounded in SQL: ten are claimed,
// the other forty are left to the poll.
func TestMentionWithFiftyListenersClaimsOnlyTen(t *testing.T) {
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
	require.ElementsMatch(t, kept, idsOf(handedOff(w)))
	require.Equal(t, 10, len(uniq(kept)))
	sending := 0
	for _, id := range all {
		if r, _ := f.row(id); r.State == "sending" {
			sending++
		}
	}
	require.Equal(t, 10, sending, "only the handed-off rows are claimed")
}

func uniq(ids []uuid.UUID) map[uuid.UUID]bool {
	m := map[uuid.UUID]bool{}
	for _, id := range ids {
		m[id] = true
	}
	return m
}

// Offer never blocks: what does not fit in the 10-row channel is counted
// and handed back to the poll (pending, due at once, the attempt not
// spent) instead of waiting out its lease.
//
// Kills: Offer dropping claimed rows without releasing them (checked): they
// stay 'sending' until their 30 s lease expires.
func TestOfferIsBoundedReleasesWhatDoesNotFitAndIsNilSafe(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	l := newListener(t, nil)
	saving := f.idleWorker(routesOf(l))
	var claims []claim
	for range 14 {
		target := newPubkey(t)
		f.register(l.pubHex, target)
		f.save(message(t, 9, target), saving, true)
		claims = append(claims, handedOff(saving)...)
	}
	require.Len(t, claims, 14)

	w := f.idleWorker(routesOf(l))
	require.Equal(t, 4, w.Offer(Handoff{claims: claims}), "a full channel drops the rest; the poll covers them")
	require.Equal(t, 4.0, testutil.ToFloat64(w.dropped))
	require.Equal(t, claims[:10], handedOff(w))
	for _, c := range claims[10:] {
		require.Eventually(t, func() bool {
			r, ok := f.row(c.row.ID)
			return ok && r.State == "pending" && r.Attempts == 0 && r.DueIn <= 0
		}, waitLong, 10*time.Millisecond, "a dropped row is handed back to the poll at once")
	}
	for _, c := range claims[:10] {
		r, _ := f.row(c.row.ID)
		require.Equal(t, "sending", r.State, "a handed-off row stays claimed")
		require.Equal(t, c.claimID, *r.ClaimID)
	}

	var none *Worker
	require.Zero(t, none.Offer(Handoff{claims: claims}), "no worker on this pod: nothing to hand off to")
}

// A row claimed at insert looks exactly like one the poll claimed: sending
// under the hand-off's claim id, attempt 1, leased for the worker's lease
// from the injected clock; and the hand-off carries what the delivery needs.
//
// Kills: claiming at insert without the lease or the attempt (checked with
// lease_until = now and attempts = 0 in OutboxEnqueueMentions); claiming
// rows of a listener this pod does not route (checked with "claimed" not
// requiring routable).
func TestRowsThisPodRoutesAreClaimedAtInsert(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	mine, theirs, target := newPubkey(t), newPubkey(t), newPubkey(t)
	f.register(mine, target)
	f.register(theirs, target)
	d, _, _ := f.deliverer(Routes{mine: "https://mine.example"}, time.Second, nil)
	w := NewWorker(f.pool, Routes{mine: "https://mine.example"}, d, WithLease(42*time.Second))
	at := time.Now().Add(-time.Minute).Truncate(time.Microsecond)
	ev := message(t, 45003, target)
	params, err := eventstore.InsertParams(f.community, ev, nil)
	require.NoError(t, err)
	_, err = f.q.EventInsert(context.Background(), params)
	require.NoError(t, err)

	ctx := context.Background()
	claimed, inserted, err := Enqueue(ctx, f.q, w, f.community, nil, ev, 0, clock.Stub(func() time.Time { return at }))
	require.NoError(t, err)
	require.Equal(t, int64(2), inserted)
	require.Equal(t, 1, claimed.Len(), "only the row of the listener this pod routes")
	c := claimed.claims[0]
	require.Equal(t, mine, hex.EncodeToString(c.row.ListenerPubkey))
	require.Equal(t, target, hex.EncodeToString(c.row.TargetPubkey))
	require.Equal(t, testHost, c.row.Host)
	require.Equal(t, f.community, c.row.CommunityID)
	require.Equal(t, ev.ID, hex.EncodeToString(c.row.EventID))
	require.Equal(t, int32(45003), c.row.EventKind)
	require.Equal(t, ev.CreatedAt, c.row.EventCreatedAt.Unix())
	require.Equal(t, int32(1), c.row.Attempts)

	for _, id := range f.outboxIDs(ev) {
		r, _ := f.row(id)
		if id != c.row.ID {
			require.Equal(t, "pending", r.State, "the other pod's row waits for its poll")
			require.Equal(t, theirs, r.ListenerHex)
			require.Zero(t, r.Attempts)
			require.Nil(t, r.ClaimID)
			continue
		}
		require.Equal(t, "sending", r.State)
		require.Equal(t, c.claimID, *r.ClaimID)
		require.Equal(t, int32(1), r.Attempts)
		require.True(t, at.Add(42*time.Second).Equal(*r.LeaseUntil), "lease_until %v", r.LeaseUntil)
	}

	// The poll sees the claimed row as claimed: not due while the lease
	// holds, due once it expired (a hand-off that never happened).
	poll := func(now time.Time) []claim {
		p := f.claimer(Routes{mine: "", theirs: ""})
		p.clock = clock.Stub(func() time.Time { return now })
		cs, err := p.claimDue(ctx, 10, nil)
		require.NoError(t, err)
		return cs
	}
	due := poll(at.Add(41 * time.Second))
	require.Len(t, due, 1, "the lease holds: only the pending row is due")
	require.NotEqual(t, c.row.ID, due[0].row.ID)
	recovered := poll(at.Add(43 * time.Second))
	require.Len(t, recovered, 1, "the lease expired: the row is due again")
	require.Equal(t, c.row.ID, recovered[0].row.ID)
	require.Equal(t, int32(2), recovered[0].row.Attempts)
}

// Enqueue claims no more rows than the hand-off has room for: a busy
// worker's rows are left pending for its poll, rather than claimed, dropped
// by Offer and released again.
//
// Kills: Enqueue claiming up to the channel's capacity whatever it holds
// (checked with ClaimMax = handoffCapacity): the last two are dropped.
func TestEnqueueClaimsOnlyWhatTheHandOffHasRoomFor(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	l := newListener(t, nil)
	w := f.idleWorker(routesOf(l))
	var pending []uuid.UUID
	for i := range handoffCapacity + 2 {
		target := newPubkey(t)
		f.register(l.pubHex, target)
		ev := message(t, 9, target)
		kept, inserted := f.save(ev, w, true)
		require.Equal(t, int64(1), inserted)
		if i < handoffCapacity {
			require.Len(t, kept, 1, "mention %d: room in the hand-off", i)
			continue
		}
		require.Empty(t, kept, "mention %d: the hand-off is full", i)
		pending = append(pending, f.outboxIDs(ev)...)
	}
	require.Zero(t, testutil.ToFloat64(w.dropped), "nothing claimed had to be dropped")
	require.Len(t, handedOff(w), handoffCapacity)
	for _, id := range pending {
		r, _ := f.row(id)
		require.Equal(t, "pending", r.State)
		require.Zero(t, r.Attempts)
	}
}

// A row claimed at insert is leased from its transaction's start, so a
// long transaction leaves the hand-off less of the lease than the worker's
// lease: the claim's leaseEnds, on this process's clock, must be no later
// than the lease's end on the database's. Mutation killed: leaseEnds taken
// as the time of the Enqueue call plus the worker's lease (ignoring the
// lease_left_ms the statement reports).
func TestClaimAtInsertLeaseEndsNoLaterThanInTheDatabase(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := newFixture(t)
	listener, target := newPubkey(t), newPubkey(t)
	f.register(listener, target)
	w := f.idleWorker(Routes{listener: "https://l.example"})

	tx, err := f.pool.Begin(ctx)
	require.NoError(t, err)
	defer tx.Rollback(ctx)
	_, err = tx.Exec(ctx, `SELECT pg_sleep(0.5)`) // the event's transaction takes a while
	require.NoError(t, err)
	claimed, _, err := Enqueue(ctx, db.New(tx), w, f.community, nil, message(t, 9, target), 0, clock.Wall())
	require.NoError(t, err)
	require.NoError(t, tx.Commit(ctx))
	require.Len(t, claimed.claims, 1)
	c := claimed.claims[0]

	var dbLeftMs float64
	require.NoError(t, f.pool.QueryRow(ctx,
		`SELECT extract(epoch FROM lease_until - clock_timestamp()) * 1000 FROM operator_listener_outbox WHERE id = $1`,
		c.row.ID).Scan(&dbLeftMs))
	localLeft := time.Until(c.leaseEnds) // read after the database's: it must be the smaller
	require.LessOrEqual(t, localLeft, time.Duration(dbLeftMs*float64(time.Millisecond)),
		"the worker would count on a lease the database already ended")
	require.Greater(t, localLeft, defaultLease-5*time.Second, "the lease is not lost either")
}

// The rows an event claims at insert hold their room in the hand-off from
// before the claim until the event's transaction ends, so events whose
// transactions are open at once (the events of one commit group) together
// claim no more than the hand-off takes; a rollback gives the room back
// (Abandon), and so does the lease's end, should nobody give it back.
//
// Mutations killed: the room ignoring what open transactions reserved (the
// second event claims 5, and the first group's claims overflow the
// hand-off); Abandon not giving the room back (the third event claims
// nothing); a reservation that never expires (the last claims nothing).
func TestClaimAtInsertHoldsHandOffRoomUntilItsTransactionEnds(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := newFixture(t)
	listener := newPubkey(t)
	routes := Routes{listener: "https://l.example"}
	d, _, _ := f.deliverer(routes, 200*time.Millisecond, nil)
	const lease = time.Second
	w := NewWorker(f.pool, routes, d, WithLease(lease))
	mention := func(targets int) *nostr.Event {
		var keys []string
		for range targets {
			target := newPubkey(t)
			f.register(listener, target)
			keys = append(keys, target)
		}
		return message(t, 9, keys...)
	}
	begin := func(ev *nostr.Event) (pgx.Tx, Handoff) { return f.begin(ev, w) }

	first, firstClaims := begin(mention(7))
	require.Equal(t, 7, firstClaims.Len())
	require.Equal(t, 7, w.reservedRows())
	second, secondClaims := begin(mention(5))
	require.Equal(t, 3, secondClaims.Len(), "the first event's open transaction holds 7 of the 10")
	require.NoError(t, second.Commit(ctx))
	require.Zero(t, w.Offer(secondClaims))
	require.Equal(t, 7, w.reservedRows(), "the offered rows are in the channel, no longer reserved")

	require.NoError(t, first.Rollback(ctx))
	w.Abandon(firstClaims)
	require.Zero(t, w.reservedRows(), "a rollback gives its room back")
	kept, _ := f.save(mention(8), w, true)
	require.Len(t, kept, 7, "the room the rolled-back event held is free again")
	require.Zero(t, testutil.ToFloat64(w.dropped), "nothing claimed had to be dropped")
	handedOff(w) // the worker took them

	leaked, leakedClaims := begin(mention(10))
	require.Equal(t, 10, leakedClaims.Len())
	require.NoError(t, leaked.Rollback(ctx)) // and nobody gives its room back
	kept, _ = f.save(mention(1), w, true)
	require.Empty(t, kept, "the room is still reserved")
	time.Sleep(lease + 100*time.Millisecond)
	kept, _ = f.save(mention(1), w, true)
	require.Len(t, kept, 1, "a reservation stops holding room once its lease is over")
}
