package outbox

import (
	"bytes"
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/buzzrelay/buzz/internal/clock"
)

// A lease expires when the injected clock says so: a claim made at t holds
// its row against a claimant at t + 29 s and loses it to one at t + 31 s,
// although the database's own clock has barely moved. Mutation killed:
// claim queries that ignore their now parameter (bare now()) never see the
// lease expire.
func TestLeaseExpiryIsDecidedByTheInjectedClock(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	listener, target := newPubkey(t), newPubkey(t)
	f.register(listener, target)
	id := f.enqueue(target)[0]
	routes := Routes{listener: "https://l.example"}
	start := time.Now() // once: every claimant's offset is from the same instant
	at := func(offset time.Duration) pgClaimer {
		c := f.claimer(routes)
		c.clock = clock.Stub(func() time.Time { return start.Add(offset) })
		return c
	}
	ctx := context.Background()

	first, err := at(0).claimDue(ctx, 10, nil)
	require.NoError(t, err)
	require.Len(t, first, 1)
	require.Equal(t, id, first[0].row.ID)
	held, err := at(defaultLease-time.Second).claimDue(ctx, 10, nil)
	require.NoError(t, err)
	require.Empty(t, held, "the lease still holds 29 s later")
	taken, err := at(defaultLease+time.Second).claimDue(ctx, 10, nil)
	require.NoError(t, err)
	require.Len(t, taken, 1, "the lease expired 31 s later, by the injected clock")
	require.NotEqual(t, first[0].claimID, taken[0].claimID)
	require.Equal(t, int32(2), taken[0].row.Attempts)
}

// The reapers' cutoffs come from the injected clock, and they log through
// the injected logger. Mutation killed: reaper queries that ignore their now
// parameter keep every (freshly made) row; logging through slog.Default
// leaves the injected log empty.
func TestReapersCutOffByTheInjectedClockAndLogThroughTheInjectedLogger(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	listener, target := newPubkey(t), newPubkey(t)
	f.register(listener, target)
	f.enqueue(target)
	f.exec(`INSERT INTO operator_auth_replays VALUES ($1, now() + interval '1 minute')`, mustHex(t, newPubkey(t)))
	require.Equal(t, [3]int{1, 1, 1}, f.counts())

	later := time.Now().Add(registrationLifetime + time.Hour)
	logs := &logBuffer{}
	runReapers(t, f, WithReaperClock(clock.Stub(func() time.Time { return later })),
		WithReaperLogger(slog.New(slog.NewTextHandler(logs, nil))))
	require.Eventually(t, func() bool { return f.counts() == [3]int{0, 0, 0} }, waitLong, 10*time.Millisecond,
		"every row is expired 30 days and an hour from now")
	require.Eventually(t, func() bool {
		return bytes.Contains([]byte(logs.String()), []byte("reaped expired operator-listener registrations"))
	}, waitLong, 10*time.Millisecond)
}

// Enqueued rows are dated by the injected clock: their retention and first
// due time start then. Mutation killed: OutboxEnqueueMentions leaving
// created_at and next_attempt_at to the column defaults (the database's
// now()).
func TestEnqueueDatesRowsByTheInjectedClock(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	listener, target := newPubkey(t), newPubkey(t)
	f.register(listener, target)
	past := time.Now().Add(-retention - time.Minute).Truncate(time.Microsecond)
	ev := message(t, 9, target)
	_, _, err := Enqueue(context.Background(), f.q, nil, f.community, nil, ev, 0, clock.Stub(func() time.Time { return past }))
	require.NoError(t, err)
	kept := f.outboxIDs(ev)
	require.Len(t, kept, 1)
	var created, due time.Time
	require.NoError(t, f.pool.QueryRow(context.Background(),
		`SELECT created_at, next_attempt_at FROM operator_listener_outbox WHERE id = $1`, kept[0]).Scan(&created, &due))
	require.True(t, past.Equal(created), "created_at %v, want %v", created, past)
	require.True(t, past.Equal(due), "next_attempt_at %v, want %v", due, past)
	claims, err := f.claimer(Routes{listener: "https://l.example"}).claimDue(context.Background(), 10, nil)
	require.NoError(t, err)
	require.Empty(t, claims, "a row dated past the retention is never claimed")
}
