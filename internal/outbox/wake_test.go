package outbox

import (
	"context"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// pollCounter counts the loop's polls and reports each on polls (when
// there is room; nobody has to listen).
type pollCounter struct {
	inner claimer
	n     atomic.Int64
	empty atomic.Int64 // polls that claimed nothing
	polls chan struct{}
}

func (p *pollCounter) claimDue(ctx context.Context, limit int, busy *inFlight) ([]claim, error) {
	cs, err := p.inner.claimDue(ctx, limit, busy)
	p.n.Add(1)
	if err == nil && len(cs) == 0 {
		p.empty.Add(1)
	}
	select {
	case p.polls <- struct{}{}:
	default:
	}
	return cs, err
}

// countPolls wraps w's claimer before it runs.
func countPolls(w *Worker) *pollCounter {
	p := &pollCounter{inner: w.loop.claims, polls: make(chan struct{}, 1)}
	w.loop.claims = p
	return p
}

// A row its event could not claim at insert (the hand-off was full) is
// posted once the hand-off frees room, not at the idle poll's timer: here
// an hour (its first wait 7.5 minutes), so a missing wake-up fails the
// test rather than slowing it.
//
// Mutation killed: Offer not waking the poll for the rows Enqueue left
// pending (the row waits for the timer: "the unclaimed row is posted").
func TestRowTheHandOffHadNoRoomForIsPostedOnceItFrees(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	gate, arrived := make(chan struct{}), make(chan string, 100)
	l := newListener(t, func(_ http.ResponseWriter, r *http.Request) {
		arrived <- r.Method
		<-gate
	})
	t.Cleanup(func() {
		select {
		case <-gate:
		default:
			close(gate)
		}
	})
	routes := routesOf(l)
	d, _, _ := f.deliverer(routes, 5*time.Second, testCAs(l))
	d.idlePoll = time.Hour
	w := NewWorker(f.pool, routes, d)
	polls := countPolls(w)
	target := newPubkey(t)
	f.register(l.pubHex, target)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	go w.Run(ctx)
	wait(t, polls.polls, time.Minute, "the first poll, which finds nothing and backs off")

	// Ten deliveries hang at the listener, ten more claimed rows wait in
	// the hand-off: the next event has no room to claim its row.
	for range maxInFlight {
		kept, _ := f.save(message(t, 9, target), w, true)
		require.Len(t, kept, 1)
	}
	for range maxInFlight {
		wait(t, arrived, time.Minute, "the first ten POSTs")
	}
	for range handoffCapacity {
		kept, _ := f.save(message(t, 9, target), w, true)
		require.Len(t, kept, 1)
	}
	late := message(t, 9, target)
	kept, inserted := f.save(late, w, true)
	require.Empty(t, kept, "the hand-off is full")
	require.Equal(t, int64(1), inserted)
	pollsBefore := polls.n.Load()

	close(gate)
	deadline := time.After(time.Minute)
	for {
		select {
		case <-arrived:
		case <-deadline:
			t.Fatal("the unclaimed row is posted once the hand-off frees room (not at the idle poll's timer)")
		}
		posted := false
		for _, r := range l.requests() {
			posted = posted || strings.Contains(string(r.Body), late.ID)
		}
		if posted {
			break
		}
	}
	f.waitForEmptyOutbox(time.Minute)
	require.LessOrEqual(t, polls.n.Load()-pollsBefore, int64(3), "one wake-up, not a poll per delivery")
}
