package outbox

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/buzzrelay/buzz/internal/clock"
	"github.com/buzzrelay/buzz/internal/db"
	"github.com/buzzrelay/buzz/internal/dberr"
	"github.com/buzzrelay/buzz/internal/nostr"
	"github.com/buzzrelay/buzz/internal/outage"
)

// Deliverer sends one claimed row to its listener and records the outcome.
type Deliverer struct {
	q       *db.Queries
	routes  Routes
	key     *nostr.SecretKey
	client  *http.Client
	metrics *Metrics
	log     *slog.Logger
	clock   clock.Clock
	// outage counts the worker's polls failed by an unreachable database
	// into the process's one outage log (nil: each is logged).
	outage *outage.Log
	// idlePoll is cfg.IdlePoll, for the Worker built on this deliverer.
	idlePoll time.Duration
	// keepWarm is cfg.KeepWarm; lastUsed holds, per listener URL, when a
	// request last went out on its connection (unix nanoseconds).
	keepWarm time.Duration
	lastUsed map[string]*atomic.Int64
	// transitionTimeout bounds each statement that records an outcome
	// (transition): defaultLease, shortened by tests.
	transitionTimeout time.Duration
}

// listenerIdleConnTimeout is how long an unused connection to a listener
// is kept by this side: far beyond the keep-warm interval, so the only
// thing that closes a warm connection is the listener.
const listenerIdleConnTimeout = 15 * time.Minute

// HTTP/2 listeners get a PING after this much silence, which keeps the
// connection open through NATs and proves it alive before a delivery needs
// it; one not answered within listenerPingTimeout is dropped.
const (
	listenerPingAfter   = 15 * time.Second
	listenerPingTimeout = 5 * time.Second
)

// maxListenerResponseHeaderBytes bounds a listener's response headers; an
// answer with more fails like a network error (retried).
const maxListenerResponseHeaderBytes = 64 << 10

// DelivererOption adjusts a Deliverer.
type DelivererOption func(*Deliverer)

// WithRootCAs makes the deliverer trust only pool's certificates, for
// listeners with a private CA (tests: httptest.NewTLSServer's).
func WithRootCAs(pool *x509.CertPool) DelivererOption {
	return func(d *Deliverer) {
		d.client.Transport.(*http.Transport).TLSClientConfig = &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
	}
}

// WithLogger sets the logger (default slog.Default()).
func WithLogger(l *slog.Logger) DelivererOption {
	return func(d *Deliverer) { d.log = l }
}

// WithOutage makes the worker built on this deliverer report its polls
// failed by an unreachable database to o, the process's outage log, instead
// of an ERROR line each (one per pod every 2 s while the database is away).
func WithOutage(o *outage.Log) DelivererOption {
	return func(d *Deliverer) { d.outage = o }
}

// WithClock sets the time source of the deliverer and of the worker built
// on it (default: the wall clock).
func WithClock(c clock.Clock) DelivererOption {
	return func(d *Deliverer) { d.clock = c }
}

// NewDeliverer returns a deliverer for cfg's listeners that signs its NIP-98
// headers with the relay key and counts outcomes in m.
func NewDeliverer(pool *pgxpool.Pool, cfg Config, key *nostr.SecretKey, m *Metrics, opts ...DelivererOption) *Deliverer {
	transport := http.DefaultTransport.(*http.Transport).Clone()
	// Up to maxInFlight requests may go to one listener: keep that many
	// connections alive instead of redoing TLS handshakes.
	transport.MaxIdleConnsPerHost = maxInFlight
	// Nothing of an answer is used but its status: a listener's headers
	// are bounded like its body, not by the 10 MB default, which ten
	// deliveries in flight could each hold.
	transport.MaxResponseHeaderBytes = maxListenerResponseHeaderBytes
	transport.IdleConnTimeout = listenerIdleConnTimeout
	transport.HTTP2 = &http.HTTP2Config{SendPingTimeout: listenerPingAfter, PingTimeout: listenerPingTimeout}
	lastUsed := make(map[string]*atomic.Int64, len(cfg.Listeners))
	for _, url := range cfg.Listeners {
		lastUsed[url] = new(atomic.Int64)
	}
	d := &Deliverer{
		q:      db.New(pool),
		routes: cfg.Listeners,
		key:    key,
		client: &http.Client{
			Transport: transport,
			Timeout:   cfg.Timeout,
			// A redirect is a terminal failure and its target is never
			// contacted: the listener URL is the only address we sign for.
			CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
		},
		metrics:  m,
		log:      slog.Default(),
		idlePoll: cfg.IdlePoll,
		keepWarm: cfg.KeepWarm,
		lastUsed: lastUsed,

		transitionTimeout: defaultLease,
	}
	for _, opt := range opts {
		opt(d)
	}
	return d
}

