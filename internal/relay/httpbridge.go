package relay

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"time"

	"github.com/google/uuid"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/buzzrelay/buzz/internal/community"
	"github.com/buzzrelay/buzz/internal/dberr"
	"github.com/buzzrelay/buzz/internal/eventstore"
	"github.com/buzzrelay/buzz/internal/ingest"
	"github.com/buzzrelay/buzz/internal/nipoa"
	"github.com/buzzrelay/buzz/internal/nostr"
	"github.com/buzzrelay/buzz/internal/presence"
)

// httpBridge serves the NIP-98 HTTP bridge: POST /events submits
// one event, POST /query and POST /count read with filters. Every route is
// bound to the community of its Host (404 before anything else), then
// authenticated with a NIP-98 Authorization header, then runs the same
// write and read spines as WebSocket: pipeline.Submit, readScope and the
// event store.
type httpBridge struct {
	s        *Server
	requests *prometheus.CounterVec // route, status
}

// registerHTTPBridge adds the bridge routes to mux.
func (s *Server) registerHTTPBridge(mux *http.ServeMux) {
	b := &httpBridge{s: s, requests: bridgeRequestsCounter(s.metrics.Registry)}
	for route, serve := range map[string]func(http.ResponseWriter, *http.Request, community.Tenant){
		"/events": b.serveEvents,
		"/query":  b.serveQuery,
		"/count":  b.serveCount,
	} {
		mux.Handle("POST "+route, b.instrument(route, s.withTenant(serve)))
		mux.HandleFunc("OPTIONS "+route, s.withTenant(serveBridgePreflight("POST")))
	}
	for _, get := range []struct {
		route, pattern string
		serve          func(http.ResponseWriter, *http.Request, community.Tenant)
	}{
		{"/workflows/runs", "/workflows/{id}/runs", b.serveWorkflowRuns},
		{"/workflows/approvals", "/workflows/{id}/runs/{run_id}/approvals", b.serveWorkflowApprovals},
		{"/v1/users/recorded-owner", "/v1/users/{pubkey}/recorded-owner", b.serveRecordedOwner},
	} {
		mux.Handle("GET "+get.pattern, b.instrument(get.route, s.withTenant(get.serve)))
		mux.HandleFunc("OPTIONS "+get.pattern, s.withTenant(serveBridgePreflight("GET")))
	}
}

// serveBridgePreflight answers a browser's CORS preflight for a bridge
// route: web clients sign NIP-98 with the user's key (NIP-07) and send it
// in Authorization, which only an explicit allowance lets through. No
// cookie or ambient credential authorizes anything here (the signature
// does, and WebSocket already takes every origin), so any origin may ask.
func serveBridgePreflight(method string) func(http.ResponseWriter, *http.Request, community.Tenant) {
	return func(w http.ResponseWriter, _ *http.Request, _ community.Tenant) {
		h := w.Header()
		h.Set("Access-Control-Allow-Origin", "*")
		h.Set("Access-Control-Allow-Headers", "Authorization, Content-Type")
		h.Set("Access-Control-Allow-Methods", method)
		h.Set("Access-Control-Max-Age", "86400")
		w.WriteHeader(http.StatusNoContent)
	}
}

// bridgeRequestsCounter registers the bridge's request counter on reg, or
// returns the one already there (Handler may be called more than once).
func bridgeRequestsCounter(reg *prometheus.Registry) *prometheus.CounterVec {
	c := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "buzz_http_bridge_requests_total",
		Help: "NIP-98 HTTP bridge requests, by route and HTTP status.",
	}, []string{"route", "status"})
	if err := reg.Register(c); err != nil {
		var already prometheus.AlreadyRegisteredError
		if errors.As(err, &already) {
			return already.ExistingCollector.(*prometheus.CounterVec)
		}
		panic(err)
	}
	return c
}

// statusRecorder remembers the status a handler answered with.
type statusRecorder struct {
	http.ResponseWriter
	status int
}

func (r *statusRecorder) WriteHeader(code int) {
	if r.status == 0 {
		r.status = code
	}
	r.ResponseWriter.WriteHeader(code)
}

