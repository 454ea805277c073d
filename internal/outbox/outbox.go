// Package outbox delivers mention notifications to operator listeners:
// deployment-wide HTTPS endpoints that register target pubkeys and
// are told, with a NIP-98-signed POST, when a stored message mentions one.
//
// The event's own transaction inserts the outbox rows (Enqueue), those the
// saving pod routes already claimed for its Worker. After commit it hands
// them to the Worker (Offer), which POSTs them at once: the fast path. The
// Worker's poll is the safety net for everything else (rows saved
// elsewhere, dropped hand-offs, retries, expired leases). A claim is made
// at insert or by one FOR UPDATE SKIP LOCKED statement, always under a
// lease, and every later transition is fenced by (id, claim_id, state), so
// a row is delivered by at most one claimant at a time, across pods: no
// POST starts unless it ends, even at the request timeout, before its lease.
// Reapers drop rows past retention and expired registrations;
// RegistrationHandler serves POST/DELETE /operator/listener/pubkeys.
package outbox

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// The delivery constants (docs/listener-delivery.md explains each).
const (
	maxInFlight           = 10 // deliveries running at once per worker
	handoffCapacity       = 10 // ids a worker's hand-off channel holds; also the ids Enqueue keeps
	defaultLease          = 30 * time.Second
	leaseMargin           = 100 * time.Millisecond // a POST must end this long before its lease
	claimErrorSleep       = 2 * time.Second
	maxAttempts           = 9
	retention             = 15 * time.Minute
	releaseDelay          = 30 * time.Second
	outboxReapEvery       = 5 * time.Minute
	registrationReapEvery = 24 * time.Hour
	registrationLifetime  = 30 * 24 * time.Hour
)

// listenerCap is the most deliveries one listener may have in flight on a
// worker routing listeners of them: an equal share of the worker's slots
// (at least one). A listener that hangs then holds its share for a request
// timeout at a time, and the others keep theirs.
func listenerCap(listeners int) int {
	return max(1, maxInFlight/max(1, listeners))
}

// Delivery outcomes, the values of the deliveries counter's outcome label.
const (
	outcomeAccepted   = "accepted"
	outcomeRetry      = "retry"
	outcomeFailed     = "failed"
	outcomeUnroutable = "unroutable"
	outcomeStale      = "stale" // lease too short for the request: released unsent
	// deferred: a handed-off row released unsent, its listener already had
	// its share of the worker's slots in flight; the poll delivers it.
	outcomeDeferred = "deferred"
	// withdrawn: the poll deleted the row unsent, its target may no
	// longer read the mention (hidden, channel deleted, target removed).
	outcomeWithdrawn = "withdrawn"
)

// Metrics are the delivery counters, registered on the relay's registry.
type Metrics struct {
	deliveries     *prometheus.CounterVec
	handoffDropped prometheus.Counter
	// handedBackAtStop: claimed rows a stopping worker gave back to the
	// poll unsent, so an operator sees what each restart left to other pods.
	handedBackAtStop prometheus.Counter
	keepWarm         *prometheus.CounterVec
}

// NewMetrics creates the counters and registers them on reg.
func NewMetrics(reg prometheus.Registerer) (*Metrics, error) {
	m := &Metrics{
		deliveries: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "buzz_operator_listener_deliveries_total",
			Help: "Operator-listener delivery attempts, by outcome (accepted, retry, failed, unroutable, stale, deferred), and notifications withdrawn unsent (withdrawn).",
		}, []string{"outcome"}),
		handoffDropped: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "buzz_operator_listener_handoff_dropped_total",
			Help: "Outbox ids not handed to the local worker because its channel was full; the poll delivers them.",
		}),
		handedBackAtStop: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "buzz_operator_listener_handed_back_at_stop_total",
			Help: "Outbox rows claimed for the local worker that it handed back to the poll unsent as it stopped (waiting in its hand-off, or offered once it had stopped).",
		}),
		keepWarm: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "buzz_operator_listener_keepalive_total",
			Help: "HEAD requests sent to keep an idle listener's connection open, by result (answered, error).",
		}, []string{"result"}),
	}
	for _, c := range []prometheus.Collector{m.deliveries, m.handoffDropped, m.handedBackAtStop, m.keepWarm} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	// Every outcome series exists from the start, so rate() sees zeros.
	for _, o := range []string{outcomeAccepted, outcomeRetry, outcomeFailed, outcomeUnroutable, outcomeStale, outcomeDeferred, outcomeWithdrawn} {
		m.deliveries.WithLabelValues(o)
	}
	return m, nil
}
