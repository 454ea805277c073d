package relay

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/google/uuid"

	"github.com/buzzrelay/buzz/internal/community"
	"github.com/buzzrelay/buzz/internal/db"
	"github.com/buzzrelay/buzz/internal/dberr"
	"github.com/buzzrelay/buzz/internal/nostr"
	"github.com/buzzrelay/buzz/internal/outbox"
)

// replaySlack is added to the NIP-98 window when a claimed auth event's row
// expires: it absorbs clock skew between relay pods and the database, so a
// row is never purged while its event could still pass the created_at check.
const replaySlack = 60 * time.Second

// purgeEvery bounds how often one community's expired claims are purged.
const purgeEvery = time.Minute

// replayPurgeBatch bounds the expired claims one purge deletes, so a
// request that purges a backlog (250,000 rows took half a second) waits
// for a few milliseconds of it.
const replayPurgeBatch = 5000

// authError is a NIP-98 refusal; Reason is sent to the client with 401,
// or with 429 and Retry-After when RetryAfter is set (the signature was
// not checked: see httpSignatures).
type authError struct {
	Reason     string
	RetryAfter time.Duration
}

func (e *authError) Error() string { return e.Reason }

func authFail(format string, args ...any) error {
	return &authError{Reason: fmt.Sprintf(format, args...)}
}

// checkHTTPAuth verifies the request's NIP-98 Authorization header
// against the URL the client addressed, except the payload hash, which
// needs the body (checkPayload), and the replay claim, which comes last
// (claimHTTPAuth). It returns the verified auth event; failures are
// *authError.
func (s *Server) checkHTTPAuth(r *http.Request) (*nostr.Event, error) {
	return s.verifyHTTPAuth(r, s.requestURL(r))
}

// verifyOperatorAuth is the operator API's NIP-98 check (outbox
// registration): the u tag must be expectedURL (built from
// RELAY_OPERATOR_API_ORIGIN, not from the Host a proxy forwarded), and the
// payload tag is required.
func (s *Server) verifyOperatorAuth(r *http.Request, body []byte, expectedURL string) (*nostr.Event, error) {
	ev, err := s.authHeaderEvent(r.Header.Get("Authorization"))
	if err != nil {
		return nil, err
	}
	if ev, err = s.bindHTTPAuth(ev, r, expectedURL); err != nil {
		return nil, err
	}
	if ev.Tags.First("payload") == nil {
		return nil, authFail("auth event has no payload tag")
	}
	if err := checkPayload(ev, body); err != nil {
		return nil, err
	}
	// Served on the public listener, so its signatures are bounded per
	// address like every other signed request's.
	err = s.verifyHTTPSignature(r, ev)
	var ae *authError
	if errors.As(err, &ae) && ae.RetryAfter > 0 {
		return nil, &outbox.RateLimitedError{Reason: ae.Reason, RetryAfter: ae.RetryAfter}
	}
	if err != nil {
		return nil, err
	}
	return ev, nil
}

func (s *Server) verifyHTTPAuth(r *http.Request, expectedURL string) (*nostr.Event, error) {
	ev, err := s.authHeaderEvent(r.Header.Get("Authorization"))
	if err != nil {
		return nil, err
	}
	if ev, err = s.bindHTTPAuth(ev, r, expectedURL); err != nil {
		return nil, err
	}
	return ev, s.verifyHTTPSignature(r, ev)
}

// verifyHTTPSignature checks ev's id and signature, last, once every check
// that costs nothing passed, and only while the client's address may have
// it checked (httpSignatures): past that, the refusal is 429 with
// Retry-After and the signature is not checked. An id that does not match
// costs a hash, and a signature that verified within the auth window is
// not checked again.
func (s *Server) verifyHTTPSignature(r *http.Request, ev *nostr.Event) error {
	if !ev.CheckID() {
		return authFail(authEventBadID)
	}
	now := s.now()
	if s.httpSignatures.verified.seen(ev, now) {
		return nil
	}
	addr := addressBucket(s.clientAddr(r))
	check, retry, ok := s.httpSignatures.allow(addr, ev.PubKey, now)
	if !ok {
		s.metrics.HTTPAuthRateLimited.Inc()
		return &authError{
			Reason:     fmt.Sprintf("rate-limited: too many requests with bad signatures from this address; try again in %s", retry),
			RetryAfter: retry,
		}
	}
	s.metrics.HTTPAuthSignaturesChecked.Inc()
	err := verifyAuthEvent(ev)
	s.httpSignatures.outcome(addr, ev.PubKey, check, err == nil)
	if err == nil {
		s.httpSignatures.verified.add(ev, now)
	}
	return err
}

const authEventBadID = "auth event id does not match its content"

// retryAfterSeconds is a Retry-After header's value for d: whole seconds,
// rounded up.
func retryAfterSeconds(d time.Duration) string {
	return strconv.FormatInt(int64(math.Ceil(d.Seconds())), 10)
}

// verifyAuthEvent checks an auth event's id and signature.
func verifyAuthEvent(ev *nostr.Event) error {
	if err := ev.Verify(); err != nil {
		if errors.Is(err, nostr.ErrBadID) {
			return authFail(authEventBadID)
		}
		return authFail("auth event: %v", err)
	}
	return nil
}

