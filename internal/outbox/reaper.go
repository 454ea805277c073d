package outbox

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/buzzrelay/buzz/internal/clock"
	"github.com/buzzrelay/buzz/internal/db"
)

// reaperConfig is how often each reaper runs, the clock that decides what
// has expired, and where they log.
type reaperConfig struct {
	outbox        time.Duration // outbox rows past retention, expired operator auth replays
	registrations time.Duration // registrations past their lifetime
	clock         clock.Clock
	log           *slog.Logger
	// statementTimeout bounds each reaping statement (reapStatementTimeout).
	statementTimeout time.Duration
}

// reapStatementTimeout bounds one reaping statement. Without it a statement
// on a connection that died without a word (or behind a lock never
// released) stopped this process's reaping until TCP gave up, about 50
// minutes; a statement that gives up is logged and runs again next period.
const reapStatementTimeout = time.Minute

// ReaperOption adjusts Reapers.
type ReaperOption func(*reaperConfig)

// WithReapPeriods overrides the periods (default 5 min and 24 h); for tests.
func WithReapPeriods(outbox, registrations time.Duration) ReaperOption {
	return func(c *reaperConfig) { c.outbox, c.registrations = outbox, registrations }
}

// WithReaperClock sets the clock that decides what has expired (default:
// the wall clock, i.e. the database's now()).
func WithReaperClock(c clock.Clock) ReaperOption {
	return func(rc *reaperConfig) { rc.clock = c }
}

// WithReapStatementTimeout bounds each reaping statement (default
// reapStatementTimeout).
func WithReapStatementTimeout(d time.Duration) ReaperOption {
	return func(c *reaperConfig) { c.statementTimeout = d }
}

// WithReaperLogger sets the logger (default slog.Default()).
func WithReaperLogger(l *slog.Logger) ReaperOption {
	return func(c *reaperConfig) { c.log = l }
}

// servingLeaseReapBatch bounds one reap of serving-write leases; a larger
// backlog is taken over the next runs.
const servingLeaseReapBatch = 10000

// Reapers deletes outbox rows older than the 15-minute retention (and
// expired operator API replay claims and serving-write leases) every 5 minutes, and registrations not
// renewed for 30 days every 24 hours. Each runs once at start. Run it on
// every pod, listeners configured or not; it returns when ctx ends.
func Reapers(ctx context.Context, pool *pgxpool.Pool, opts ...ReaperOption) {
	cfg := reaperConfig{outbox: outboxReapEvery, registrations: registrationReapEvery, log: slog.Default(), statementTimeout: reapStatementTimeout}
	for _, opt := range opts {
		opt(&cfg)
	}
	q := db.New(pool)
	reap := func(what string, statement func(context.Context) (int64, error)) {
		sctx, cancel := context.WithTimeout(ctx, cfg.statementTimeout)
		defer cancel()
		n, err := statement(sctx)
		switch {
		case err != nil && ctx.Err() == nil:
			cfg.log.Error("reaping "+what+" failed", "err", err)
		case n > 0:
			cfg.log.Info("reaped "+what, "rows", n)
		}
	}
	var wg sync.WaitGroup
	wg.Go(func() {
		every(ctx, cfg.outbox, func() {
			reap("operator-listener outbox rows past retention", func(ctx context.Context) (int64, error) {
				return q.OutboxReapExpired(ctx, db.OutboxReapExpiredParams{RetentionMs: retention.Milliseconds(), Now: cfg.clock.SQL()})
			})
			reap("expired operator API replay claims", func(ctx context.Context) (int64, error) {
				return q.OperatorAuthReplaysPurge(ctx, cfg.clock.SQL())
			})
			// A media upload or delete holds a serving-write lease and
			// deletes it when done; a process that died (or lost the
			// database) mid-operation leaves its expired lease behind.
			reap("expired serving-write leases", func(ctx context.Context) (int64, error) {
				return q.ServingLeasesReap(ctx, servingLeaseReapBatch)
			})
		})
	})
	wg.Go(func() {
		every(ctx, cfg.registrations, func() {
			reap("expired operator-listener registrations", func(ctx context.Context) (int64, error) {
				return q.ListenerRegistrationsReapExpired(ctx, db.ListenerRegistrationsReapExpiredParams{
					LifetimeMs: registrationLifetime.Milliseconds(), Now: cfg.clock.SQL(),
				})
			})
		})
	})
	wg.Wait()
}

// every runs f now and then every period until ctx ends.
func every(ctx context.Context, period time.Duration, f func()) {
	t := time.NewTicker(period)
	defer t.Stop()
	for {
		f()
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}
