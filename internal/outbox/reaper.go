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
}

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
	cfg := reaperConfig{outbox: outboxReapEvery, registrations: registrationReapEvery, log: slog.Default()}
	for _, opt := range opts {
		opt(&cfg)
	}
	q := db.New(pool)
	logReap := func(what string, n int64, err error) {
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
			n, err := q.OutboxReapExpired(ctx, db.OutboxReapExpiredParams{RetentionMs: retention.Milliseconds(), Now: cfg.clock.SQL()})
			logReap("operator-listener outbox rows past retention", n, err)
			n, err = q.OperatorAuthReplaysPurge(ctx, cfg.clock.SQL())
			logReap("expired operator API replay claims", n, err)
			// A media upload or delete holds a serving-write lease and
			// deletes it when done; a process that died (or lost the
			// database) mid-operation leaves its expired lease behind.
			n, err = q.ServingLeasesReap(ctx, servingLeaseReapBatch)
			logReap("expired serving-write leases", n, err)
		})
	})
	wg.Go(func() {
		every(ctx, cfg.registrations, func() {
			n, err := q.ListenerRegistrationsReapExpired(ctx, db.ListenerRegistrationsReapExpiredParams{
				LifetimeMs: registrationLifetime.Milliseconds(), Now: cfg.clock.SQL(),
			})
			logReap("expired operator-listener registrations", n, err)
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