// authHeaderEvent decodes and parses the event of a "Nostr <base64
// event>" Authorization header, whatever its kind (NIP-98 and Blossom
// share the form); its signature is checked last, by the caller
// (verifyHTTPSignature), once the checks that cost nothing passed.
func (s *Server) authHeaderEvent(header string) (*nostr.Event, error) {
	if header == "" {
		return nil, authFail("missing Authorization header; send Authorization: Nostr <base64 kind 27235 event>")
	}
	scheme, token, _ := strings.Cut(strings.TrimSpace(header), " ")
	if !strings.EqualFold(scheme, "Nostr") {
		return nil, authFail("Authorization scheme must be Nostr")
	}
	token = strings.TrimSpace(token)
	raw, err := base64.StdEncoding.DecodeString(token)
	if err != nil {
		// Some clients drop the padding; accept that, nothing else.
		if raw, err = base64.RawStdEncoding.DecodeString(token); err != nil {
			return nil, authFail("Authorization token is not valid base64")
		}
	}
	ev, err := nostr.ParseEvent(raw, s.limits)
	if err != nil {
		return nil, authFail("auth event: %v", err)
	}
	return ev, nil
}

// bindHTTPAuth checks that ev, an auth event not yet verified, is a NIP-98 event
// for this request: its kind, its time window, its u tag (expectedURL) and
// its method.
func (s *Server) bindHTTPAuth(ev *nostr.Event, r *http.Request, expectedURL string) (*nostr.Event, error) {
	if ev.Kind != nostr.KindHTTPAuth {
		return nil, authFail("auth event must be kind %d", nostr.KindHTTPAuth)
	}
	window := int64(s.cfg.AuthWindow.Seconds())
	now := s.now().Unix()
	if ev.CreatedAt < now-window {
		return nil, authFail("auth event expired: created_at must be within %s of now", s.cfg.AuthWindow)
	}
	if ev.CreatedAt > now+window {
		return nil, authFail("auth event created_at is in the future: it must be within %s of now", s.cfg.AuthWindow)
	}
	u := ev.Tags.First("u")
	if u == nil {
		return nil, authFail("auth event has no u tag")
	}
	if !sameURL(u[1], expectedURL) {
		return nil, authFail("u tag does not match this URL (%s)", expectedURL)
	}
	method := ev.Tags.First("method")
	if method == nil {
		return nil, authFail("auth event has no method tag")
	}
	if !strings.EqualFold(method[1], r.Method) {
		return nil, authFail("method tag does not match this request's method (%s)", r.Method)
	}
	return ev, nil
}

// checkPayload binds the auth event to the request body: whenever there is a
// body, the payload tag must be present and be its hex SHA-256. Without it a
// captured header could carry any other body until the replay claim, and an
// intercepting proxy could swap the body of a signed request.
func checkPayload(ev *nostr.Event, body []byte) error {
	tag := ev.Tags.First("payload")
	if tag == nil {
		if len(body) == 0 {
			return nil
		}
		return authFail("auth event has no payload tag; a request with a body must sign the body's SHA-256 in it")
	}
	sum := sha256.Sum256(body)
	if !strings.EqualFold(tag[1], hex.EncodeToString(sum[:])) {
		return authFail("payload tag does not match the SHA-256 of the request body")
	}
	return nil
}

// errAuthEventUsed says how to sign anew: two identical requests signed in
// the same second are the same event (same id), so re-signing alone does
// not help; the event must differ.
const errAuthEventUsed = "auth event already used; sign a new one for every request " +
	"(identical requests signed in the same second are one event: add a nonce tag or vary created_at)"

// errClaimNotRun marks a claim whose client left while it waited for a
// read slot: its statement never ran, nothing went wrong, and it is not
// logged. A claim whose statement its client's leaving cut off is not
// marked: the statement may have been stuck behind a lock, which every
// client gives up on in turn, and it stays logged.
var errClaimNotRun = errors.New("the client left before its claim ran")

// claimHTTPAuth records the auth event as used in this community; a second
// use is a replay. The row lives until the event could no longer pass the
// created_at check, plus slack; the claims themselves purge their
// community's expired rows, at most once per purgeEvery, whichever route
// claims (a community whose clients only upload media signed with NIP-98
// kept every claim when only the bridge purged).
func (s *Server) claimHTTPAuth(ctx context.Context, tenant community.Tenant, ev *nostr.Event) error {
	// Any key signs a valid claim, so it waits for a read slot.
	release, err := s.readSlot(ctx)
	if err != nil {
		if ctx.Err() != nil {
			return fmt.Errorf("%w: %w", errClaimNotRun, err)
		}
		return err
	}
	defer release()
	id := ev.IDBytes()
	n, err := s.queries.HTTPAuthReplayClaim(ctx, db.HTTPAuthReplayClaimParams{
		CommunityID: tenant.ID(),
		EventID:     id[:],
		ExpiresAt:   time.Unix(ev.CreatedAt, 0).Add(s.cfg.AuthWindow + replaySlack),
	})
	if err != nil {
		return err
	}
	// After the claim, so the request's first write is its claim, where
	// the community's write fence answers a community being deleted.
	s.purgeExpiredClaims(ctx, tenant)
	if n == 0 {
		return authFail(errAuthEventUsed)
	}
	return nil
}