func (r *statusRecorder) Write(p []byte) (int, error) {
	if r.status == 0 {
		r.status = http.StatusOK
	}
	return r.ResponseWriter.Write(p)
}

func (b *httpBridge) instrument(route string, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// Every answer, refusals included, is readable by a page on any
		// origin (see serveBridgePreflight), the NIP-98 challenge with it.
		w.Header().Set("Access-Control-Allow-Origin", "*")
		w.Header().Set("Access-Control-Expose-Headers", "WWW-Authenticate")
		rec := &statusRecorder{ResponseWriter: w}
		b.s.holdingPlace(b.s.admitBridge, next).ServeHTTP(rec, r)
		if rec.status == 0 {
			rec.status = http.StatusOK
		}
		b.requests.WithLabelValues(route, strconv.Itoa(rec.status)).Inc()
	})
}

// holdingPlace serves next while the request holds a place admit gives
// (admitBridge for the NIP-98 routes, admitWebhook for the workflow
// webhook), taken before the host lookup and the body, so that a refusal
// costs nothing.
func (s *Server) holdingPlace(admit func(addr string) (release func(), status int, reason string), next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		release, status, reason := admit(s.clientAddr(r))
		if status != 0 {
			w.Header().Set("Retry-After", "1")
			writeError(w, status, reason)
			return
		}
		defer release()
		next.ServeHTTP(w, r)
	})
}

// attestationRefusalPrefix is the NIP-01 prefix of an x-auth-tag refusal:
// a malformed header (400) or one that does not authorize the signer (401).
func attestationRefusalPrefix(status int) string {
	if status == http.StatusUnauthorized {
		return "auth-required: "
	}
	return "invalid: "
}

// writeError answers msg as JSON {"error": msg}. msg starts with its NIP-01
// prefix (invalid:, auth-required:, restricted:, blocked:, rate-limited:,
// error:), as a WebSocket answer would, so a client tells a request to fix
// from one to send again without reading the status.
func writeError(w http.ResponseWriter, status int, msg string) {
	writeJSON(w, status, map[string]string{"error": msg})
}

// communityBeingDeleted reports whether err is the refusal of a write the
// community's deletion fenced (from quiescing on): the answer is
// beingDeletedReason, over HTTP 410 Gone, never "try again".
func communityBeingDeleted(err error) bool {
	return ingest.IsCommunityBeingDeleted(err) || errors.Is(dberr.Interpret(err), dberr.ErrCommunityWriteFenced)
}

// beingDeletedReason is the answer to a write the community's deletion
// fenced, over WebSocket and HTTP alike.
var beingDeletedReason = ingest.ErrCommunityBeingDeleted().Error()

// authenticate runs NIP-98 and reads the body. It returns the authenticated
// pubkey and the body; ok false means it has already answered.
func (b *httpBridge) authenticate(w http.ResponseWriter, r *http.Request, tenant community.Tenant) (pubkey string, body []byte, ok bool) {
	who, body, ok := b.authenticatePrincipal(w, r, tenant)
	return who.Pubkey, body, ok
}

// principal is who an authenticated HTTP request speaks for.
type principal struct {
	Pubkey string
	// Owner is the agent's verified owner: attested by the request's
	// x-auth-tag header and the one on record; "" without the header, or
	// when a different owner is already recorded.
	Owner string
}

// authHeaderTag carries an agent's owner attestation on HTTP requests: the
// auth tag as a raw JSON array.
const authHeaderTag = "X-Auth-Tag"

