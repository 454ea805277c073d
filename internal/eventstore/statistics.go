package eventstore

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/buzzrelay/buzz/internal/outage"
)

// Statement names of the statistics keeper (see AnalyzeWhenStale).
const (
	NameEventsStatisticsStale = "EventsStatisticsStale"
	NameEventsAnalyze         = "EventsAnalyze"
	NameEventsAnalyzeAllowed  = "EventsAnalyzeAllowed"
)

// eventsStatisticsStale is true when at least $1 rows of events changed
// since its statistics were taken and those changes are at least as many
// as the rows the statistics describe: the table was never analyzed, or it
// has at least doubled since. reltuples is -1 before the first ANALYZE.
const eventsStatisticsStale = `SELECT coalesce(s.n_mod_since_analyze >= greatest($1::bigint, c.reltuples::bigint), false)
FROM pg_class c JOIN pg_stat_user_tables s ON s.relid = c.oid
WHERE c.oid = 'events'::regclass`

// eventsAnalyzeAllowed is whether this session's role may ANALYZE events:
// its owner (or a member of the owner role), the database's owner, or a
// superuser. For anyone else ANALYZE only warns and skips the table, so a
// keeper would find the statistics stale, and "analyze" them, forever.
const eventsAnalyzeAllowed = `SELECT pg_has_role(c.relowner, 'USAGE')
    OR pg_has_role(d.datdba, 'USAGE')
    OR (SELECT rolsuper FROM pg_roles WHERE rolname = current_user)
FROM pg_class c, pg_database d
WHERE c.oid = 'events'::regclass AND d.datname = current_database()`

// ErrCannotAnalyze is returned by AnalyzeWhenStale when the relay's role
// may not ANALYZE events; autovacuum keeps the statistics then.
var ErrCannotAnalyze = errors.New("the relay's database role may not ANALYZE events (only its owner, the database owner or a superuser may); statistics are left to autovacuum")

// AnalyzeWhenStale runs ANALYZE on events when its statistics describe a
// table less than half its size (or none at all), and at least minRows rows
// changed since. Autovacuum re-analyzes the table itself once 2% of it
// changed (migration 019), but only when its launcher wakes, once a minute
// by default: a burst into a fresh or small table leaves the planner with
// no idea how many rows a kind or an author has for up to that minute, and
// it then sorts every match of a newest-first read instead of reading an
// index in order. A few rows changing never trigger it; a doubling is rare
// once the table is large, so the cost (ANALYZE samples at most 30,000
// rows) stays small. Several relays may analyze at once: harmless.
func (s *Store) AnalyzeWhenStale(ctx context.Context, minRows int64) (bool, error) {
	var stale bool
	if err := s.pool.QueryRow(ctx, named(NameEventsStatisticsStale, eventsStatisticsStale), minRows).Scan(&stale); err != nil || !stale {
		return false, err
	}
	var allowed bool
	if err := s.pool.QueryRow(ctx, named(NameEventsAnalyzeAllowed, eventsAnalyzeAllowed)).Scan(&allowed); err != nil {
		return false, err
	}
	if !allowed {
		return false, ErrCannotAnalyze
	}
	// A lock it cannot have at once (an index build, DDL, another ANALYZE)
	// is left for a later tick: waiting would deadlock a concurrent index
	// build, which waits for this transaction's snapshot.
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, "SET LOCAL lock_timeout = '100ms'"); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, named(NameEventsAnalyze, "ANALYZE events"))
		return err
	})
	if pgErr := (*pgconn.PgError)(nil); errors.As(err, &pgErr) && pgErr.Code == "55P03" { // lock_not_available
		return false, nil
	}
	return err == nil, err
}

// KeepStatistics calls AnalyzeWhenStale every interval until ctx ends.
// A check failed by an unreachable database goes to outages, which logs it
// once per outage (nil: every failure is logged).
func (s *Store) KeepStatistics(ctx context.Context, interval time.Duration, minRows int64, log *slog.Logger, outages *outage.Log) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		start := time.Now()
		analyzed, err := s.AnalyzeWhenStale(ctx, minRows)
		switch {
		case errors.Is(err, ErrCannotAnalyze):
			log.Warn("events statistics keeper off", "err", err)
			return
		case err != nil && ctx.Err() == nil:
			if !outages.TickFailed(err, "events statistics check") {
				log.Warn("events statistics check", "err", err)
			}
		case analyzed:
			log.Info("analyzed events after a burst", "took", time.Since(start))
		}
	}
}
