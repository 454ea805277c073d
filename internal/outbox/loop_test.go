package outbox

import (
	"context"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/buzzrelay/buzz/internal/db"
)

// The loop tests drive the production loop (loop.run) with the real claim
// statements on a real database, a manual clock (a poll fires only when a
// test advances time past its deadline) and recording deliveries. Each
// names the mutation of loop.run it kills; every one was checked by
// applying the mutation, seeing the test fail, and restoring the code:
//   - no hand-off branch: the `case c := <-handoffC` arm removed;
//   - poll timer reset every iteration: `poll.Reset(backoff)` at the top of
//     the for loop (the deadline moves whenever anything happens);
//   - no free-slot guard: pollC and handoffC enabled even when free == 0.

// manualClock fires timers only from Advance. Every Reset is reported on
// rearmed, so a test advances time only after the loop re-armed its poll.
type manualClock struct {
	mu      sync.Mutex
	now     time.Time
	timers  []*manualTimer
	rearmed chan time.Duration
}

type manualTimer struct {
	clock *manualClock
	ch    chan time.Time
	at    time.Time
	armed bool
}

func (c *manualClock) NewTimer(d time.Duration) timer {
	t := &manualTimer{clock: c, ch: make(chan time.Time, 1)}
	c.mu.Lock()
	c.timers = append(c.timers, t)
	t.arm(d)
	c.mu.Unlock()
	return t
}

// Advance moves time forward and fires every timer now due.
func (c *manualClock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
	for _, t := range c.timers {
		t.fireIfDue()
	}
}

func (t *manualTimer) C() <-chan time.Time { return t.ch }

func (t *manualTimer) Reset(d time.Duration) {
	t.clock.mu.Lock()
	defer t.clock.mu.Unlock()
	t.drain()
	t.arm(d)
	t.clock.rearmed <- d
}

func (t *manualTimer) arm(d time.Duration) {
	t.at, t.armed = t.clock.now.Add(d), true
	t.fireIfDue()
}

func (t *manualTimer) Stop() {
	t.clock.mu.Lock()
	defer t.clock.mu.Unlock()
	t.drain()
	t.armed = false
}

func (t *manualTimer) drain() {
	select {
	case <-t.ch:
	default:
	}
}

func (t *manualTimer) fireIfDue() {
	if t.armed && !t.at.After(t.clock.now) {
		t.armed = false
		t.ch <- t.clock.now
	}
}

// recordingClaimer wraps the production poll claim: it reports every poll
// and checks the in-flight bound. outstanding counts rows the loop took
// (polled, or handed off and started) and not yet finished by a delivery, a
// lower bound of the loop's own in-flight count, so a poll made while it is
// at 10 proves the loop polled without a free slot.
type recordingClaimer struct {
	t      testing.TB
	inner  claimer
	polls  chan int // the limit of each poll
	polled sync.Map // ids of polled rows whose delivery has not started

	outstanding    atomic.Int64
	maxOutstanding atomic.Int64
}

func (r *recordingClaimer) checkSlots(kind string, want int) {
	if out := r.outstanding.Load(); out+int64(want) > maxInFlight || want == 0 {
		r.t.Errorf("%s claim for %d rows with %d deliveries in flight", kind, want, out)
	}
}

func (r *recordingClaimer) claimed(cs []claim) {
	n := r.outstanding.Add(int64(len(cs)))
	for {
		m := r.maxOutstanding.Load()
		if n <= m || r.maxOutstanding.CompareAndSwap(m, n) {
			return
		}
	}
}

func (r *recordingClaimer) claimDue(ctx context.Context, limit int, busy *inFlight) ([]claim, error) {
	r.checkSlots("poll", limit)
	cs, err := r.inner.claimDue(ctx, limit, busy)
	for _, c := range cs {
		r.polled.Store(c.row.ID, true)
	}
	r.claimed(cs)
	r.polls <- limit
	return cs, err
}

// started counts a handed-off row once its delivery starts (a polled row
// was counted when it was claimed).
func (r *recordingClaimer) started(c claim) {
	if _, polled := r.polled.LoadAndDelete(c.row.ID); !polled {
		r.claimed([]claim{c})
	}
}

// loopHarness runs loop.run against a fixture.
type loopHarness struct {
	f         *fixture
	clock     *manualClock
	claims    *recordingClaimer
	handoff   chan claim
	delivered chan claim // each delivery, when it finishes
	// saver is an idle worker routing the listener, which the harness saves
	// mentions through to get rows claimed at insert (handed).
	saver *Worker
	// hold, when set, is called by a delivery before it finishes.
	hold     func(c claim)
	listener string
}

