package outbox

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/buzzrelay/buzz/internal/clock"
	"github.com/buzzrelay/buzz/internal/db"
	"github.com/buzzrelay/buzz/internal/outage"
)

// claim is one claimed outbox row: what a delivery needs, plus the claim's
// fencing token and when its lease ends.
type claim struct {
	claimID uuid.UUID
	row     db.OutboxClaimDueRow
	// leaseEnds is on this pod's clock, no later than the lease's end on the
	// database's: the time just before the claim statement was sent plus the
	// lease it reported left as it ended. deliver POSTs only before it.
	leaseEnds time.Time
	// signed is its request signed ahead (nil: signed when sent).
	signed *signedRequest
}

// leaseEndsAfter places a claim's lease end on this pod's clock: sent is
// when the claim statement was sent, leftMs the lease it reported left.
func leaseEndsAfter(sent time.Time, leftMs int64) time.Time {
	return sent.Add(time.Duration(leftMs) * time.Millisecond)
}

// claimer takes due rows for the loop's poll: pgClaimer in production,
// wrapped by tests to observe claims.
type claimer interface {
	// claimDue is the poll: any due row this pod routes, at most limit,
	// and of each listener no more than its share of the slots
	// (listenerCap) less its deliveries in flight in busy (nil: none); a
	// listener's communities with the fewest deliveries in flight first.
	claimDue(ctx context.Context, limit int, busy *inFlight) ([]claim, error)
}

// slotKey is what the worker counts deliveries in flight by.
type slotKey struct {
	listener  string // string(ListenerPubkey)
	community uuid.UUID
}

func slotKeyOf(c claim) slotKey {
	return slotKey{listener: string(c.row.ListenerPubkey), community: c.row.CommunityID}
}

// inFlight counts a worker's deliveries in flight per listener (a listener
// holds at most its share of the slots) and per (listener, community) (the
// poll serves the communities holding the fewest first, so one community's
// flood does not queue another's mentions to the same listener). A nil
// *inFlight counts none.
type inFlight struct {
	listeners   map[string]int
	communities map[slotKey]int
}

func newInFlight() *inFlight {
	return &inFlight{listeners: map[string]int{}, communities: map[slotKey]int{}}
}

// listener returns the deliveries in flight to listener (string(pubkey)).
func (b *inFlight) listener(listener string) int {
	if b == nil {
		return 0
	}
	return b.listeners[listener]
}

func (b *inFlight) add(k slotKey) {
	b.listeners[k.listener]++
	b.communities[k]++
}

func (b *inFlight) remove(k slotKey) {
	if b.listeners[k.listener]--; b.listeners[k.listener] <= 0 {
		delete(b.listeners, k.listener)
	}
	if b.communities[k]--; b.communities[k] <= 0 {
		delete(b.communities, k)
	}
}

// communitiesOnly is b without its per-listener counts: for the poll that
// lends idle slots beyond the listeners' shares, which still serves each
// listener's communities holding the fewest first.
func (b *inFlight) communitiesOnly() *inFlight {
	return &inFlight{communities: b.communities}
}

// atShare reports whether some listener has its share (or more) in flight.
func (b *inFlight) atShare(share int) bool {
	for _, n := range b.listeners {
		if n >= share {
			return true
		}
	}
	return false
}

// pgClaimer runs the poll's claim statement, rendered from
// queries/templates/outbox_claim.sql.tmpl.
type pgClaimer struct {
	q        *db.Queries
	routable [][]byte
	lease    time.Duration
	clock    clock.Clock
	metrics  *Metrics // counts withdrawn rows; nil in some tests
	// cursor is where each listener's walk of its communities starts (nil:
	// always at the first).
	cursor *walkCursor
}

// walkCursor holds, per listener, the community its last claim reached in
// its walk of the communities with pending rows: the next walk starts after
// it, so the communities take turns, and a claim walks about its room of
// communities instead of all of them.
type walkCursor struct {
	mu    sync.Mutex
	after map[string]uuid.UUID // by string(listener pubkey)
}

