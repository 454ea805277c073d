package outbox

import (
	"context"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/buzzrelay/buzz/internal/db"
)

func TestReapersUseTheirExpectedIntervals(t *testing.T) {
	t.Parallel()
	require.Equal(t, 5*time.Minute, outboxReapEvery)
	require.Equal(t, 24*time.Hour, registrationReapEvery)
	require.Equal(t, 15*time.Minute, retention)
	require.Equal(t, 30*24*time.Hour, registrationLifetime)
	p := reaperConfig{outbox: outboxReapEvery, registrations: registrationReapEvery}
	WithReapPeriods(time.Second, time.Minute)(&p)
	require.Equal(t, reaperConfig{outbox: time.Second, registrations: time.Minute}, p)
}

// seedExpiring adds, per table, one row just past its limit and one just
// inside it.
func (f *fixture) seedExpiring() {
	f.t.Helper()
	listener := newPubkey(f.t)
	oldTarget, newTarget := newPubkey(f.t), newPubkey(f.t)
	f.register(listener, oldTarget, newTarget)
	old, fresh := f.enqueue(oldTarget)[0], f.enqueue(newTarget)[0]
	f.exec(`UPDATE operator_listener_outbox SET created_at = now() - interval '15 minutes 5 seconds' WHERE id = $1`, old)
	f.exec(`UPDATE operator_listener_outbox SET created_at = now() - interval '14 minutes 55 seconds' WHERE id = $1`, fresh)
	f.exec(`UPDATE operator_listener_pubkeys SET created_at = now() - interval '30 days 5 seconds' WHERE target_pubkey = $1`, mustHex(f.t, oldTarget))
	f.exec(`UPDATE operator_listener_pubkeys SET created_at = now() - interval '29 days 23 hours' WHERE target_pubkey = $1`, mustHex(f.t, newTarget))
	f.exec(`INSERT INTO operator_auth_replays VALUES ($1, now() - interval '1 second'), ($2, now() + interval '1 minute')`,
		mustHex(f.t, newPubkey(f.t)), mustHex(f.t, newPubkey(f.t)))
}

func (f *fixture) counts() [3]int {
	f.t.Helper()
	var c [3]int
	require.NoError(f.t, f.pool.QueryRow(context.Background(), `
		SELECT (SELECT count(*) FROM operator_listener_outbox),
		       (SELECT count(*) FROM operator_listener_pubkeys),
		       (SELECT count(*) FROM operator_auth_replays)`).Scan(&c[0], &c[1], &c[2]))
	return c
}

func runReapers(t *testing.T, f *fixture, opts ...ReaperOption) {
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { Reapers(ctx, f.pool, opts...) })
	t.Cleanup(func() {
		cancel()
		wg.Wait()
	})
}

func TestReapersDeleteExpiredRowsAndPreserveRecentRows(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.seedExpiring()
	require.Equal(t, [3]int{2, 2, 2}, f.counts())

	// Default periods: both reapers run once at start.
	runReapers(t, f)
	require.Eventually(t, func() bool { return f.counts() == [3]int{1, 1, 1} }, waitLong, 10*time.Millisecond)
}

func TestReapersRunAgainEveryPeriod(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	runReapers(t, f, WithReapPeriods(20*time.Millisecond, 20*time.Millisecond))
	require.Eventually(t, func() bool { return f.counts() == [3]int{0, 0, 0} }, waitLong, 10*time.Millisecond)
	f.seedExpiring() // after the first runs
	require.Eventually(t, func() bool { return f.counts() == [3]int{1, 1, 1} }, waitLong, 10*time.Millisecond)
}

// A serving-write lease left behind by a process that died mid-upload is
// reaped once expired; a live one stays. Mutation killed: Reapers without
// the lease reap (the expired lease stays).
func TestReapersDeleteExpiredServingLeases(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	for _, seconds := range []float64{0.001, 3600} {
		_, err := f.q.ServingLeaseAcquire(context.Background(), db.ServingLeaseAcquireParams{
			CommunityID: f.community, Operation: "media_upload", Owner: "crashed", LeaseSeconds: seconds,
		})
		require.NoError(t, err)
	}
	leases := func(cond string) int {
		var n int
		require.NoError(t, f.pool.QueryRow(context.Background(), `SELECT count(*) FROM community_serving_write_leases WHERE `+cond).Scan(&n))
		return n
	}
	require.Eventually(t, func() bool { return leases("lease_until < now()") == 1 }, waitLong, 10*time.Millisecond)
	runReapers(t, f)
	require.Eventually(t, func() bool { return leases("true") == 1 }, waitLong, 10*time.Millisecond)
	require.Equal(t, 1, leases("lease_until > now()"), "the live lease stays")
}

// A reaping statement that cannot finish (here the expired outbox row is
// locked by a transaction that never ends, as a dead connection's would
// be) gives up at its deadline, is logged, and the statements after it
// still run: the expired serving-write lease is reaped. Mutation killed:
// the statements run without a deadline (the outbox DELETE waits for good
// and the lease is never reaped).
func TestReaperStatementStuckOnALockGivesUp(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.seedExpiring()
	ctx := context.Background()
	_, err := f.q.ServingLeaseAcquire(ctx, db.ServingLeaseAcquireParams{
		CommunityID: f.community, Operation: "media_upload", Owner: "crashed", LeaseSeconds: 0.001,
	})
	require.NoError(t, err)
	holder, err := f.pool.Begin(ctx)
	require.NoError(t, err)
	t.Cleanup(func() { _ = holder.Rollback(context.Background()) })
	_, err = holder.Exec(ctx, `SELECT FROM operator_listener_outbox WHERE created_at < now() - interval '15 minutes' FOR UPDATE`)
	require.NoError(t, err)

	logs := &logBuffer{}
	runReapers(t, f, WithReapStatementTimeout(300*time.Millisecond), WithReaperLogger(slog.New(slog.NewTextHandler(logs, nil))))
	require.Eventually(t, func() bool {
		var n int
		require.NoError(t, f.pool.QueryRow(ctx, `SELECT count(*) FROM community_serving_write_leases`).Scan(&n))
		return n == 0
	}, waitLong, 10*time.Millisecond, "the lease reap runs after the stuck statement gives up")
	require.Contains(t, logs.String(), "reaping operator-listener outbox rows past retention failed")
	require.Equal(t, 2, f.counts()[0], "the locked outbox row waits for the next period")
}