// notification is the POST body; the field order is the wire order. It
// carries no content: the listener fetches the event itself.
type notification struct {
	V              int    `json:"v"`
	Pubkey         string `json:"pubkey"`
	CommunityHost  string `json:"community_host"`
	EventID        string `json:"event_id"`
	EventKind      int32  `json:"event_kind"`
	EventCreatedAt int64  `json:"event_created_at"`
}

func notificationBody(r db.OutboxClaimDueRow) ([]byte, error) {
	return json.Marshal(notification{
		V:              1,
		Pubkey:         hex.EncodeToString(r.TargetPubkey),
		CommunityHost:  r.Host,
		EventID:        hex.EncodeToString(r.EventID),
		EventKind:      r.EventKind,
		EventCreatedAt: r.EventCreatedAt.Unix(),
	})
}

// deliver runs one delivery. Every database transition is fenced by the
// claim, so a worker that lost its claim changes nothing.
func (d *Deliverer) deliver(ctx context.Context, c claim) {
	listener := hex.EncodeToString(c.row.ListenerPubkey)
	url, ok := d.routes[listener]
	if !ok {
		// Another pod may route it: hand the row back without spending an
		// attempt. (The claims' route filter makes this rare.)
		n, err := d.record(ctx, func(tctx context.Context) (int64, error) {
			return d.q.OutboxRelease(tctx, db.OutboxReleaseParams{
				DelayMs: releaseDelay.Milliseconds(), ID: c.row.ID, ClaimID: c.claimID, Now: d.clock.SQL(),
			})
		})
		d.fenced(c, "release", n, err)
		d.metrics.deliveries.WithLabelValues(outcomeUnroutable).Inc()
		return
	}
	log := d.log.With("listener", listener, "outbox_id", c.row.ID, "attempt", c.row.Attempts)

	req, err := d.request(url, c)
	if err != nil {
		d.fail(ctx, c, log, "cannot build request", err)
		return
	}
	// Past its lease the row may be claimed and POSTed by another pod's
	// poll, so a POST must end, even at the request timeout, before the
	// lease does. A claim too old for that (a hand-off that waited for a
	// slot) goes back to the poll unsent, due at once, its attempt not
	// spent; the poll's fresh claim has the whole lease.
	if !d.clock.Now().Add(d.client.Timeout + leaseMargin).Before(c.leaseEnds) {
		d.releaseNow(ctx, c)
		d.metrics.deliveries.WithLabelValues(outcomeStale).Inc()
		log.Info("operator-listener delivery left to the poll: its lease would end before the request", "lease_ends", c.leaseEnds)
		return
	}
	d.lastUsed[url].Store(time.Now().UnixNano())
	resp, err := d.client.Do(req.WithContext(ctx))
	if err != nil {
		d.retryOrFail(ctx, c, log, err, 0)
		return
	}
	// Read a little so the connection can be reused, never the whole body.
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 4<<10))
	resp.Body.Close()

	switch s := resp.StatusCode; {
	case s >= 200 && s < 300:
		n, err := d.record(ctx, func(tctx context.Context) (int64, error) {
			return d.q.OutboxComplete(tctx, db.OutboxCompleteParams{ID: c.row.ID, ClaimID: c.claimID})
		})
		d.fenced(c, "complete", n, err)
		d.metrics.deliveries.WithLabelValues(outcomeAccepted).Inc()
	case s == http.StatusRequestTimeout || s == http.StatusTooManyRequests || s >= 500:
		d.retryOrFail(ctx, c, log, fmt.Errorf("listener answered %d", s), retryAfter(resp.Header, d.clock.Now()))
	default:
		d.fail(ctx, c, log, "listener refused the delivery", fmt.Errorf("listener answered %d", s))
	}
}

// signedRequest is a delivery's body and NIP-98 header, signed ahead of
// the delivery: Enqueue has the rows it claims signed while the event's
// transaction has yet to commit, so the signature, most of a delivery's
// work before its POST, overlaps the commit's flush instead of following
// it. ready is closed once the fields are set.
type signedRequest struct {
	ready chan struct{}
	url   string
	at    time.Time // the header's created_at
	body  []byte
	auth  string
	err   error
}

// signedFreshFor is how old a header signed ahead may be when its POST
// goes out; an older one (a hand-off that waited for a slot) is signed
// again, so a listener checking NIP-98's time window never sees an old one.
const signedFreshFor = 5 * time.Second