func newWalkCursor() *walkCursor { return &walkCursor{after: map[string]uuid.UUID{}} }

// at is where listener's next walk starts after (the nil uuid: the first).
func (w *walkCursor) at(listener []byte) uuid.UUID {
	if w == nil {
		return uuid.Nil
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.after[string(listener)]
}

// advance moves each listener's cursor to the community of rows it took
// that came last in its walk: the walk ran from after the cursor to the
// last community, then from the first up to the cursor.
func (w *walkCursor) advance(rows []db.OutboxClaimDueRow) {
	if w == nil {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	last := map[string]uuid.UUID{}
	for _, r := range rows {
		if !r.Walked {
			continue // an expired lease, found apart
		}
		l := string(r.ListenerPubkey)
		if cur, seen := last[l]; !seen || walkOrder(w.after[l], cur, r.CommunityID) {
			last[l] = r.CommunityID
		}
	}
	for l, c := range last {
		w.after[l] = c
	}
}

// walkOrder reports whether community b comes after a in a walk that
// started after from.
func walkOrder(from, a, b uuid.UUID) bool {
	aWrapped, bWrapped := bytes.Compare(a[:], from[:]) <= 0, bytes.Compare(b[:], from[:]) <= 0
	if aWrapped != bWrapped {
		return bWrapped
	}
	return bytes.Compare(b[:], a[:]) > 0
}

// claimDue claims up to limit due rows. The statement also withdraws due
// rows whose target may no longer read the mention; while a pass withdrew
// rows and claimed none, it runs again (each pass deletes what it
// withdrew, so this ends): a run of withdrawn rows ahead of deliverable
// ones must not look like an idle outbox, which the loop would back off
// from.
//
// A claim is bounded by the lease it takes: the loop waits for it, and a
// statement on a stalled server (a stopped backend, a connection dropped
// without a word) never returns, which stopped this pod's deliveries, the
// hand-offs included, until it was restarted.
func (c pgClaimer) claimDue(ctx context.Context, limit int, busy *inFlight) ([]claim, error) {
	perListener := listenerCap(len(c.routable))
	p := db.OutboxClaimDueParams{
		LeaseMs: c.lease.Milliseconds(), MaxAttempts: maxAttempts, RetentionMs: retention.Milliseconds(),
		MaxRows: int32(limit),
	}
	for _, l := range c.routable {
		if n := perListener - busy.listener(string(l)); n > 0 {
			p.Routable, p.Room = append(p.Routable, l), append(p.Room, int32(n))
		}
	}
	after := func() {
		p.After = p.After[:0]
		for _, l := range p.Routable {
			p.After = append(p.After, c.cursor.at(l))
		}
	}
	if len(p.Routable) == 0 {
		return nil, nil // every listener has its share in flight
	}
	if busy != nil {
		for k, n := range busy.communities {
			p.BusyListeners = append(p.BusyListeners, []byte(k.listener))
			p.BusyCommunities = append(p.BusyCommunities, k.community)
			p.BusyCounts = append(p.BusyCounts, int32(n))
		}
	}
	if c.lease > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, c.lease)
		defer cancel()
	}
	for {
		after()
		claims, withdrawn, err := c.claimPass(ctx, p)
		if c.metrics != nil && withdrawn > 0 {
			c.metrics.deliveries.WithLabelValues(outcomeWithdrawn).Add(float64(withdrawn))
		}
		if err != nil || len(claims) > 0 || withdrawn == 0 {
			return claims, err
		}
	}
}