func startLoop(t *testing.T, configure func(h *loopHarness)) *loopHarness {
	t.Helper()
	f := newFixture(t)
	h := &loopHarness{
		f:         f,
		clock:     &manualClock{now: time.Unix(1_000_000, 0), rearmed: make(chan time.Duration, 1000)},
		handoff:   make(chan claim, handoffCapacity),
		delivered: make(chan claim, 1000),
		listener:  newPubkey(t),
	}
	h.claims = &recordingClaimer{
		t: t, inner: f.claimer(Routes{h.listener: "https://l.example"}),
		polls: make(chan int, 1000),
	}
	h.saver = f.idleWorker(Routes{h.listener: "https://l.example"})
	if configure != nil {
		configure(h)
	}
	l := &loop{
		claims: h.claims,
		deliver: func(_ context.Context, c claim) {
			h.claims.started(c)
			if h.hold != nil {
				h.hold(c)
			}
			h.claims.outstanding.Add(-1)
			h.delivered <- c
		},
		clock:   h.clock,
		handoff: h.handoff,
		log:     slog.New(slog.DiscardHandler),
	}
	runLoop(t, l, nil)
	// The first poll runs at start and finds nothing.
	require.Equal(t, maxInFlight, h.awaitPoll(t, "the first poll"))
	return h
}

// awaitPoll waits for a poll and for the loop to re-arm its timer after it,
// and returns the poll's limit.
func (h *loopHarness) awaitPoll(t *testing.T, what string) int {
	t.Helper()
	limit := wait(t, h.claims.polls, waitLong, what)
	wait(t, h.clock.rearmed, waitLong, "the poll timer re-armed after "+what)
	return limit
}

// waitLong bounds a wait for something the code under test must do. It is
// a failure bound only: under the race detector beside every other package
// on a loaded 2-core machine, a poll or delivery that takes milliseconds
// alone has taken seconds.
const waitLong = time.Minute

// row enqueues one mention for the harness listener and returns its id.
func (h *loopHarness) row() uuid.UUID {
	target := newPubkey(h.f.t)
	h.f.register(h.listener, target)
	return h.f.enqueue(target)[0]
}

// handed saves one mention for the harness listener through the saver and
// returns its row, claimed at insert: what the relay hands off.
func (h *loopHarness) handed() claim {
	target := newPubkey(h.f.t)
	h.f.register(h.listener, target)
	h.f.save(message(h.f.t, 9, target), h.saver, true)
	claims := handedOff(h.saver)
	require.Len(h.f.t, claims, 1)
	return claims[0]
}

func (h *loopHarness) noPoll(t *testing.T, why string) {
	t.Helper()
	select {
	case <-h.claims.polls:
		t.Fatal(why)
	default:
	}
}

// Kills: no hand-off branch (checked).
func TestLoopHandedOffRowIsDeliveredBeforeAnyIdlePoll(t *testing.T) {
	t.Parallel()
	h := startLoop(t, nil)
	c := h.handed()
	h.handoff <- c
	require.Equal(t, c, wait(t, h.delivered, waitLong, "the delivery"))
	h.noPoll(t, "delivered as handed off, claimed at insert; no idle poll was due")
}

// Kills: poll timer reset every iteration (checked): the hand-off in the
// middle of the idle interval would move the deadline past the time the
// test advances to.
func TestLoopRowNeverHandedOffIsDeliveredByThePoll(t *testing.T) {
	t.Parallel()
	h := startLoop(t, nil)
	// Idle polls back off 250 ms, 500 ms, 1 s, then sit at the 2 s ceiling.
	for _, step := range []time.Duration{250, 500, 1000, 2000} {
		h.clock.Advance(step * time.Millisecond)
		h.awaitPoll(t, "an idle poll")
	}
	quiet := h.row()

	h.clock.Advance(time.Second)
	h.noPoll(t, "the poll waits out its 2 s ceiling")
	handed := h.handed()
	h.handoff <- handed
	require.Equal(t, handed, wait(t, h.delivered, waitLong, "the hand-off's delivery"))

	h.clock.Advance(time.Second) // the ceiling deadline, fixed before the hand-off
	h.awaitPoll(t, "the poll at its deadline")
	require.Equal(t, quiet, wait(t, h.delivered, waitLong, "the poll's delivery").row.ID)
}