// authenticatePrincipal is authenticate, plus the owner attestation of the
// x-auth-tag header: a malformed one is 400, before the auth event is
// claimed; one that does not authorize the NIP-98 signer is 401, after: its
// check is a signature, which a header sent again would otherwise have
// checked on every request.
func (b *httpBridge) authenticatePrincipal(w http.ResponseWriter, r *http.Request, tenant community.Tenant) (who principal, body []byte, ok bool) {
	s := b.s
	unauthorized := func(err error) {
		var ae *authError
		if communityBeingDeleted(err) {
			// The replay claim is the request's first write.
			writeError(w, http.StatusGone, beingDeletedReason)
			return
		}
		if errors.Is(err, errReadSlotsBusy) {
			writeError(w, http.StatusServiceUnavailable, busyReadingReason)
			return
		}
		if !errors.As(err, &ae) {
			if s.databaseUnreachable(w, err, "http auth claim") {
				return
			}
			if !errors.Is(err, errClaimNotRun) {
				s.log.Error("http auth failed", "community", tenant.Host(), "err", err)
			}
			writeError(w, http.StatusInternalServerError, "error: could not check authorization; try again")
			return
		}
		if ae.RetryAfter > 0 {
			w.Header().Set("Retry-After", retryAfterSeconds(ae.RetryAfter))
			writeError(w, http.StatusTooManyRequests, ae.Reason)
			return
		}
		w.Header().Set("WWW-Authenticate", "Nostr")
		writeError(w, http.StatusUnauthorized, "auth-required: "+ae.Reason)
	}
	ev, err := s.checkHTTPAuth(r)
	if err != nil {
		unauthorized(err)
		return principal{}, nil, false
	}
	refuseAttestation := func(status int, err error) {
		s.metrics.OwnerAttestations.WithLabelValues(ownerInvalid).Inc()
		if status == http.StatusUnauthorized {
			w.Header().Set("WWW-Authenticate", "Nostr")
		}
		writeError(w, status, attestationRefusalPrefix(status)+"x-auth-tag header: "+err.Error())
	}
	attestation, err := headerAttestation(r)
	if err != nil {
		refuseAttestation(http.StatusBadRequest, err)
		return principal{}, nil, false
	}
	body, err = io.ReadAll(http.MaxBytesReader(w, r.Body, int64(s.cfg.MaxMessageBytes)))
	if err != nil {
		var tooLarge *http.MaxBytesError
		if errors.As(err, &tooLarge) {
			writeError(w, http.StatusRequestEntityTooLarge, fmt.Sprintf("invalid: body exceeds the %d-byte limit", s.cfg.MaxMessageBytes))
		} else {
			writeError(w, http.StatusBadRequest, "invalid: could not read the request body")
		}
		return principal{}, nil, false
	}
	if err := checkPayload(ev, body); err != nil {
		unauthorized(err)
		return principal{}, nil, false
	}
	// Claimed last: a request refused above leaves its auth event unused.
	if err := s.claimHTTPAuth(r.Context(), tenant, ev); err != nil {
		unauthorized(err)
		return principal{}, nil, false
	}
	who = principal{Pubkey: ev.PubKey}
	if attestation != nil {
		s.metrics.HTTPAuthSignaturesChecked.Inc()
		signed, err := attestationSigned(attestation, ev)
		if err != nil {
			refuseAttestation(http.StatusUnauthorized, err)
			return principal{}, nil, false
		}
		if who.Owner, err = s.recordOwner(r.Context(), tenant, ev.PubKey, attestation, signed); err != nil {
			if !communityBeingDeleted(err) && r.Context().Err() == nil {
				// Nothing recorded, for the relay's reason (busy, or the
				// database failed): the same request may be sent again.
				s.releaseHTTPAuth(r.Context(), tenant, ev)
			}
			if communityBeingDeleted(err) || errors.Is(err, errReadSlotsBusy) {
				unauthorized(err) // 410 or 503, as for the claim
				return principal{}, nil, false
			}
			if s.databaseUnreachable(w, err, "http owner attestation") {
				return principal{}, nil, false
			}
			if r.Context().Err() == nil {
				s.log.Error("record owner attestation", "community", tenant.Host(), "agent", ev.PubKey, "err", err)
			}
			writeError(w, http.StatusInternalServerError, "error: could not record the owner attestation; try again")
			return principal{}, nil, false
		}
	}
	return who, body, true
}

// headerAttestation reads the x-auth-tag header: nil when absent; an
// error when malformed (400). Its signature is checked by attestationSigned.
func headerAttestation(r *http.Request) (*nipoa.Attestation, error) {
	values := r.Header.Values(authHeaderTag)
	switch len(values) {
	case 0:
		return nil, nil
	case 1:
	default:
		// Like an event with two auth tags: no valid attestation.
		return nil, fmt.Errorf("send at most one, this request has %d", len(values))
	}
	return nipoa.ParseHeader(values[0])
}