// claimPass runs the claim statement once, under a new claim id.
func (c pgClaimer) claimPass(ctx context.Context, p db.OutboxClaimDueParams) (claims []claim, withdrawn int, err error) {
	claimID := uuid.New()
	sent := c.clock.Now()
	p.ClaimID, p.Now = claimID, c.clock.SQL()
	rows, err := c.q.OutboxClaimDue(ctx, p)
	c.cursor.advance(rows)
	claims = make([]claim, 0, len(rows))
	for _, r := range rows {
		if r.Withdrawn {
			withdrawn++
			continue
		}
		claims = append(claims, claim{claimID: claimID, row: r, leaseEnds: leaseEndsAfter(sent, r.LeaseLeftMs)})
	}
	return claims, withdrawn, err
}

// timerClock makes the loop's poll timers; tests drive a manual one.
type timerClock interface {
	NewTimer(d time.Duration) timer
}

type timer interface {
	C() <-chan time.Time
	// Reset re-arms the timer to fire d from now, discarding a pending fire.
	Reset(d time.Duration)
	Stop()
}

type realClock struct{}

func (realClock) NewTimer(d time.Duration) timer { return realTimer{time.NewTimer(d)} }

// realTimer relies on Go 1.23+ timers: Reset and Stop discard a fire that
// was not received.
type realTimer struct{ t *time.Timer }

func (t realTimer) C() <-chan time.Time   { return t.t.C }
func (t realTimer) Reset(d time.Duration) { t.t.Reset(d) }
func (t realTimer) Stop()                 { t.t.Stop() }

// loop is the delivery state machine (docs/listener-delivery.md), separated from the Worker
// so tests drive the production loop with their own claimer, deliveries and
// clock.
type loop struct {
	claims  claimer
	deliver func(ctx context.Context, c claim)
	clock   timerClock
	handoff <-chan claim
	// wake asks for a poll once the hand-off is empty: rows of this pod's
	// listeners committed pending because it had no room for them (Offer).
	wake <-chan struct{}
	log  *slog.Logger
	// outage takes the polls an unreachable database failed (nil: logged).
	outage *outage.Log
	// perListener is the most deliveries one listener may have in flight
	// (listenerCap; 0: maxInFlight). A handed-off row beyond it goes to
	// release instead of a slot.
	perListener int
	release     func(ctx context.Context, c claim)
	// idleFloor and idleCeiling bound the poll's backoff while nothing is
	// due (pollBackoff).
	idleFloor, idleCeiling time.Duration
}

// pollBackoff returns the idle poll's first wait and its ceiling: an idle
// worker backs off from an eighth of the ceiling up to it.
func pollBackoff(ceiling time.Duration) (floor, _ time.Duration) {
	if ceiling <= 0 {
		ceiling = DefaultIdlePoll
	}
	return ceiling / 8, ceiling
}

