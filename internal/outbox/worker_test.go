package outbox

import (
	"context"
	"encoding/json"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/buzzrelay/buzz/internal/db"
	"github.com/buzzrelay/buzz/internal/dbtest"
)

// runWorker runs w until the test ends (or stop is called) and waits for it.
func runWorker(t *testing.T, w *Worker) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		w.Run(ctx)
	}()
	stop = sync.OnceFunc(func() {
		cancel()
		<-done
	})
	t.Cleanup(stop)
	return stop
}

// deliveryKey names one notification: the mentioned pubkey and the event.
type deliveryKey struct{ Pubkey, EventID string }

func keyOf(t testing.TB, body []byte) deliveryKey {
	var n notification
	require.NoError(t, json.Unmarshal(body, &n))
	return deliveryKey{n.Pubkey, n.EventID}
}

func (f *fixture) waitForEmptyOutbox(timeout time.Duration) {
	f.t.Helper()
	require.Eventually(f.t, func() bool { return f.outboxCount() == 0 }, timeout, 10*time.Millisecond)
}

func TestTwoRelayProcessesOnOneDatabaseNeverDeliverARowTwice(t *testing.T) {
	t.Parallel()
	url := dbtest.URL(t)
	pools := make([]*pgxpool.Pool, 2)
	for i := range pools {
		p, err := pgxpool.New(context.Background(), url)
		require.NoError(t, err)
		t.Cleanup(p.Close)
		pools[i] = p
	}
	f := fixtureOn(t, pools[0])

	counts := map[deliveryKey]int{}
	l := newListener(t, func(w http.ResponseWriter, r *http.Request) {
		time.Sleep(2 * time.Millisecond) // widen the window for overlap
	})
	routes := routesOf(l)
	workers := make([]*Worker, 2)
	for i, p := range pools {
		pf := &fixture{t: t, pool: p, q: db.New(p)}
		d, _, _ := pf.deliverer(routes, 5*time.Second, testCAs(l))
		workers[i] = NewWorker(p, routes, d)
		runWorker(t, workers[i])
	}

	// 40 mentions of 2 targets each, saved back to back through either
	// pod: each claims what its hand-off has room for as it inserts, the
	// rest is polled by both (the hand-off fills up).
	targets := []string{newPubkey(t), newPubkey(t)}
	f.register(l.pubHex, targets...)
	for i := range 40 {
		f.save(message(t, 9, targets...), workers[i%2], true)
	}
	f.waitForEmptyOutbox(20 * time.Second)

	for _, r := range l.requests() {
		counts[keyOf(t, r.Body)]++
	}
	require.Len(t, counts, 80)
	for k, n := range counts {
		require.Equal(t, 1, n, "%v delivered %d times", k, n)
	}
}

func TestKilledWorkerRowIsRedeliveredAfterTheLeaseAndItsLateCompletionIsFenced(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	stalled := make(chan struct{})
	unstall := make(chan struct{})
	var requests atomic.Int32
	l := newListener(t, func(w http.ResponseWriter, r *http.Request) {
		if requests.Add(1) == 1 {
			close(stalled)
			<-unstall // the first worker's request hangs
		}
	})
	release := sync.OnceFunc(func() { close(unstall) })
	t.Cleanup(release)
	routes := routesOf(l)

	d1, m1, logs1 := f.deliverer(routes, 10*time.Second, testCAs(l))
	first := NewWorker(f.pool, routes, d1, WithLease(500*time.Millisecond))
	stopFirst := runWorker(t, first)
	target := newPubkey(t)
	f.register(l.pubHex, target)
	kept, _ := f.save(message(t, 9, target), first, true)
	wait(t, stalled, waitLong, "the first delivery to stall")

	// The first worker is told to stop while its delivery hangs; its row
	// stays leased to it until the lease runs out.
	firstStopped := make(chan struct{})
	go func() {
		stopFirst()
		close(firstStopped)
	}()
	r, _ := f.row(kept[0])
	require.Equal(t, "sending", r.State)
	firstClaim := *r.ClaimID

	d2, m2, _ := f.deliverer(routes, 10*time.Second, testCAs(l))
	runWorker(t, NewWorker(f.pool, routes, d2))
	f.waitForEmptyOutbox(waitLong)
	waitOutcome(t, m2, outcomeAccepted, 1) // the second worker delivered it

	release()
	wait(t, firstStopped, waitLong, "the first worker to finish its delivery and stop")
	require.Contains(t, logs1.String(), "completion lost its claim")
	require.Contains(t, logs1.String(), firstClaim.String())
	require.Equal(t, 1.0, outcomes(m1)[outcomeAccepted])
	require.EqualValues(t, 2, requests.Load())
	require.Zero(t, f.outboxCount())
}