// attestationSigned verifies a, the x-auth-tag header, against the NIP-98
// event ev; an error does not authorize this agent (401). signed reports
// whether ev carries the same auth tag, which makes the header the agent's
// own word (see recordOwner); an auth tag in ev that differs from the
// header is refused.
func attestationSigned(a *nipoa.Attestation, ev *nostr.Event) (signed bool, err error) {
	if err := a.VerifyFor(ev.PubKey, ev.CreatedAt); err != nil {
		return false, err
	}
	for _, tag := range ev.Tags {
		if len(tag) == 0 || tag[0] != nipoa.TagName {
			continue
		}
		if signed || !slices.Equal(tag, a.Tag()) {
			return false, fmt.Errorf("%w: the request's signed event carries a different auth tag", nipoa.ErrRejected)
		}
		signed = true
	}
	return signed, nil
}

func (b *httpBridge) serveEvents(w http.ResponseWriter, r *http.Request, tenant community.Tenant) {
	s := b.s
	answered := &statusRecorder{ResponseWriter: w}
	pubkey, body, ok := b.authenticate(answered, r, tenant)
	if !ok {
		// Refused before it was read, counted once like any refused event.
		s.metrics.EventsRejected.WithLabelValues(unauthenticatedReason(answered.status)).Inc()
		return
	}
	ev, err := nostr.ParseEvent(body, s.limits)
	if err != nil {
		// As a WebSocket EVENT the parser refuses: the body is one event.
		s.metrics.EventsRejected.WithLabelValues("invalid").Inc()
		writeError(w, http.StatusBadRequest, "invalid: "+err.Error())
		return
	}
	if ok, retry := s.PublishLimiter.Allow(tenant.ID(), pubkey, s.now()); !ok {
		s.metrics.EventsRejected.WithLabelValues("rate-limited").Inc()
		s.metrics.RateLimited.Inc()
		w.Header().Set("Retry-After", strconv.Itoa(int(retry.Seconds())))
		writeJSON(w, http.StatusTooManyRequests, submitReply{ID: ev.ID, Accepted: false, Message: rateLimitedReason(retry)})
		return
	}
	outcome, reply, err := s.pipeline.SubmitReply(r.Context(), tenant, pubkey, ev)
	if err != nil {
		var rej *ingest.Rejection
		if !errors.As(err, &rej) {
			s.metrics.EventsRejected.WithLabelValues("error").Inc()
			// Whether it was stored is unknown when the database went
			// away during its COMMIT: sent again, a stored event is
			// answered as a duplicate, so the answer says try again
			// either way.
			if s.databaseUnreachable(w, err, "http ingest") {
				return
			}
			if r.Context().Err() == nil {
				s.log.Error("ingest failed", "community", tenant.Host(), "event", ev.ID, "kind", ev.Kind, "err", err)
			}
			writeError(w, http.StatusInternalServerError, "error: could not store the event; try again")
			return
		}
		s.metrics.EventsRejected.WithLabelValues(rej.Prefix).Inc()
		status := rejectionStatus(rej.Prefix)
		if ingest.IsCommunityBeingDeleted(err) {
			// Gone for good, unlike a refusal the author could lift: the
			// community's host answers 404 once its connections are closed.
			status = http.StatusGone
		}
		writeJSON(w, status, submitReply{ID: ev.ID, Accepted: false, Message: rej.Error()})
		return
	}
	s.metrics.EventsAccepted.WithLabelValues(outcomeLabel[outcome]).Inc()
	writeJSON(w, http.StatusOK, submitReply{ID: ev.ID, Accepted: true, Message: reply})
}

type submitReply struct {
	ID       string `json:"id"`
	Accepted bool   `json:"accepted"`
	Message  string `json:"message"`
}