// run keeps up to maxInFlight deliveries going until ctx ends, then waits
// for the running ones. Every goroutine it starts is counted in inflight and
// reports on done, so nothing runs outside that set.
func (l *loop) run(ctx context.Context) {
	// done carries the key of each finished delivery; it never blocks one.
	done := make(chan slotKey, maxInFlight)
	inflight := 0
	// busy counts the deliveries in flight: one listener may hold at most
	// perListener slots, so a listener that hangs (each of its requests
	// running to the timeout) cannot take every slot and starve the others;
	// and the poll serves a listener's communities holding the fewest
	// first.
	busy := newInFlight()
	perListener := l.perListener
	if perListener <= 0 || perListener > maxInFlight {
		perListener = maxInFlight
	}
	var releasing sync.WaitGroup
	// released reports a batch of deferred hand-offs back in the poll's
	// reach. Their listener's next delivery to end may poll before the
	// release commits (it runs in the background) and find nothing of
	// them, and no later event polls before the idle backoff: so the poll
	// also runs once the release is done.
	released := make(chan struct{}, 1)
	// Deliveries outlive ctx: on shutdown each finishes (bounded by the
	// request timeout) and records its outcome instead of leaving its row
	// leased until the lease expires.
	deliverCtx := context.WithoutCancel(ctx)
	// lent: the claims came from a poll that lends idle slots beyond the
	// shares, so none of them is deferred.
	start := func(claims []claim, lent bool) {
		var over []claim
		for _, c := range claims {
			key := slotKeyOf(c)
			if busy.listener(key.listener) >= perListener && !lent {
				// A hand-off of a listener holding its share: back to the
				// poll, due at once, its attempt not spent. The poll takes
				// it once the listener has room.
				over = append(over, c)
				continue
			}
			inflight++
			busy.add(key)
			go func() {
				defer func() { done <- key }()
				l.deliver(deliverCtx, c)
			}()
		}
		if len(over) > 0 && l.release != nil {
			releasing.Go(func() {
				for _, c := range over {
					l.release(deliverCtx, c)
				}
				select {
				case released <- struct{}{}:
				default: // a wake-up is already pending
				}
			})
		}
	}

	// The poll timer is armed only by the poll's own outcome, so it holds a
	// fixed deadline: hand-offs and completions never push the poll back.
	// Fired while the worker is full, it stays ready until a slot frees.
	poll := l.clock.NewTimer(0) // the first poll runs at once
	defer poll.Stop()
	backoff := l.idleFloor
	// A claim is not cut off by ctx (claimDue bounds it by the lease): the
	// server may commit a claim the client has given up on, and its rows
	// then stayed leased to nobody, 30 s late on every restart. A claim
	// running as ctx ends is delivered like the rest in flight.
	claimCtx := context.WithoutCancel(ctx)
	runPoll := func(free int) {
		if ctx.Err() != nil {
			// Stopping (the poll timer and ctx.Done were ready at once):
			// a claim that ctx no longer cuts off would start new
			// deliveries the shutdown then waits for.
			return
		}
		claims, err := l.claims.claimDue(claimCtx, free, busy)
		lent := false
		if rest := free - lendReserve; err == nil && len(claims) == 0 && rest > 0 && busy.atShare(perListener) {
			// Nobody under its share has rows due: lend the slots they do
			// not need (up to a share more per listener and poll, keeping
			// lendReserve free for them), so a lone busy listener among many
			// registered ones is not held to one share of the worker.
			claims, err = l.claims.claimDue(claimCtx, rest, busy.communitiesOnly())
			lent = true
		}
		switch {
		case err != nil:
			if ctx.Err() == nil && !l.outage.TickFailed(err, "operator-listener outbox poll") {
				l.log.Error("operator-listener outbox poll failed", "err", err)
			}
			poll.Reset(claimErrorSleep)
		case len(claims) > 0:
			start(claims, lent)
			backoff = l.idleFloor
			poll.Reset(0) // keep draining while work and slots exist
		default:
			poll.Reset(backoff)
			backoff = min(2*backoff, l.idleCeiling)
		}
	}
	// pollOwed: the poll was due when hand-offs last took free slots ahead
	// of it, so it takes the next free slot.
	pollOwed := false

	// wakeOwed: rows the hand-off had no room for wait for the poll, which
	// runs once the hand-off is empty: handed-off rows keep their turn
	// first (their lease runs), and the rows left behind go next, not at
	// the idle timer. (Polled at the next free slot instead, every other
	// slot went to a poll's round trip and the burst drained slower for
	// all: a burst's median delay grew fivefold.)
	wakeOwed := false

	for {
		free := maxInFlight - inflight
		if wakeOwed && len(l.handoff) == 0 {
			wakeOwed = false
			poll.Reset(0)
		}
		// A waiting hand-off takes a free slot before the poll does (its
		// lease has been running since its insert; in one select it would
		// wait behind the poll at random), but never twice in a row while
		// the poll is due: the poll is the only path for retries, other
		// pods' rows and released claims, and hand-offs arriving as fast as
		// deliveries end would otherwise shut it out for good.
		if free > 0 && ctx.Err() == nil {
			if pollOwed {
				pollOwed = false
				runPoll(free)
				continue
			}
			select {
			case c := <-l.handoff:
				start(drainUpTo(l.handoff, c, free), false)
				select {
				case <-poll.C():
					pollOwed = true
				default:
				}
				continue
			default:
			}
		}
		// Without a free slot, neither the poll nor a hand-off may be
		// taken: nil channels disable both cases.
		var pollC <-chan time.Time
		var handoffC <-chan claim
		if free > 0 {
			pollC, handoffC = poll.C(), l.handoff
		}
		select {
		case <-ctx.Done():
			for ; inflight > 0; inflight-- {
				<-done
			}
			releasing.Wait()
			return

		case key := <-done:
			// One slot is free: claim again now, not when a batch is done.
			inflight--
			if busy.listener(key.listener) >= perListener && perListener < maxInFlight {
				// Its listener had its share in flight, so the poll has
				// passed its due rows over (released hand-offs among them):
				// poll again now, not after the idle backoff.
				poll.Reset(0)
			}
			busy.remove(key)

		case <-released:
			// Deferred hand-offs are due again: poll now (or at the next
			// free slot), not after the idle backoff.
			poll.Reset(0)

		case <-l.wake:
			// Rows the hand-off had no room for are committed pending:
			// the poll takes them once the hand-off is empty, not at the
			// idle timer. Wakes coalesce: many Offers make one poll.
			wakeOwed = true

		case <-pollC:
			runPoll(free)

		case c := <-handoffC:
			// Handed-off rows were claimed as they were inserted: they go
			// out at once, with no claim round trip.
			start(drainUpTo(l.handoff, c, free), false)
		}
	}
}

