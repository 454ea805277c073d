package relay

import (
	"context"
	"net/http"

	"github.com/google/uuid"

	"github.com/buzzrelay/buzz/internal/ingest"
	"github.com/buzzrelay/buzz/internal/outbox"
)

// Operator-listener mention delivery on the relay (docs/listener-delivery.md): mentions of
// registered targets become outbox rows in the event's own transaction, the
// ones this process delivers already claimed for its worker, which gets them
// right after commit and delivers them long before its poll would.

// enqueueMentions is a side row of every stored message that p-tags someone.
// It runs whether or not this process delivers: another pod's poll may.
func (s *Server) enqueueMentions(ctx context.Context, w *ingest.Write) error {
	worker := s.outboxWorker.Load()
	claimed, _, err := outbox.Enqueue(ctx, w.Q, worker, w.Tenant.ID(), w.ChannelID, w.Event, s.cfg.MaxMentionsPerEvent, s.clock)
	if err != nil || claimed.Empty() {
		return err
	}
	w.AfterCommit(func() {
		if n := worker.Offer(claimed); n > 0 {
			s.log.Debug("outbox hand-off full; the poll will deliver", "dropped", n)
		}
	})
	w.OnRollback(func() { worker.Abandon(claimed) })
	return nil
}

// StartOperatorListeners starts delivery for the listeners in cfg (none
// configured: enqueueing still happens, delivery is left to pods that route
// them) and serves the registration API. The relay key of the deployment's
// own community (home) signs the deliveries' NIP-98 headers. Call it once,
// before serving; the worker stops with ctx.
func (s *Server) StartOperatorListeners(ctx context.Context, cfg outbox.Config, home uuid.UUID, opts ...outbox.DelivererOption) error {
	m, err := outbox.NewMetrics(s.metrics.Registry)
	if err != nil {
		return err
	}
	relayKey, err := s.pipeline.RelayKey(ctx, home)
	if err != nil {
		return err
	}
	// Without an origin no NIP-98 u tag can be checked, so the API is not
	// served at all: a relay that has not set it up answers 404, like one
	// that has no operator plane, rather than a 500 that looks like a fault.
	if cfg.APIOrigin != "" {
		api := outbox.RegistrationHandler(s.pool, cfg.Listeners, cfg.APIOrigin, s.verifyOperatorAuth, s.databaseFailed, s.clock)
		s.operatorAPI.Store(&api)
	}
	if len(cfg.Listeners) == 0 {
		s.log.Info("operator-listener mention delivery off: this process routes no listener (BUZZ_OPERATOR_LISTENERS is empty); mentions are still queued for processes that do")
		return nil
	}
	if cfg.APIOrigin == "" {
		s.log.Warn("RELAY_OPERATOR_API_ORIGIN is not set: listener registration answers 404 until it is")
	}
	d := outbox.NewDeliverer(s.pool, cfg, relayKey, m, append([]outbox.DelivererOption{outbox.WithLogger(s.log), outbox.WithClock(s.clock), outbox.WithOutage(s.outage)}, opts...)...)
	w := outbox.NewWorker(s.pool, cfg.Listeners, d)
	s.outboxWorker.Store(w)
	s.workers.Go(func() { w.Run(ctx) })
	go d.KeepWarm(ctx)
	s.log.Info("operator-listener mention delivery worker started", "listeners", len(cfg.Listeners))
	return nil
}

// RunReapers runs the outbox and registration reapers (outbox.Reapers) on
// the relay's clock and logger until ctx ends. Run it on every pod.
func (s *Server) RunReapers(ctx context.Context) {
	outbox.Reapers(ctx, s.pool, outbox.WithReaperClock(s.clock), outbox.WithReaperLogger(s.log))
}

// RunListFolder writes large channels' admins and members lists once their
// membership changes are due (ingest.FoldChannelLists) until ctx ends. Run
// it on every pod: each due channel is claimed by one.
func (s *Server) RunListFolder(ctx context.Context) {
	s.pipeline.RunListFolder(ctx, func(err error) {
		if !s.outage.TickFailed(err, "channel lists fold") {
			s.log.Warn("channel lists: fold failed", "err", err)
		}
	})
}

// serveOperatorListeners is POST/DELETE /operator/listener/pubkeys. It is
// operator plane, not bound to a community.
func (s *Server) serveOperatorListeners(w http.ResponseWriter, r *http.Request) {
	api := s.operatorAPI.Load()
	if api == nil {
		writeJSON(w, http.StatusNotFound, map[string]string{"error": "invalid: operator listeners are not enabled on this relay"})
		return
	}
	(*api).ServeHTTP(w, r)
}