// unauthenticatedReason is the NIP-01 prefix of authenticate's refusal
// answered status, as a WebSocket EVENT refused so is counted: 401 for
// want of authentication, as an EVENT before AUTH; 400 and 413 its body
// or header; 429 and 410 their own; 503 or 500 the relay's (busy, or the
// database failed at the claim, as at the insert).
func unauthenticatedReason(status int) string {
	switch status {
	case http.StatusUnauthorized:
		return "auth-required"
	case http.StatusBadRequest, http.StatusRequestEntityTooLarge:
		return "invalid"
	case http.StatusTooManyRequests:
		return "rate-limited"
	case http.StatusGone:
		return "blocked"
	}
	return "error"
}

// rejectionStatus maps a NIP-01 rejection prefix to the HTTP status.
func rejectionStatus(prefix string) int {
	switch prefix {
	case "restricted", "blocked", "auth-required":
		return http.StatusForbidden
	case "duplicate":
		return http.StatusConflict
	case "rate-limited":
		return http.StatusTooManyRequests
	case "error":
		return http.StatusInternalServerError
	}
	return http.StatusBadRequest // invalid, pow and anything unknown
}

func (b *httpBridge) serveQuery(w http.ResponseWriter, r *http.Request, tenant community.Tenant) {
	s := b.s
	filters, pubkey, ok := b.startRead(w, r, tenant)
	if !ok {
		return
	}
	// The query timeout bounds the read until its answer streams; from then
	// on each statement keeps its own timeout and the HTTP write timeout
	// bounds the client's download, as for a REQ's history.
	ctx, cancel := context.WithCancelCause(r.Context())
	defer cancel(nil)
	deadline := time.AfterFunc(s.cfg.QueryTimeout, func() { cancel(context.DeadlineExceeded) })
	defer deadline.Stop()
	start := time.Now()
	scope, reason, err := s.readScope(ctx, tenant, pubkey, filters)
	if reason != "" {
		writeError(w, http.StatusForbidden, reason)
		return
	}
	answer := newQueryAnswer(w, queryStreamAfter, func() { deadline.Stop() })
	stored := presence.NewStoredCount(filters)
	if err == nil {
		err = s.store.QueryJSON(ctx, tenant.ID(), scope, filters, func(event []byte, _ *uuid.UUID) error {
			stored.Add(event)
			return answer.add(event)
		})
	}
	if err == nil {
		// Presence as a REQ gets it before EOSE: the same read, over HTTP.
		var plan *presence.Plan
		plan, err = s.presencePlan(ctx, tenant, pubkey, filters, stored)
		if err == nil {
			for batch := plan.Next(ctx, presenceBatch); batch != nil && err == nil; batch = plan.Next(ctx, presenceBatch) {
				for _, event := range batch {
					if err = answer.add(event); err != nil {
						break
					}
				}
			}
		}
	}
	if err != nil {
		fail := b.readFailure(r, ctx, tenant, err)
		answer.abortIfStreaming()
		fail(w)
		return
	}
	answer.finish()
	s.metrics.ReqDuration.WithLabelValues("HTTP_QUERY").Observe(time.Since(start).Seconds())
}

func (b *httpBridge) serveCount(w http.ResponseWriter, r *http.Request, tenant community.Tenant) {
	s := b.s
	filters, pubkey, ok := b.startRead(w, r, tenant)
	if !ok {
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), s.cfg.QueryTimeout)
	defer cancel()
	start := time.Now()
	scope, reason, err := s.readScope(ctx, tenant, pubkey, filters)
	if reason != "" {
		writeError(w, http.StatusForbidden, reason)
		return
	}
	var answer struct {
		Count       int64 `json:"count"`
		Approximate bool  `json:"approximate,omitempty"` // NIP-45: at least Count
	}
	if err == nil {
		answer.Count, answer.Approximate, err = s.store.Count(ctx, tenant.ID(), scope, filters)
	}
	if err == nil && !answer.Approximate {
		// A capped count stays MaxCount, as the answer promises.
		answer.Count += s.presenceCount(ctx, tenant.ID(), filters)
	}
	if err != nil {
		b.readFailure(r, ctx, tenant, err)(w)
		return
	}
	writeJSON(w, http.StatusOK, answer)
	s.metrics.ReqDuration.WithLabelValues("HTTP_COUNT").Observe(time.Since(start).Seconds())
}