// lendReserve is how many slots a poll that lends idle slots beyond the
// listeners' shares leaves free, for the listeners under their share whose
// rows arrive next.
const lendReserve = maxInFlight / 5

// drainUpTo returns first plus whatever ch holds right now, at most n.
func drainUpTo(ch <-chan claim, first claim, n int) []claim {
	claims := append(make([]claim, 0, handoffCapacity), first)
	for len(claims) < n {
		select {
		case c := <-ch:
			claims = append(claims, c)
		default:
			return claims
		}
	}
	return claims
}

// Worker delivers this pod's outbox rows: run one per relay process that has
// listeners configured.
type Worker struct {
	loop    loop
	handoff chan claim
	// wake holds at most one pending wake-up of the poll (Offer).
	wake    chan struct{}
	dropped prometheus.Counter
	// handedBack counts the rows stop and Offer give back once stopped.
	handedBack prometheus.Counter
	// routable and lease are what Enqueue needs to claim rows for this
	// worker as it inserts them.
	routable [][]byte
	lease    time.Duration
	// releaseNow hands a claimed row that did not fit in the hand-off back
	// to the poll (Deliverer.releaseNow in production).
	releaseNow func(ctx context.Context, c claim)
	// sign starts signing claims' requests on a goroutine and calls done
	// once it has (Deliverer.signAhead); signing is set while it runs.
	sign    func(claims []claim, done func())
	signing atomic.Bool

	// reserved is the hand-off room held by rows claimed at insert whose
	// event's transaction has not ended yet (reserveRoom).
	roomMu   sync.Mutex
	reserved map[*roomReservation]struct{}
	// stopped: Run's ctx ended, so the hand-off takes nothing more (stop).
	// Guarded by roomMu, as the sends into the hand-off are.
	stopped bool
}

// roomReservation is hand-off room held for the rows one event claims at
// insert, from before its claim until its transaction ends: Offer (after the
// commit) or Abandon (after a rollback) gives it back. Without it, every
// event of a commit group saw the room none of their commits had taken yet
// and claimed up to all of it, so a group of N events claimed up to N times
// the room, and Offer released what did not fit, one UPDATE per row.
type roomReservation struct {
	rows int
	// expires is when the reservation stops holding room even if nobody
	// gave it back (a transaction that outlived the lease, a path that
	// panicked): by then its rows are the poll's anyway.
	expires time.Time
}

// WorkerOption adjusts a Worker.
type WorkerOption func(*pgClaimer)

