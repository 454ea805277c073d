package outbox

import (
	"context"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/buzzrelay/buzz/internal/db"
)

// stubClaimer answers the poll from rows a test marks due, at most a
// listener's room (cap less busy), and reports each poll.
type stubClaimer struct {
	mu    sync.Mutex
	cap   int
	due   []claim
	polls chan struct{}
}

func (s *stubClaimer) claimDue(_ context.Context, limit int, busy *inFlight) ([]claim, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	defer func() { s.polls <- struct{}{} }()
	var out, rest []claim
	taken := map[string]int{}
	for _, c := range s.due {
		k := string(c.row.ListenerPubkey)
		if len(out) < limit && busy.listener(k)+taken[k] < s.cap {
			out, taken[k] = append(out, c), taken[k]+1
			continue
		}
		rest = append(rest, c)
	}
	s.due = rest
	return out, nil
}

func (s *stubClaimer) markDue(c claim) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.due = append(s.due, c)
}

// A handed-off row deferred because its listener had its share in flight
// is delivered once its release commits, even when the listener's
// delivery ended (and the poll it triggers ran) before that: the poll ran
// too early to see the row, and nothing else polled before the idle
// backoff (here an hour, the manual clock never advanced).
// Mutation killed: the releasing goroutine not waking the poll once its
// rows are released (the deferred row waits for the idle poll).
func TestDeferredHandOffReleasedAfterItsListenerFreedASlotIsPolled(t *testing.T) {
	t.Parallel()
	listener := []byte("listener-a")
	row := func() claim {
		return claim{claimID: uuid.New(), row: db.OutboxClaimDueRow{ID: uuid.New(), ListenerPubkey: listener}}
	}
	first, deferred := row(), row()
	claims := &stubClaimer{cap: 1, polls: make(chan struct{}, 100)}

	finish := map[uuid.UUID]chan struct{}{first.row.ID: make(chan struct{}), deferred.row.ID: make(chan struct{})}
	started := make(chan uuid.UUID, 10)
	releaseGate, releasing := make(chan struct{}), make(chan uuid.UUID, 10)
	openRelease := sync.OnceFunc(func() { close(releaseGate) })
	handoff := make(chan claim, 10)
	l := &loop{
		claims: claims,
		deliver: func(_ context.Context, c claim) {
			started <- c.row.ID
			<-finish[c.row.ID]
		},
		clock:       &manualClock{now: time.Unix(1_000_000, 0), rearmed: make(chan time.Duration, 1000)},
		handoff:     handoff,
		log:         slog.New(slog.DiscardHandler),
		perListener: 1,
		release: func(_ context.Context, c claim) {
			releasing <- c.row.ID
			<-releaseGate // the release statement is slow
			claims.markDue(c)
		},
		idleFloor: time.Hour, idleCeiling: time.Hour,
	}
	ctx, stop := context.WithCancel(context.Background())
	ended := make(chan struct{})
	go func() { defer close(ended); l.run(ctx) }()
	t.Cleanup(func() {
		openRelease() // the loop waits for its releases on shutdown
		close(finish[deferred.row.ID])
		stop()
		<-ended
	})
	wait(t, claims.polls, waitLong, "the first poll")

	handoff <- first
	handoff <- deferred
	if got := <-started; got != first.row.ID {
		t.Fatalf("started %v, want the first hand-off", got)
	}
	wait(t, releasing, waitLong, "the second hand-off deferred: its listener holds its share")

	// The listener's delivery ends before the release commits: the poll it
	// triggers finds nothing of that listener.
	close(finish[first.row.ID])
	wait(t, claims.polls, waitLong, "the poll run when the listener had room again")
	openRelease()

	select {
	case got := <-started:
		if got != deferred.row.ID {
			t.Fatalf("started %v, want the deferred row", got)
		}
	case <-time.After(waitLong):
		t.Fatal("the deferred row waited for the idle poll after its release committed")
	}
}