// purgeExpiredClaims deletes a batch of tenant's expired claims, at most
// once per purgeEvery unless a batch left some behind.
func (s *Server) purgeExpiredClaims(ctx context.Context, tenant community.Tenant) {
	now := s.now()
	if !s.replays.due(tenant.ID(), now) {
		return
	}
	// The relay's clock, which checked the created_at the expiry is
	// counted from: on the database's, running ahead, a claim still
	// within its window was purged and its replay accepted.
	n, err := s.queries.HTTPAuthReplaysPurge(ctx, db.HTTPAuthReplaysPurgeParams{CommunityID: tenant.ID(), Now: now, Batch: replayPurgeBatch})
	if err != nil {
		s.log.Warn("purge expired http auth claims", "community", tenant.Host(), "err", err)
	}
	if err != nil || n == replayPurgeBatch {
		s.replays.again(tenant.ID()) // the next claim purges on
	}
}

// releaseClaimTimeout bounds giving a claim back.
const releaseClaimTimeout = 5 * time.Second

// releaseHTTPAuth gives back the claim this request made of ev: the
// request stored nothing and failed for the relay's reason (busy, a lapsed
// lease, a failing store or database), so the client may send the same
// header again within its window instead of signing anew. Only a claim the
// request itself made: releasing one another request holds would let a
// replay of that request through. Like a claim's, the statement is one
// per signed request; it takes no read slot, since the request already
// failed once for want of one. On a context of its own: the client may be
// gone. A failed release only costs the client a new signature. It is
// counted (buzz_http_auth_release_failures_total), and logged unless the
// database is unreachable: during an outage every request that fails
// gives its claim back and fails again, and the request itself is already
// counted in the outage's failed requests, so a WARN for each buried the
// outage's one line again.
func (s *Server) releaseHTTPAuth(ctx context.Context, tenant community.Tenant, ev *nostr.Event) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), releaseClaimTimeout)
	defer cancel()
	id := ev.IDBytes()
	if err := s.queries.HTTPAuthReplayRelease(ctx, db.HTTPAuthReplayReleaseParams{CommunityID: tenant.ID(), EventID: id[:]}); err != nil {
		s.metrics.HTTPAuthReleaseFailures.Inc()
		if !dberr.IsUnreachable(err) {
			s.log.Warn("give back an http auth claim", "community", tenant.Host(), "err", err)
		}
	}
}

// replayPurger throttles the purge of expired replay claims to once per
// purgeEvery per community. Purging from the request path needs no
// goroutine to start or stop, and a community only accumulates claims while
// it receives signed requests, each of whose claims may trigger its purge:
// the table stays at about three minutes of auth events per community (a
// minute's window, a minute's slack, a purge at most a minute late).
type replayPurger struct {
	mu   sync.Mutex
	last map[uuid.UUID]time.Time
}

// again lets community's next claim purge at once: a batch left expired
// claims behind, or the purge failed.
func (p *replayPurger) again(community uuid.UUID) {
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.last, community)
}

// due reports whether community's purge should run now, and if so records
// that it ran, so concurrent requests do not all purge.
func (p *replayPurger) due(community uuid.UUID, now time.Time) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if last, ok := p.last[community]; ok && now.Sub(last) < purgeEvery {
		return false
	}
	if p.last == nil {
		p.last = map[uuid.UUID]time.Time{}
	}
	p.last[community] = now
	return true
}

// requestURL is the absolute URL the client addressed: the scheme from
// X-Forwarded-Proto when a trusted TLS-terminating proxy set it, else from
// the connection; the Host header; and the request URI.
func (s *Server) requestURL(r *http.Request) string {
	scheme := "http"
	if r.TLS != nil {
		scheme = "https"
	}
	if fwd := s.forwardedProto(r); fwd != "" {
		scheme = fwd
	}
	return scheme + "://" + r.Host + r.URL.RequestURI()
}

// sameURL compares a signed URL with the request's as NIP-98 asks: scheme
// and host without regard to case, the host through community.NormalizeHost
// (so localhost, 127.0.0.1 and [::1] are one host, and the signed URL's
// default port drops, see urlHost), one trailing slash of the path
// ignored; query strings must be identical.
func sameURL(signed, request string) bool {
	us, errS := url.Parse(strings.TrimSpace(signed))
	ur, errR := url.Parse(strings.TrimSpace(request))
	if errS != nil || errR != nil || ur.Host == "" {
		return false
	}
	host, ok := urlHost(us)
	return ok && strings.EqualFold(us.Scheme, ur.Scheme) &&
		community.NormalizeHost(host) == community.NormalizeHost(ur.Host) &&
		strings.TrimSuffix(us.EscapedPath(), "/") == strings.TrimSuffix(ur.EscapedPath(), "/") &&
		us.RawQuery == ur.RawQuery
}