// WithLease sets how long a claim holds its row before another worker may
// take it over (default 30 s). Tests shorten it to recover stalled
// deliveries quickly.
func WithLease(d time.Duration) WorkerOption {
	return func(c *pgClaimer) { c.lease = d }
}

// NewWorker returns a worker that claims rows for the listeners in routes
// and delivers them through d, telling time by d's clock.
func NewWorker(pool *pgxpool.Pool, routes Routes, d *Deliverer, opts ...WorkerOption) *Worker {
	claims := pgClaimer{
		q: db.New(pool), routable: routes.pubkeys(), lease: defaultLease, clock: d.clock, metrics: d.metrics,
		cursor: newWalkCursor(),
	}
	for _, opt := range opts {
		opt(&claims)
	}
	if claims.lease <= d.client.Timeout+leaseMargin {
		// deliver would release every claim unsent, and the poll take it
		// again at once.
		panic(fmt.Sprintf("outbox: lease %s must exceed the request timeout %s plus %s", claims.lease, d.client.Timeout, leaseMargin))
	}
	w := &Worker{
		handoff: make(chan claim, handoffCapacity), wake: make(chan struct{}, 1),
		dropped: d.metrics.handoffDropped, handedBack: d.metrics.handedBackAtStop,
		routable: claims.routable, lease: claims.lease, releaseNow: d.releaseNow, sign: d.signAhead,
		reserved: map[*roomReservation]struct{}{},
	}
	w.loop = loop{
		claims: claims, deliver: d.deliver, clock: realClock{}, handoff: w.handoff, wake: w.wake, log: d.log, outage: d.outage,
		perListener: listenerCap(len(claims.routable)), release: d.releaseDeferred,
	}
	w.loop.idleFloor, w.loop.idleCeiling = pollBackoff(d.idlePoll)
	return w
}

// reserveRoom reserves up to want rows of the hand-off's room for one
// event's claim at insert: the channel's free room less what the events
// whose transactions are still open reserved, so the events of a commit
// group (and of concurrent transactions) together claim no more than the
// hand-off can take. It returns nil when there is no room (or want is 0).
func (w *Worker) reserveRoom(want int) *roomReservation {
	now := time.Now()
	w.roomMu.Lock()
	defer w.roomMu.Unlock()
	if w.stopped {
		return nil // nobody would deliver what it claimed
	}
	room := cap(w.handoff) - len(w.handoff)
	for r := range w.reserved {
		if now.After(r.expires) {
			delete(w.reserved, r)
			continue
		}
		room -= r.rows
	}
	if n := min(want, room); n > 0 {
		r := &roomReservation{rows: n, expires: now.Add(w.lease)}
		w.reserved[r] = struct{}{}
		return r
	}
	return nil
}

// keepRoom shrinks r to the rows its event claimed (0: gives it back).
func (w *Worker) keepRoom(r *roomReservation, rows int) {
	if r == nil {
		return
	}
	w.roomMu.Lock()
	defer w.roomMu.Unlock()
	if r.rows = rows; rows == 0 {
		delete(w.reserved, r)
	}
}

// releaseRoom gives r back; releasing twice (or nil) is harmless.
func (w *Worker) releaseRoom(r *roomReservation) {
	if r == nil {
		return
	}
	w.roomMu.Lock()
	delete(w.reserved, r)
	w.roomMu.Unlock()
}

// reservedRows is the hand-off room reserved now (tests).
func (w *Worker) reservedRows() (n int) {
	w.roomMu.Lock()
	defer w.roomMu.Unlock()
	for r := range w.reserved {
		n += r.rows
	}
	return n
}