// Kills: poll timer reset every iteration (checked).
func TestLoopHandoffsFasterThanThePollDoNotPushItBack(t *testing.T) {
	t.Parallel()
	h := startLoop(t, nil)
	handOff := func() {
		c := h.handed()
		h.handoff <- c
		require.Equal(t, c, wait(t, h.delivered, waitLong, "a hand-off's delivery"))
	}
	// The first poll set the deadline at +250 ms; a hand-off every 100 ms
	// must not move it.
	for range 2 {
		h.clock.Advance(100 * time.Millisecond)
		handOff()
	}
	h.noPoll(t, "200 ms: not due yet")
	h.clock.Advance(100 * time.Millisecond)
	h.awaitPoll(t, "the poll at 250 ms despite hand-offs every 100 ms")

	// Nor do hand-offs reset the idle backoff: that empty poll (at 300 ms)
	// armed the next one 500 ms later, at 800 ms.
	for range 4 {
		handOff()
		h.clock.Advance(100 * time.Millisecond)
	}
	h.noPoll(t, "700 ms: the backoff kept doubling")
	h.clock.Advance(100 * time.Millisecond)
	h.awaitPoll(t, "the poll at 800 ms")
}

// Kills: no hand-off branch (checked). Also checked against a loop that
// waits for a whole claimed batch before claiming again: it fails too.
func TestLoopStalledDeliveryDoesNotHoldUpALaterRow(t *testing.T) {
	t.Parallel()
	release := make(chan struct{})
	stalledStarted := make(chan struct{}, 1)
	var stalled claim
	h := startLoop(t, func(h *loopHarness) {
		h.hold = func(c claim) {
			if c.row.ID == stalled.row.ID {
				stalledStarted <- struct{}{}
				<-release
			}
		}
	})
	unstall := sync.OnceFunc(func() { close(release) })
	t.Cleanup(unstall) // before the loop stops: it waits for held deliveries
	stalled = h.handed()
	h.handoff <- stalled
	wait(t, stalledStarted, waitLong, "the stalled row's delivery to start")

	later := h.handed()
	h.handoff <- later
	require.Equal(t, later, wait(t, h.delivered, waitLong, "the later row, while the first is stalled"))
	unstall()
	require.Equal(t, stalled, wait(t, h.delivered, waitLong, "the stalled row, once released"))
}

// Kills: no free-slot guard (checked): with 10 deliveries stalled, the
// hand-off would be read and started without a slot (and the due poll
// would run with limit 0).
func TestLoopKeepsTenInFlightAndNeverClaimsWithoutAFreeSlot(t *testing.T) {
	t.Parallel()
	gate := make(chan struct{})
	started := make(chan struct{}, 100)
	h := startLoop(t, func(h *loopHarness) {
		h.hold = func(claim) {
			started <- struct{}{}
			<-gate
		}
	})
	open := sync.OnceFunc(func() { close(gate) })
	t.Cleanup(open) // before the loop stops: it waits for held deliveries
	target := func() string {
		tg := newPubkey(t)
		h.f.register(h.listener, tg)
		return tg
	}
	var polled []uuid.UUID
	for range 25 {
		polled = append(polled, h.f.enqueue(target())...)
	}
	h.clock.Advance(DefaultIdlePoll / 8)
	require.Equal(t, maxInFlight, wait(t, h.claims.polls, waitLong, "the poll"))
	for range maxInFlight {
		wait(t, started, waitLong, "a delivery")
	}

	// Full: a hand-off and a due poll must both wait for a free slot.
	var handed []uuid.UUID
	for range 5 {
		c := h.handed()
		handed = append(handed, c.row.ID)
		h.handoff <- c
	}
	h.clock.Advance(time.Hour)
	select {
	case <-started:
		t.Fatal("started a handed-off delivery with no free slot")
	case limit := <-h.claims.polls:
		t.Fatalf("polled with limit %d and no free slot", limit)
	case <-time.After(200 * time.Millisecond):
	}
	require.Equal(t, int64(maxInFlight), h.claims.outstanding.Load())

	open()
	seen := map[uuid.UUID]bool{}
	for range 30 {
		seen[wait(t, h.delivered, waitLong, "every row").row.ID] = true
	}
	require.Len(t, seen, 30)
	for _, id := range append(polled, handed...) {
		require.True(t, seen[id])
	}
	require.Equal(t, int64(maxInFlight), h.claims.maxOutstanding.Load(), "in flight reached 10 and never more")
}