// signAhead starts signing the deliveries of claims, to be sent once
// their event commits, on one goroutine, and calls done when it has signed
// them all. A claim of a listener this pod does not route is left unsigned
// (deliver releases that row).
func (d *Deliverer) signAhead(claims []claim, done func()) {
	var work []*claim
	at := d.clock.Now()
	for i := range claims {
		if url, ok := d.routes[hex.EncodeToString(claims[i].row.ListenerPubkey)]; ok {
			claims[i].signed = &signedRequest{ready: make(chan struct{}), url: url, at: at}
			work = append(work, &claims[i])
		}
	}
	go func() {
		defer done()
		for _, c := range work {
			s := c.signed
			s.body, s.auth, s.err = signDelivery(d.key, s.url, c.row, s.at)
			close(s.ready)
		}
	}()
}

// signDelivery builds the POST body of r and its NIP-98 header, signed at.
func signDelivery(key *nostr.SecretKey, url string, r db.OutboxClaimDueRow, at time.Time) (body []byte, auth string, err error) {
	if body, err = notificationBody(r); err != nil {
		return nil, "", err
	}
	if auth, err = nostr.HTTPAuthHeader(key, http.MethodPost, url, body, at); err != nil {
		return nil, "", err
	}
	return body, auth, nil
}

// request is c's POST to url: signed ahead when that is done, for url and
// fresh enough, else signed now.
func (d *Deliverer) request(url string, c claim) (*http.Request, error) {
	var body []byte
	var auth string
	var err error
	now := d.clock.Now()
	if s := c.signed; s != nil && s.url == url && now.Sub(s.at) < signedFreshFor {
		<-s.ready
		body, auth, err = s.body, s.auth, s.err
	} else {
		body, auth, err = signDelivery(d.key, url, c.row, now)
	}
	if err != nil {
		return nil, err
	}
	req, err := http.NewRequest(http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Authorization", auth)
	req.Header.Set("Content-Type", "application/json")
	return req, nil
}

// transition bounds one statement recording a delivery's outcome. The loop
// waits for every delivery to end before it reuses the slot, and deliveries
// run under a context that is never cancelled (they finish on shutdown), so
// a statement on a stalled PostgreSQL (a stopped backend, a connection
// dropped without a word, a row lock never released) held its slot for
// good: ten of them and the pod delivered nothing again until restarted,
// and its shutdown waited for them. Giving up leaves the row leased under
// this claim: after the lease any poll claims it again, and a row that was
// in fact delivered is delivered again, which at-least-once delivery
// allows. A whole lease is ample for a one-row statement and, by then, the
// row is due again anyway.
func (d *Deliverer) transition(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, d.transitionTimeout)
}

// transitionAttempts is how many times a transition statement runs when it
// fails for a transient reason (dberr.IsTransient).
const transitionAttempts = 3

// record runs a transition statement under the transition timeout, again
// (up to transitionAttempts in all) when it failed for a transient reason:
// a pooled connection whose session the server ended (a restart, a
// failover, pg_terminate_backend) fails its next statement, and a delivery
// the listener took would stay leased and be POSTed again after the lease.
// Running it again is safe: it is fenced on the claim, so a first attempt
// that committed unseen makes the next match no row (a lost fence, logged).
func (d *Deliverer) record(ctx context.Context, stmt func(context.Context) (int64, error)) (int64, error) {
	tctx, cancel := d.transition(ctx)
	defer cancel()
	pause := 50 * time.Millisecond
	for attempt := 1; ; attempt++ {
		n, err := stmt(tctx)
		if err == nil || attempt == transitionAttempts || !dberr.IsTransient(err) {
			return n, err
		}
		select {
		case <-tctx.Done():
			return n, err
		case <-time.After(pause):
		}
		pause *= 2
	}
}

// releaseNow hands a claimed row back to the poll, due at once and its
// attempt not spent: for rows claimed at insert that the hand-off could not
// take. Fenced like every transition.
func (d *Deliverer) releaseNow(ctx context.Context, c claim) {
	n, err := d.record(ctx, func(tctx context.Context) (int64, error) {
		return d.q.OutboxRelease(tctx, db.OutboxReleaseParams{
			DelayMs: 0, ID: c.row.ID, ClaimID: c.claimID, Now: d.clock.SQL(),
		})
	})
	d.fenced(c, "release", n, err)
}

// releaseDeferred hands back a handed-off row whose listener already has
// its share of the worker's slots in flight (loop.run), counted as deferred.
func (d *Deliverer) releaseDeferred(ctx context.Context, c claim) {
	d.releaseNow(ctx, c)
	d.metrics.deliveries.WithLabelValues(outcomeDeferred).Inc()
}

// retryDelay is 2^(attempt-1) seconds, attempt clamped to 1..8: 1 s to 128 s.
func retryDelay(attempt int32) time.Duration {
	return time.Second << min(max(attempt-1, 0), 7)
}

