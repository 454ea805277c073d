package relay

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/buzzrelay/buzz/internal/db"
)

// Expired events (NIP-40) are hidden from every read as soon as they
// expire; their rows are deleted afterwards, by every relay process, in
// batches: each batch is one short statement holding at most
// expiredPurgeBatch row locks, and one run stops after
// expiredPurgeMaxBatches, leaving a larger backlog to the next runs.
const (
	expiredPurgeEvery      = time.Minute
	expiredPurgeBatch      = 1000
	expiredPurgeMaxBatches = 20
)

// RunExpiredPurge deletes expired events every expiredPurgeEvery until ctx
// ends. Run it on every pod: batches of several processes skip each
// other's rows.
func (s *Server) RunExpiredPurge(ctx context.Context) {
	t := time.NewTicker(expiredPurgeEvery)
	defer t.Stop()
	for {
		s.PurgeExpired(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// PurgeExpired runs one purge: batches until one comes back short, at most
// expiredPurgeMaxBatches. It returns the rows deleted.
func (s *Server) PurgeExpired(ctx context.Context) int64 {
	var total int64
	for range expiredPurgeMaxBatches {
		sctx, cancel := context.WithTimeout(ctx, time.Minute)
		n, err := s.purgeExpiredBatch(sctx)
		cancel()
		if err != nil {
			if ctx.Err() == nil {
				s.log.Error("purging expired events failed", "err", err)
			}
			break
		}
		total += n
		s.metrics.EventsExpiredPurged.Add(float64(n))
		if n < expiredPurgeBatch {
			break
		}
	}
	if total > 0 {
		s.log.Info("purged expired events", "rows", total)
	}
	return total
}

// purgeExpiredBatch deletes one batch of expired events. Their reactions
// and profiles are hidden first, in the same transaction: the triggers of
// hiding then remove the reaction's row and clear the mirrored profile, as
// for a NIP-09 deletion, which the DELETE alone would leave behind.
func (s *Server) purgeExpiredBatch(ctx context.Context) (n int64, err error) {
	now := s.clock.SQL()
	err = pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		q := db.New(tx)
		if err := q.EventsHideExpired(ctx, db.EventsHideExpiredParams{Now: now, MaxRows: expiredPurgeBatch}); err != nil {
			return err
		}
		n, err = q.EventsPurgeExpired(ctx, db.EventsPurgeExpiredParams{Now: now, MaxRows: expiredPurgeBatch})
		return err
	})
	return n, err
}
