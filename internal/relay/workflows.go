package relay

import (
	"context"
	"crypto/x509"
	"net/http"
	"time"

	"github.com/google/uuid"

	"github.com/buzzrelay/buzz/internal/community"
	"github.com/buzzrelay/buzz/internal/workflow"
	"github.com/buzzrelay/buzz/internal/workflow/safehttp"
)

// registerWorkflows adds workflow definitions, triggers and the manual
// command to the write spine. Runs created by an event are offered to this
// process's worker after commit, once StartWorkflows started one.
func (s *Server) registerWorkflows() {
	m, err := workflow.NewMetrics(s.metrics.Registry)
	if err != nil {
		// Only a collector of the same name with other labels causes this:
		// a programming error every relay test would catch.
		panic(err)
	}
	s.workflowStats = m
	workflow.RegisterTriggers(s.pipeline, &workflow.Triggers{
		Offer:               func(community uuid.UUID, ids []uuid.UUID) { s.workflowWorker.Load().Offer(community, ids) },
		MaxUnfinishedRuns:   s.cfg.WorkflowMaxUnfinishedRuns,
		MaxPerChannel:       s.cfg.WorkflowMaxPerChannel,
		MinScheduleInterval: s.cfg.WorkflowMinScheduleInterval,
		Metrics:             m,
	})
}

// WorkflowOption adjusts the workflow worker StartWorkflows runs.
type WorkflowOption func(*safehttp.Options)

// WithWebhookRootCAs makes call_webhook steps verify servers against roots
// instead of the system's (tests: a TLS server on loopback).
func WithWebhookRootCAs(roots *x509.CertPool) WorkflowOption {
	return func(o *safehttp.Options) { o.RootCAs = roots }
}

// StartWorkflows runs the workflow worker and the schedule scheduler until
// ctx ends. Every relay process may run them: runs are claimed under a
// lease, so several workers on one database never execute the same step
// twice, and a schedule slot is claimed by one process only.
func (s *Server) StartWorkflows(ctx context.Context, opts ...WorkflowOption) error {
	m := s.workflowStats
	hooks := safehttp.Options{
		Timeout:          s.cfg.WorkflowWebhookTimeout,
		MaxResponseBytes: int64(s.cfg.WorkflowWebhookResponseBytes),
		AllowedNets:      s.cfg.WorkflowWebhookAllowedNets,
	}
	for _, opt := range opts {
		opt(&hooks)
	}
	webhooks := safehttp.New(hooks)
	engine := workflow.NewEngine(s.pool, s.pipeline, workflow.EngineOptions{
		Lease: s.cfg.WorkflowRunLease, Clock: s.clock, Log: s.log, Metrics: m, Webhooks: webhooks, StepTimeout: s.cfg.WorkflowStepTimeout,
		Outage: s.outage,
	})
	w := workflow.NewWorker(engine, workflow.WorkerOptions{MaxInFlight: s.cfg.WorkflowMaxRuns, Poll: s.cfg.WorkflowPoll})
	s.workflowWorker.Store(w)
	s.workers.Go(func() { w.Run(ctx) })
	sched := workflow.NewScheduler(s.pool, s.clock, s.cfg.WorkflowCatchUp, w.Offer, s.log)
	sched.Metrics = m
	sched.Outage = s.outage
	sched.MaxUnfinishedRuns = s.cfg.WorkflowMaxUnfinishedRuns
	sched.RunRetention = s.cfg.WorkflowRunRetention
	sched.MinScheduleInterval = s.cfg.WorkflowMinScheduleInterval
	s.workers.Go(func() { sched.Run(ctx, s.cfg.WorkflowPoll) })
	return nil
}

// serveWorkflowWebhook starts a webhook-triggered run (POST /hooks/{id}).
// It works on every process; the run is offered to this process's worker
// if it runs one, else another process's poll finds it.
func (s *Server) serveWorkflowWebhook(w http.ResponseWriter, r *http.Request, tenant community.Tenant) {
	hooks := workflow.Webhooks{
		Pool: s.pool, Clock: s.clock, MaxBytes: int64(s.cfg.WebhookMaxBytes), Offer: s.workflowWorker.Load().Offer,
		MaxUnfinishedRuns: s.cfg.WorkflowMaxUnfinishedRuns, Metrics: s.workflowStats,
		ReadSlot: s.readSlot, Log: s.log, Outage: s.outage,
		Allow: func(community uuid.UUID, owner string) (bool, time.Duration) {
			ok, retry := s.PublishLimiter.Allow(community, owner, s.now())
			if !ok {
				s.metrics.RateLimited.Inc()
			}
			return ok, retry
		},
	}
	hooks.Serve(w, r, tenant.ID())
}