// A pod that cannot route a listener must not claim its rows as it inserts
// them, or the pod that can route them waits 30 s.
func TestUnroutableMentionLeavesRowClaimableAtOnceByARoutingWorker(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	mine, theirs := newListener(t, nil), newListener(t, nil)
	target := newPubkey(t)
	f.register(theirs.pubHex, target)

	// The saving pod routes only its own listener.
	dA, mA, _ := f.deliverer(routesOf(mine), 5*time.Second, testCAs(mine))
	saving := NewWorker(f.pool, routesOf(mine), dA)
	runWorker(t, saving)
	ev := message(t, 9, target)
	kept, inserted := f.save(ev, saving, true)
	require.Equal(t, int64(1), inserted)
	require.Empty(t, kept, "nothing claimed for the saving pod")

	r, ok := f.row(f.outboxIDs(ev)[0])
	require.True(t, ok)
	require.Equal(t, "pending", r.State, "the insert did not claim a row this pod cannot route")
	require.Zero(t, r.Attempts)
	require.LessOrEqual(t, r.DueIn, time.Duration(0), "still due now, not in 30 s")

	dB, mB, _ := f.deliverer(routesOf(theirs), 5*time.Second, testCAs(theirs))
	runWorker(t, NewWorker(f.pool, routesOf(theirs), dB))
	f.waitForEmptyOutbox(waitLong) // its first poll runs at start
	require.Len(t, theirs.requests(), 1)
	require.Empty(t, mine.requests())
	waitOutcome(t, mB, outcomeAccepted, 1)
	require.Zero(t, outcomes(mA)[outcomeUnroutable])
}

func TestWorkerKeepsAtMostTenDeliveriesInFlight(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	var inFlight, peak atomic.Int32
	l := newListener(t, func(w http.ResponseWriter, r *http.Request) {
		n := inFlight.Add(1)
		for {
			p := peak.Load()
			if n <= p || peak.CompareAndSwap(p, n) {
				break
			}
		}
		time.Sleep(50 * time.Millisecond)
		inFlight.Add(-1)
	})
	routes := routesOf(l)
	targets := make([]string, 40)
	for i := range targets {
		targets[i] = newPubkey(t)
	}
	f.register(l.pubHex, targets...)
	d, m, _ := f.deliverer(routes, 5*time.Second, testCAs(l))
	w := NewWorker(f.pool, routes, d)
	runWorker(t, w)
	for _, tg := range targets {
		f.save(message(t, 9, tg), w, true)
	}
	f.waitForEmptyOutbox(20 * time.Second)
	waitOutcome(t, m, outcomeAccepted, 40)
	require.LessOrEqual(t, peak.Load(), int32(maxInFlight))
	require.Greater(t, peak.Load(), int32(1), "deliveries run concurrently")
}

// waitOutcome waits for a delivery counter: a worker counts an outcome just
// after its fenced completion commits, so an emptied outbox can be seen a
// moment before the count.
func waitOutcome(t *testing.T, m *Metrics, outcome string, want float64) {
	t.Helper()
	require.Eventually(t, func() bool { return outcomes(m)[outcome] == want }, waitLong, 10*time.Millisecond,
		"%s deliveries: got %v, want %v", outcome, outcomes(m)[outcome], want)
}
