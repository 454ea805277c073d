package outbox

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/buzzrelay/buzz/internal/db"
)

// reaperPeriods are how often each reaper runs.
type reaperPeriods struct {
	outbox        time.Duration // outbox rows past retention, expired operator auth replays
	registrations time.Duration // registrations past their lifetime
}

// ReaperOption adjusts Reapers.
type ReaperOption func(*reaperPeriods)

// WithReapPeriods overrides the periods (default 5 min and 24 h); for tests.
func WithReapPeriods(outbox, registrations time.Duration) ReaperOption {
	return func(p *reaperPeriods) { p.outbox, p.registrations = outbox, registrations }
}

// Reapers deletes outbox rows older than the 15-minute retention (and
// expired operator API replay claims) every 5 minutes, and registrations not
// renewed for 30 days every 24 hours. Each runs once at start. Run it on
// every pod, listeners configured or not; it returns when ctx ends.
func Reapers(ctx context.Context, pool *pgxpool.Pool, opts ...ReaperOption) {
	periods := reaperPeriods{outbox: outboxReapEvery, registrations: registrationReapEvery}
	for _, opt := range opts {
		opt(&periods)
	}
	q := db.New(pool)
	var wg sync.WaitGroup
	wg.Go(func() {
		every(ctx, periods.outbox, func() {
			n, err := q.OutboxReapExpired(ctx, db.OutboxReapExpiredParams{RetentionMs: retention.Milliseconds()})
			logReap(ctx, "operator-listener outbox rows past retention", n, err)
			n, err = q.OperatorAuthReplaysPurge(ctx, nil)
			logReap(ctx, "expired operator API replay claims", n, err)
		})
	})
	wg.Go(func() {
		every(ctx, periods.registrations, func() {
			n, err := q.ListenerRegistrationsReapExpired(ctx, db.ListenerRegistrationsReapExpiredParams{
				LifetimeMs: registrationLifetime.Milliseconds(),
			})
			logReap(ctx, "expired operator-listener registrations", n, err)
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

func logReap(ctx context.Context, what string, n int64, err error) {
	switch {
	case err != nil && ctx.Err() == nil:
		slog.Error("reaping "+what+" failed", "err", err)
	case n > 0:
		slog.Info("reaped "+what, "rows", n)
	}
}