// runLoop runs l, with the default poll backoff, until the test ends;
// afterCancel (may be nil) runs once its context is cancelled, before
// waiting for it to return.
func runLoop(t *testing.T, l *loop, afterCancel func()) {
	t.Helper()
	l.idleFloor, l.idleCeiling = pollBackoff(DefaultIdlePoll)
	ctx, cancel := context.WithCancel(context.Background())
	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		l.run(ctx)
	}()
	t.Cleanup(func() {
		cancel()
		if afterCancel != nil {
			afterCancel()
		}
		<-stopped
	})
}

// backlogClaimer is a poll that always finds as many due rows as it may
// take, like the poll of a pod with a backlog of retries.
type backlogClaimer struct{}

func (backlogClaimer) claimDue(_ context.Context, limit int, _ *inFlight) ([]claim, error) {
	out := make([]claim, limit)
	for i := range out {
		out[i] = claim{claimID: uuid.New(), row: db.OutboxClaimDueRow{ID: uuid.New()}}
	}
	return out, nil
}

// With every slot busy and a poll that always finds work, a waiting
// hand-off is started within two freed slots, 20 rounds in a row (its lease
// has been running since its insert, so it must not wait behind the poll),
// and the poll still gets slots (it alone carries retries, other pods' rows
// and released claims).
// Mutations killed: no hand-off preference, the hand-off and the poll
// competing in one select (a hand-off then loses two slots in a row in
// about one round in four); strict hand-off priority (the poll never gets a
// slot while hand-offs keep coming: it got 0 of 3,869 in a reviewer's run).
func TestLoopGivesAFreedSlotToAWaitingHandOffBeforeThePoll(t *testing.T) {
	t.Parallel()
	handoff := make(chan claim, handoffCapacity)
	started := make(chan claim, 2*maxInFlight)
	finish := make(chan struct{})
	l := &loop{
		claims: backlogClaimer{},
		deliver: func(_ context.Context, c claim) {
			started <- c
			<-finish
		},
		clock: realClock{}, handoff: handoff, log: slog.New(slog.DiscardHandler),
	}
	runLoop(t, l, func() { close(finish) }) // every delivery still running ends
	next := func(what string) claim {
		t.Helper()
		select {
		case c := <-started:
			return c
		case <-time.After(waitLong):
			t.Fatalf("no delivery started: %s", what)
			return claim{}
		}
	}
	for range maxInFlight {
		next("the poll filling every slot")
	}
	polled := 0
	for round := range 20 {
		handed := claim{claimID: uuid.New(), row: db.OutboxClaimDueRow{ID: uuid.New()}}
		handoff <- handed
		finish <- struct{}{} // one delivery ends: one slot is free
		if got := next("the freed slot taken"); got.row.ID != handed.row.ID {
			polled++
			finish <- struct{}{} // the poll took it: the next slot is the hand-off's
			got = next("the second freed slot taken")
			require.Equal(t, handed.row.ID, got.row.ID, "round %d: the poll took two freed slots while a hand-off waited", round)
		}
	}
	require.GreaterOrEqual(t, polled, 5, "the poll got a slot in %d of 20 rounds while hand-offs kept coming", polled)
}

// A loop whose ctx ended claims nothing more, even when its poll timer is
// ready as well: the claim is not cut off by ctx (a claim the server
// committed as the relay gave up on it left its rows leased to nobody), so
// a poll taken after the signal would start new deliveries, each up to the
// request timeout, for the shutdown to wait for. The select picks the
// poll or ctx.Done at random, so the loop is run many times.
// Mutation killed: runPoll without its ctx check (about half the runs
// poll).
func TestALoopWhoseCtxEndedClaimsNothingMore(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	claims := &stubClaimer{cap: maxInFlight, polls: make(chan struct{}, 100)}
	for range 50 {
		clock := &manualClock{rearmed: make(chan time.Duration, 100)}
		l := loop{
			claims: claims, clock: clock, handoff: make(chan claim), wake: make(chan struct{}),
			log: slog.Default(), deliver: func(context.Context, claim) { t.Error("a delivery started") },
			idleFloor: time.Hour, idleCeiling: time.Hour,
		}
		l.run(ctx) // its poll timer fires at once
	}
	require.Zero(t, len(claims.polls), "polls after ctx ended")
}
