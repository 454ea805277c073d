package workflow

import (
	"errors"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Metrics are the workflow engine's and scheduler's collectors.
type Metrics struct {
	runs        *prometheus.CounterVec
	runSeconds  prometheus.Histogram
	scheduleLag prometheus.Histogram
	history     *prometheus.CounterVec
}

// NewMetrics registers the workflow collectors on reg (or reuses the ones
// already there, when a relay builds its handlers more than once).
func NewMetrics(reg prometheus.Registerer) (*Metrics, error) {
	m := &Metrics{
		runs: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "buzz_workflow_runs_total",
			Help: "Workflow runs that ended, by outcome (completed, failed, cancelled) and error_code (empty when completed): by a worker, an approval denied or expired, or refused at creation (capacity_exceeded).",
		}, []string{"outcome", "error_code"}),
		runSeconds: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "buzz_workflow_run_seconds",
			Help:    "Time from a run's creation to its end, delays and approvals included.",
			Buckets: prometheus.ExponentialBuckets(0.005, 4, 12),
		}),
		scheduleLag: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "buzz_workflow_schedule_lag_seconds",
			Help:    "How long after its slot a schedule slot was claimed.",
			Buckets: prometheus.ExponentialBuckets(0.01, 4, 10),
		}),
		history: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "buzz_workflow_history_deleted_total",
			Help: "Rows deleted by workflow history retention (BUZZ_WORKFLOW_RUN_RETENTION), by table: workflow_runs (their approvals go with them) and scheduled_workflow_fires.",
		}, []string{"table"}),
	}
	cs := []prometheus.Collector{m.runs, m.runSeconds, m.scheduleLag, m.history}
	for i, c := range cs {
		if err := reg.Register(c); err != nil {
			var already prometheus.AlreadyRegisteredError
			if !errors.As(err, &already) {
				return nil, err
			}
			cs[i] = already.ExistingCollector
		}
	}
	m.runs = cs[0].(*prometheus.CounterVec)
	m.runSeconds = cs[1].(prometheus.Histogram)
	m.scheduleLag = cs[2].(prometheus.Histogram)
	m.history = cs[3].(*prometheus.CounterVec)
	m.runs.WithLabelValues("completed", "")
	return m, nil
}

func (m *Metrics) runEnded(f *runFailure, took time.Duration) {
	if f == nil {
		m.runOver("completed", "", took)
	} else {
		m.runOver("failed", f.code, took)
	}
}

// runOver counts a run that ended with outcome (a terminal status) and
// code, took after its creation.
func (m *Metrics) runOver(outcome string, code ErrorCode, took time.Duration) {
	if m == nil {
		return
	}
	m.runs.WithLabelValues(outcome, string(code)).Inc()
	m.runSeconds.Observe(took.Seconds())
}

// refusedAtCapacity counts a run recorded failed at creation because its
// workflow had too many unfinished runs. It never ran, so it is not timed.
func (m *Metrics) refusedAtCapacity() {
	if m != nil {
		m.runs.WithLabelValues("failed", string(CodeCapacityExceeded)).Inc()
	}
}

func (m *Metrics) historyDeleted(table string, rows int64) {
	if m != nil && rows > 0 {
		m.history.WithLabelValues(table).Add(float64(rows))
	}
}

func (m *Metrics) slotClaimed(lag time.Duration) {
	if m != nil {
		m.scheduleLag.Observe(lag.Seconds())
	}
}
