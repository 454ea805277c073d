package relay

import (
	"context"
	"time"

	"github.com/google/uuid"

	"github.com/buzzrelay/buzz/internal/media"
)

// mediaSweepBatch bounds the blob keys one sweep looks at and the blobs it
// removes: each look costs a stat per community with media, each removal a
// blob lock (a pool connection and a read slot) while it looks again.
const mediaSweepBatch = 500

// StartMediaSweep removes unreferenced media blobs, one batch every
// BUZZ_MEDIA_SWEEP_INTERVAL, until ctx ends (WaitForWorkers waits for the
// batch in flight, whose store and database calls end with ctx). Every
// relay process may run it: the processes sharing a database take turns
// through one claim, so one sweeps at a time.
func (s *Server) StartMediaSweep(ctx context.Context) {
	if s.media == nil {
		return
	}
	s.workers.Go(func() {
		t := time.NewTicker(s.cfg.MediaSweepInterval)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			s.SweepMedia(ctx)
		}
	})
}

func newMediaSweeper(svc *media.Service, s *Server) *media.Sweeper {
	return &media.Sweeper{Service: svc, Pool: s.pool, Claimant: uuid.New(), Grace: s.cfg.MediaSweepGrace, Batch: mediaSweepBatch}
}

// SweepMedia runs one batch of the media sweep and counts what it did.
func (s *Server) SweepMedia(ctx context.Context) media.SweepStats {
	st, err := s.mediaSweep.Sweep(ctx)
	s.metrics.MediaSweepBlobs.WithLabelValues("removed").Add(float64(st.Removed))
	s.metrics.MediaSweepBlobs.WithLabelValues("failed").Add(float64(st.Failed))
	if err != nil && ctx.Err() == nil {
		s.log.Error("media sweep failed; the next one starts where it stopped", "err", err)
	}
	if st.Removed > 0 {
		s.log.Info("media sweep removed unreferenced blobs", "blobs", st.Removed)
	}
	return st
}