// maxRetryAfter bounds the wait a listener may ask for (Retry-After): the
// longest backoff, so a listener cannot park its rows past their retention.
const maxRetryAfter = 128 * time.Second

// retryAfter is the wait a listener's Retry-After asks for (delay seconds
// or an HTTP date), at most maxRetryAfter; 0 when it asks for none.
func retryAfter(h http.Header, now time.Time) time.Duration {
	v := strings.TrimSpace(h.Get("Retry-After"))
	if v == "" {
		return 0
	}
	var wait time.Duration
	if secs, err := strconv.ParseInt(v, 10, 64); err == nil {
		wait = time.Duration(min(max(secs, 0), int64(maxRetryAfter/time.Second))) * time.Second
	} else if at, err := http.ParseTime(v); err == nil {
		wait = at.Sub(now)
	}
	return min(max(wait, 0), maxRetryAfter)
}

// retryOrFail reschedules a transient failure, or ends the row when this
// was the last allowed attempt. The retry waits the attempt's backoff, or
// longer when the listener asked for it (atLeast, from Retry-After).
func (d *Deliverer) retryOrFail(ctx context.Context, c claim, log *slog.Logger, cause error, atLeast time.Duration) {
	if c.row.Attempts >= maxAttempts {
		d.fail(ctx, c, log, "retries exhausted", cause)
		return
	}
	delay := max(retryDelay(c.row.Attempts), atLeast)
	n, err := d.record(ctx, func(tctx context.Context) (int64, error) {
		return d.q.OutboxRetry(tctx, db.OutboxRetryParams{
			DelayMs: delay.Milliseconds(), ID: c.row.ID, ClaimID: c.claimID, MaxAttempts: maxAttempts, Now: d.clock.SQL(),
		})
	})
	d.fenced(c, "retry", n, err)
	d.metrics.deliveries.WithLabelValues(outcomeRetry).Inc()
	log.Info("operator-listener delivery will be retried", "in", delay, "cause", cause)
}

// fail ends the row: a terminal failure deletes it like a success.
func (d *Deliverer) fail(ctx context.Context, c claim, log *slog.Logger, why string, cause error) {
	n, err := d.record(ctx, func(tctx context.Context) (int64, error) {
		return d.q.OutboxComplete(tctx, db.OutboxCompleteParams{ID: c.row.ID, ClaimID: c.claimID})
	})
	d.fenced(c, "fail", n, err)
	d.metrics.deliveries.WithLabelValues(outcomeFailed).Inc()
	log.Warn("operator-listener delivery failed: "+why, "cause", cause)
}

// fenced logs a transition that did not apply. Zero rows means the claim is
// gone (lease expired and the row was claimed again, or it was reaped); an
// error leaves the row leased, and it is claimed again after the lease.
func (d *Deliverer) fenced(c claim, action string, rows int64, err error) {
	switch {
	case err != nil:
		d.log.Error("operator-listener outbox transition failed", "action", action, "outbox_id", c.row.ID, "err", err)
	case rows == 0:
		d.log.Warn("completion lost its claim", "action", action, "outbox_id", c.row.ID, "claim_id", c.claimID)
	}
}

// KeepWarm keeps a connection open to every listener until ctx ends: at
// start, and whenever a listener's connection has carried nothing for
// cfg.KeepWarm, it sends an unsigned HEAD of the listener's URL. The answer
// is ignored (a listener may well refuse it); what matters is the open
// connection the next delivery reuses, so neither the first mention nor
// one after a quiet spell pays a TCP and TLS handshake.
func (d *Deliverer) KeepWarm(ctx context.Context) {
	if d.keepWarm <= 0 || len(d.lastUsed) == 0 {
		return
	}
	tick := time.NewTicker(d.keepWarm / 4)
	defer tick.Stop()
	for {
		for url, last := range d.lastUsed {
			if time.Since(time.Unix(0, last.Load())) >= d.keepWarm {
				d.warm(ctx, url, last)
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

func (d *Deliverer) warm(ctx context.Context, url string, last *atomic.Int64) {
	last.Store(time.Now().UnixNano())
	req, err := http.NewRequestWithContext(ctx, http.MethodHead, url, nil)
	if err != nil {
		return // the URL was validated at start-up
	}
	resp, err := d.client.Do(req)
	if err != nil {
		if ctx.Err() == nil {
			d.metrics.keepWarm.WithLabelValues("error").Inc()
			d.log.Debug("operator listener keep-alive failed", "err", err)
		}
		return
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 4<<10))
	resp.Body.Close()
	d.metrics.keepWarm.WithLabelValues("answered").Inc()
}