// signAhead has the requests of the rows Enqueue claimed for an event
// signed while the event's transaction goes on to commit, when the worker
// is idle: nothing waits in its hand-off and no other event's rows are
// being signed. That is when a delivery's latency is its signature's.
// Otherwise (a flood of mentions) they are signed as they are sent: they
// wait in the hand-off for a slot anyway, long enough for a signature
// made ahead to save nothing or go stale.
func (w *Worker) signAhead(claims []claim) {
	if w == nil || len(claims) == 0 || len(w.handoff) > 0 || !w.signing.CompareAndSwap(false, true) {
		return
	}
	w.sign(claims, func() { w.signing.Store(false) })
}

// Offer hands the rows Enqueue claimed to the worker, without blocking: call
// it only after the event's transaction committed; it gives back the room
// they reserved. They fit, unless their reservation expired first: rows
// that do not fit in its 10-row channel are counted as dropped and handed
// back to the poll in the background (released, due at once, the attempt
// not spent); should that fail too, their lease expires and the poll takes
// them then. Rows of this worker's listeners that Enqueue had no room to
// claim wake the poll, which takes them once the hand-off is empty: now
// that they are committed it can see them. A nil Worker (no listeners configured
// on this pod) is never given claimed rows. Once the worker has stopped,
// the rows go back to the poll before Offer returns.
func (w *Worker) Offer(h Handoff) (dropped int) {
	if w == nil {
		return 0
	}
	var lost []claim
	w.roomMu.Lock()
	stopped := w.stopped
	for _, c := range h.claims {
		if stopped {
			lost = append(lost, c)
			continue
		}
		select {
		case w.handoff <- c:
		default:
			lost = append(lost, c)
		}
	}
	w.roomMu.Unlock()
	// After the sends: until then the rows count as reserved, so nobody
	// claims their room meanwhile.
	w.releaseRoom(h.room)
	if h.leftToPoll > 0 {
		select {
		case w.wake <- struct{}{}:
		default: // a wake-up is already pending
		}
	}
	switch {
	case len(lost) == 0:
	case stopped:
		// Before the event is answered: the process is stopping, and
		// would not wait for a release in the background.
		w.handedBack.Add(float64(len(lost)))
		w.release(lost)
	default:
		w.dropped.Add(float64(len(lost)))
		go w.release(lost)
	}
	return len(lost)
}

// release hands claimed rows this worker will not deliver back to the
// poll: pending, due at once, the attempt not spent.
func (w *Worker) release(claims []claim) {
	// Past the lease a release is moot: the rows are due again anyway.
	ctx, cancel := context.WithTimeout(context.Background(), w.lease)
	defer cancel()
	for _, c := range claims {
		w.releaseNow(ctx, c)
	}
}

// Abandon gives back the hand-off room an event's claim at insert reserved,
// when its transaction rolled back: its rows never existed, so nothing is
// offered. Call it for every Handoff that is not offered. Nil-safe.
func (w *Worker) Abandon(h Handoff) {
	if w != nil {
		w.releaseRoom(h.room)
	}
}

// Run delivers until ctx ends, then returns once in-flight deliveries
// finish. As ctx ends, not once those deliveries finish (up to the request
// timeout), the worker stops: the rows waiting in its hand-off go back to
// the poll (of a pod still running), due at once, and so do the rows of
// events that commit later (a stopping relay closes its connections while
// its worker stops): left claimed, nobody delivered them before the
// deliveries in flight ended, or before their lease did (30 s) should the
// process exit first.
func (w *Worker) Run(ctx context.Context) {
	stopped := make(chan struct{})
	context.AfterFunc(ctx, func() {
		defer close(stopped)
		w.stop()
	})
	w.loop.run(ctx)
	<-stopped
}

// stop takes no more rows into the hand-off and hands back those in it.
func (w *Worker) stop() {
	w.roomMu.Lock()
	w.stopped = true
	var left []claim
	for drained := false; !drained; {
		// Never a blocking receive: the loop may take the last row first.
		select {
		case c := <-w.handoff:
			left = append(left, c)
		default:
			drained = true
		}
	}
	w.roomMu.Unlock()
	w.handedBack.Add(float64(len(left)))
	w.release(left)
}