// startRead authenticates a read and parses its body into filters. ok
// false means it answered.
func (b *httpBridge) startRead(w http.ResponseWriter, r *http.Request, tenant community.Tenant) (nostr.Filters, string, bool) {
	pubkey, body, ok := b.authenticate(w, r, tenant)
	if !ok {
		return nil, "", false
	}
	filters, err := parseReadBody(body, b.s.limits)
	if err != nil {
		var fe *nostr.FilterFieldError
		if errors.As(err, &fe) {
			// Name the filter and field as data too, so a client can point
			// at the value it sent.
			writeJSON(w, http.StatusBadRequest, filterFieldReply{Error: "invalid: " + err.Error(), Filter: fe.Filter, Field: fe.Field})
			return nil, "", false
		}
		writeError(w, http.StatusBadRequest, "invalid: "+err.Error())
		return nil, "", false
	}
	return filters, pubkey, true
}

// filterFieldReply is the 400 body of a read refused for one filter field.
type filterFieldReply struct {
	Error  string `json:"error"`
	Filter int    `json:"filter"` // index in "filters"
	Field  string `json:"field"`
}

// parseReadBody decodes {"filters":[...]} with the same strict filter rules
// and limits as a WebSocket REQ/COUNT.
//
// The object's one key is matched exactly and once, as the filter parser
// matches its own: encoding/json alone would take "Filters" for
// "filters" and the last of two "filters", so a body could say one
// thing to a reader of its first key and another to the relay.
func parseReadBody(body []byte, lim nostr.Limits) (nostr.Filters, error) {
	notObject := func(err error) error {
		return fmt.Errorf("body must be a JSON object {\"filters\":[...]}: %v", err)
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		return nil, notObject(fmt.Errorf("got %v", firstNonNil(err, tok)))
	}
	var filters json.RawMessage
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return nil, notObject(err)
		}
		switch key, _ := tok.(string); {
		case key != "filters":
			return nil, notObject(fmt.Errorf("unknown field %q", key))
		case filters != nil:
			return nil, notObject(errors.New(`duplicate field "filters"`))
		}
		if err := dec.Decode(&filters); err != nil {
			return nil, notObject(err)
		}
	}
	if _, err := dec.Token(); err != nil { // the closing brace
		return nil, notObject(err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return nil, errors.New("unexpected data after the JSON object")
	}
	if filters == nil {
		return nil, errors.New(`"filters" is required: {"filters":[{...}]}`)
	}
	return nostr.ParseFilters(filters, lim)
}

func firstNonNil(err error, tok json.Token) any {
	if err != nil {
		return err
	}
	return tok
}

// readFailure logs a read that failed inside the database and returns its
// answer: a timeout is 503 (the client may retry), a database that could
// not be reached 503 with Retry-After (logged once per outage), anything
// else 500.
func (b *httpBridge) readFailure(r *http.Request, ctx context.Context, tenant community.Tenant, err error) (answer func(http.ResponseWriter)) {
	refuse := func(status int, msg string) func(http.ResponseWriter) {
		return func(w http.ResponseWriter) { writeError(w, status, msg) }
	}
	if errors.Is(err, eventstore.ErrReadSlotsBusy) {
		b.s.log.Warn("http read found every read slot busy", "community", tenant.Host(), "path", r.URL.Path)
		return refuse(http.StatusServiceUnavailable, busyReadingReason)
	}
	if errors.Is(context.Cause(ctx), context.DeadlineExceeded) || errors.Is(dberr.Interpret(err), dberr.ErrQueryCanceled) {
		b.s.log.Warn("http read timed out", "community", tenant.Host(), "path", r.URL.Path, "err", err)
		return refuse(http.StatusServiceUnavailable, "error: query timed out")
	}
	if b.s.outage.Failed(err, "http read") {
		return func(w http.ResponseWriter) { answerUnavailable(w, err) }
	}
	if r.Context().Err() == nil {
		b.s.log.Error("http read failed", "community", tenant.Host(), "path", r.URL.Path, "err", err)
	}
	return refuse(http.StatusInternalServerError, "error: query failed")
}
