package relay

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"mime"
	"net/http"
	"net/url"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/google/uuid"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/buzzrelay/buzz/internal/community"
	"github.com/buzzrelay/buzz/internal/dberr"
	"github.com/buzzrelay/buzz/internal/deletion"
	"github.com/buzzrelay/buzz/internal/media"
	"github.com/buzzrelay/buzz/internal/nostr"
)

// WithMedia serves Blossom media from svc under /media/; without it the
// media routes answer 404.
func WithMedia(svc *media.Service) Option {
	return func(o *options) { o.media = svc }
}

func (s *Server) registerMedia(mux *http.ServeMux) {
	mux.HandleFunc("PUT /media/upload", s.countMedia("upload", s.withTenant(s.serveMediaUpload)))
	mux.HandleFunc("HEAD /media/upload", s.countMedia("upload_check", s.withTenant(s.serveMediaUploadCheck)))
	mux.HandleFunc("GET /media/{name}", s.countMedia("get", s.withTenant(s.serveMediaGet))) // HEAD too
	mux.HandleFunc("DELETE /media/{name}", s.countMedia("delete", s.withTenant(s.serveMediaDelete)))
	mux.HandleFunc("OPTIONS /media/{name}", s.countMedia("preflight", s.withTenant(serveMediaPreflight)))
}

// serveMediaPreflight answers a browser's CORS preflight as BUD-01 asks:
// Blossom clients are web apps on other origins, and an upload or delete
// sends Authorization, which only an explicit allowance lets through
// (a bare * in Access-Control-Allow-Headers does not cover it). No cookie
// or ambient credential authorizes anything here, so any origin may ask.
func serveMediaPreflight(w http.ResponseWriter, _ *http.Request, _ community.Tenant) {
	h := w.Header()
	h.Set("Access-Control-Allow-Headers", "Authorization, *")
	h.Set("Access-Control-Allow-Methods", "GET, HEAD, PUT, DELETE")
	h.Set("Access-Control-Max-Age", "86400")
	w.WriteHeader(http.StatusNoContent)
}

// countMedia counts a media request by operation and status, and the bytes
// it read and wrote.
func (s *Server) countMedia(op string, next http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		label := op
		if op == "get" && r.Method == http.MethodHead {
			label = "head"
		}
		// Every media answer, refusals included, is readable by a page on
		// any origin (BUD-01), the refusal's reason with it.
		w.Header().Set("Access-Control-Allow-Origin", "*")
		w.Header().Set("Access-Control-Expose-Headers", "X-Reason, Content-Range, ETag")
		body := &countingReader{ReadCloser: r.Body}
		r.Body = body
		rec := &countingWriter{ResponseWriter: w, status: http.StatusOK}
		next(rec, r)
		s.metrics.MediaRequests.WithLabelValues(label, strconv.Itoa(rec.status)).Inc()
		s.metrics.MediaBytes.WithLabelValues("in").Add(float64(body.n))
		s.metrics.MediaBytes.WithLabelValues("out").Add(float64(rec.n))
	}
}

type countingReader struct {
	io.ReadCloser
	n int64
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.ReadCloser.Read(p)
	c.n += int64(n)
	return n, err
}

// countingWriter records the status and counts body bytes, those its
// ReadFrom passes on included.
type countingWriter struct {
	http.ResponseWriter
	status      int
	wroteHeader bool
	n           int64
}

func (c *countingWriter) WriteHeader(status int) {
	if !c.wroteHeader {
		c.status, c.wroteHeader = status, true
	}
	c.ResponseWriter.WriteHeader(status)
}

func (c *countingWriter) Write(p []byte) (int, error) {
	c.wroteHeader = true
	n, err := c.ResponseWriter.Write(p)
	c.n += int64(n)
	return n, err
}

// ReadFrom keeps the writer's own ReadFrom (sendfile from a file-backed
// blob, which http.ServeContent copies with io.CopyN) and counts what it
// wrote; without it every download went through a 32 KiB buffer.
func (c *countingWriter) ReadFrom(r io.Reader) (int64, error) {
	c.wroteHeader = true
	n, err := readFrom(c.ResponseWriter, r)
	c.n += n
	return n, err
}

// readFrom copies r to w with w's own ReadFrom when it has one.
func readFrom(w io.Writer, r io.Reader) (int64, error) {
	if rf, ok := w.(io.ReaderFrom); ok {
		return rf.ReadFrom(r)
	}
	return io.Copy(struct{ io.Writer }{w}, r)
}

// Unwrap keeps http.ResponseController working through the wrapper.
func (c *countingWriter) Unwrap() http.ResponseWriter { return c.ResponseWriter }

// mediaOffReason answers every media route of a relay without media.
const mediaOffReason = "blocked: media is not enabled on this relay"

// mediaError answers a refusal as JSON, with the reason also in X-Reason,
// where Blossom clients look for it.
func mediaError(w http.ResponseWriter, status int, msg string) {
	w.Header().Set("X-Reason", msg)
	writeError(w, status, msg)
}

// blobDescriptor is the BUD-02 blob descriptor.
type blobDescriptor struct {
	URL      string `json:"url"`
	SHA256   string `json:"sha256"`
	Size     int64  `json:"size"`
	Type     string `json:"type"`
	Uploaded int64  `json:"uploaded"`
}

// mediaAuth checks the Authorization header for action ("upload" or
// "delete"): either a NIP-98 event bound to this URL and method, or a
// Blossom kind 24242 event whose t tag is action, that has not expired
// and, when it names servers, names this host. A NIP-98 upload's event
// must carry a payload tag: no body passes without one, so the upload is
// refused before its body is read, and its preflight too. It returns the
// event; failures are *authError.
func (s *Server) mediaAuth(r *http.Request, action string) (*nostr.Event, error) {
	ev, err := s.authHeaderEvent(r.Header.Get("Authorization"))
	if err != nil {
		return nil, err
	}
	// The signed, parsed kind decides: a peek at the raw JSON could read
	// another member than the parser does ({"kind":1,...,"KIND":24242}).
	switch ev.Kind {
	case nostr.KindHTTPAuth:
		if ev, err = s.bindHTTPAuth(ev, r, s.requestURL(r)); err != nil {
			return nil, err
		}
		if action == "upload" && ev.Tags.First("payload") == nil { // before the signature's cost
			return nil, authFail("auth event has no payload tag; an upload must sign the body's SHA-256 in it")
		}
		return ev, s.verifyHTTPSignature(r, ev)
	case nostr.KindBlossomAuth:
	default:
		return nil, authFail("auth event must be kind %d (Blossom) or %d (NIP-98)", nostr.KindBlossomAuth, nostr.KindHTTPAuth)
	}
	now := s.now().Unix()
	if ev.CreatedAt > now+int64(s.cfg.AuthWindow.Seconds()) {
		return nil, authFail("auth event created_at is in the future")
	}
	until, ok, err := ev.Expiration()
	if err != nil {
		return nil, authFail("auth event expiration is not a unix time")
	}
	if !ok {
		return nil, authFail("auth event has no expiration tag")
	}
	if until <= now {
		return nil, authFail("auth event expired at %d", until)
	}
	if t := ev.Tags.First("t"); t == nil || t[1] != action {
		return nil, authFail("auth event t tag must be %q for this request", action)
	}
	var servers []string
	for _, tag := range ev.Tags {
		if len(tag) >= 2 && tag[0] == "server" {
			servers = append(servers, tag[1])
		}
	}
	if len(servers) > 0 && !slices.ContainsFunc(servers, func(v string) bool { return sameServer(v, r.Host) }) {
		return nil, authFail("auth event server tags do not name this host (%s)", r.Host)
	}
	return ev, s.verifyHTTPSignature(r, ev)
}

// sameServer compares a Blossom server tag (a bare domain or a URL) with
// the request's Host, as the relay tells communities apart: a port other
// than the default names another community (relay.example:8443 is not
// relay.example), so a tag without a port names the default port only.
func sameServer(tag, host string) bool {
	tag = strings.TrimSpace(tag)
	if strings.Contains(tag, "://") {
		u, err := url.Parse(tag)
		if err != nil {
			return false
		}
		var ok bool
		if tag, ok = urlHost(u); !ok {
			return false
		}
	}
	tag, _, _ = strings.Cut(tag, "/")
	return community.NormalizeHost(tag) == community.NormalizeHost(host)
}

// urlHost is u's host without the port when that is its scheme's default
// (443 for https, 80 for http). It is false for https on port 80 or http on
// 443, which name no port this relay serves that scheme on, though
// community.NormalizeHost would drop either.
func urlHost(u *url.URL) (string, bool) {
	port := u.Port()
	switch {
	case u.Host == "":
		return "", false
	case port == defaultPorts[strings.ToLower(u.Scheme)]:
		return strings.TrimSuffix(u.Host, ":"+port), true
	case port == "443" || port == "80":
		return "", false
	}
	return u.Host, true
}

// defaultPorts are the ports a URL of each scheme names when it names none.
var defaultPorts = map[string]string{"https": "443", "http": "80"}

// hashTags are the x tag values of a Blossom event, lowercased.
func hashTags(ev *nostr.Event) []string {
	var out []string
	for _, tag := range ev.Tags {
		if len(tag) >= 2 && tag[0] == "x" {
			out = append(out, strings.ToLower(tag[1]))
		}
	}
	return out
}

func (s *Server) mediaUnauthorized(w http.ResponseWriter, r *http.Request, tenant community.Tenant, err error) {
	var ae *authError
	if communityBeingDeleted(err) {
		mediaError(w, http.StatusGone, beingDeletedReason)
		return
	}
	if errors.Is(err, errReadSlotsBusy) {
		mediaError(w, http.StatusServiceUnavailable, busyReadingReason)
		return
	}
	if !errors.As(err, &ae) {
		// Only the NIP-98 claim reaches the database here: its network
		// errors are the database's, never the media store's.
		if s.mediaDatabaseUnreachable(w, err, "media auth claim") {
			return
		}
		if !errors.Is(err, errClaimNotRun) {
			s.log.Error("media auth failed", "community", tenant.Host(), "err", err)
		}
		mediaError(w, http.StatusInternalServerError, "error: could not check authorization; try again")
		return
	}
	if ae.RetryAfter > 0 {
		w.Header().Set("Retry-After", retryAfterSeconds(ae.RetryAfter))
		mediaError(w, http.StatusTooManyRequests, ae.Reason)
		return
	}
	w.Header().Set("WWW-Authenticate", "Nostr")
	mediaError(w, http.StatusUnauthorized, "auth-required: "+ae.Reason)
}

// mediaDatabaseUnreachable is databaseUnreachable for a media request,
// the reason in X-Reason too. Only for an error of a database statement
// (the claim's, the lease's): the media store's network errors would pass
// for an unreachable database.
func (s *Server) mediaDatabaseUnreachable(w http.ResponseWriter, err error, what string) bool {
	if !dberr.IsUnreachable(err) {
		return false
	}
	w.Header().Set("X-Reason", dberr.UnavailableAnswer)
	return s.databaseUnreachable(w, err, what)
}

// mediaUploader is who may upload here, or false once the client was
// answered (media off, or no valid upload authorization).
func (s *Server) mediaUploader(w http.ResponseWriter, r *http.Request, tenant community.Tenant) (*nostr.Event, bool) {
	if s.media == nil {
		mediaError(w, http.StatusNotFound, mediaOffReason)
		return nil, false
	}
	ev, err := s.mediaAuth(r, "upload")
	if err != nil {
		s.mediaUnauthorized(w, r, tenant, err)
		return nil, false
	}
	return ev, true
}

// mediaRateLimited takes one token of pubkey's publish bucket for a media
// write (uploads and deletes share it with events), or answers 429 and
// reports true.
func (s *Server) mediaRateLimited(w http.ResponseWriter, tenant community.Tenant, pubkey string) bool {
	ok, retry := s.PublishLimiter.Allow(tenant.ID(), pubkey, s.now())
	if !ok {
		w.Header().Set("Retry-After", strconv.Itoa(int(retry.Seconds())))
		mediaError(w, http.StatusTooManyRequests, rateLimitedReason(retry))
	}
	return !ok
}

// mediaFenced answers a media write the community's deletion refused
// (410: the community is going away) or a lease that could not be taken
// for another reason.
func (s *Server) mediaFenced(w http.ResponseWriter, r *http.Request, tenant community.Tenant, err error) {
	if communityBeingDeleted(err) {
		mediaError(w, http.StatusGone, beingDeletedReason)
		return
	}
	s.mediaFailed(w, r, tenant, err)
}

// mediaLease takes the serving-write lease of a media write. Any key may
// upload, so the statement waits for a read slot; the lease's renewals and
// its release are one short statement each, at most one per media write in
// flight (BUZZ_MEDIA_MAX_UPLOADS bounds the uploads).
func (s *Server) mediaLease(r *http.Request, tenant community.Tenant, operation string) (*deletion.ServingLease, context.Context, error) {
	release, err := s.readSlot(r.Context())
	if err != nil {
		return nil, nil, err
	}
	defer release()
	return deletion.AcquireServingLease(r.Context(), s.pool, tenant.ID(), operation)
}

// relayQuota makes a quota reservation wait for a read slot (any key may
// upload). A release does not: it gives back what a reservation took, at
// most once each, so reservations bound releases, and one failed for a
// busy relay would leave the bytes counted for good.
type relayQuota struct {
	media.Quota
	slot     func(context.Context) (func(), error)
	log      *slog.Logger
	failures *prometheus.CounterVec
	retries  *backgroundRetries // the server's, stopped by Shutdown
}

func (q relayQuota) Reserve(ctx context.Context, community uuid.UUID, size int64) error {
	release, err := q.slot(ctx)
	if err != nil {
		return err
	}
	defer release()
	return mediaDatabaseFailed(q.Quota.Reserve(ctx, community, size))
}

// Quota releases are tried releaseAttempts times, each bounded by
// releaseAttemptTimeout, releaseBackoff apart (doubling); at most
// releaseRetriesInFlight releases are retried in the background at once.
const (
	releaseAttempts        = 4
	releaseAttemptTimeout  = 5 * time.Second
	releaseBackoff         = time.Second
	releaseRetriesInFlight = 64
)

// Release gives size back to community's count, however the request that
// reserved it ended: on a context of its own (the client may be gone). The
// first attempt is made here; after a failure the attempts left run in the
// background, after the answer, without the operation's serving-write
// lease (a lapsed lease's guard refuses every statement presented under
// it, while an active community's count needs no lease): inside the
// request they delayed the answer by up to ~27 s against a failing
// database and held one of the relay's upload places meanwhile. Given up,
// the count stays high for good, so every failed attempt is logged and
// counted (buzz_media_quota_release_failures_total). Only a community
// being deleted refuses for good: its count goes with it. Once the retries
// are handed to the background Release returns nil (a delete that ends in
// it did delete); retried here, it returns their outcome.
func (q relayQuota) Release(ctx context.Context, community uuid.UUID, size int64) error {
	err := q.releaseOnce(context.WithoutCancel(ctx), community, size)
	if communityBeingDeleted(err) {
		// Refused as fenced: the community is being deleted, or the
		// operation's lease lapsed, whose guard refuses like the fence.
		// Without the lease, at once, only the former still refuses.
		if err = q.releaseOnce(deletion.WithoutServingLease(context.WithoutCancel(ctx)), community, size); communityBeingDeleted(err) {
			return err
		}
	}
	if err == nil {
		return nil
	}
	q.failures.WithLabelValues("retried").Inc()
	q.retrying(community, size, 1, err)
	retry := func(ctx context.Context, stop <-chan struct{}) (record func()) {
		if errors.Is(q.retryRelease(ctx, stop, community, size), errReleaseLost) {
			return q.countLost
		}
		return nil
	}
	if q.retries.start(retry) {
		return nil
	}
	// The relay is shutting down, or as many releases are being retried as
	// it allows: retried here, as the request's own work.
	err = q.retryRelease(context.Background(), q.retries.stopping(), community, size)
	if errors.Is(err, errReleaseLost) {
		q.countLost()
	}
	return err
}

// errReleaseLost is retryRelease's answer when its last attempt failed:
// the community's count stays high.
var errReleaseLost = errors.New("media quota release lost after every attempt failed")

func (q relayQuota) countLost() { q.failures.WithLabelValues("lost").Inc() }

// releaseOnce is one attempt, bounded by releaseAttemptTimeout. Callers
// pass a context the client's hang-up does not end; a background retry's
// ends when Shutdown abandons it.
func (q relayQuota) releaseOnce(ctx context.Context, community uuid.UUID, size int64) error {
	ctx, cancel := context.WithTimeout(ctx, releaseAttemptTimeout)
	defer cancel()
	return q.Quota.Release(ctx, community, size)
}

// retryRelease makes the attempts after the first, releaseBackoff apart
// (doubling); once stop is closed (the relay is shutting down) a waiting
// retry skips its backoff and makes its last attempt at once. Its
// attempts run on ctx: once ctx ends (Shutdown's time ran out and
// abandoned it), it gives up without counting more. It returns
// errReleaseLost when its last attempt failed; the caller counts it.
func (q relayQuota) retryRelease(ctx context.Context, stop <-chan struct{}, community uuid.UUID, size int64) error {
	backoff := releaseBackoff
	for attempt := 2; ; attempt++ {
		last := attempt == releaseAttempts
		select {
		case <-time.After(backoff):
		case <-stop:
			last = true
		}
		backoff *= 2
		err := q.releaseOnce(deletion.WithoutServingLease(ctx), community, size)
		if err == nil {
			return nil
		}
		if communityBeingDeleted(err) || ctx.Err() != nil {
			return err
		}
		if last {
			q.log.Error("media quota release lost: the community's count stays high", "community", community, "bytes", size, "attempts", attempt, "err", err)
			return fmt.Errorf("%w: %w", errReleaseLost, err)
		}
		q.failures.WithLabelValues("retried").Inc()
		q.retrying(community, size, attempt, err)
	}
}

// retrying logs a failed release attempt another follows, unless the
// database is unreachable: every upload or delete that ends during an
// outage gives its bytes back, and each attempt's WARN buried the outage's
// one line (the request is counted in its failed requests, the attempt in
// buzz_media_quota_release_failures_total). A release that is lost is
// logged whatever the cause: the community's count stays high until an
// operator corrects it, and the line says by how much.
func (q relayQuota) retrying(community uuid.UUID, size int64, attempt int, err error) {
	if !dberr.IsUnreachable(err) {
		q.log.Warn("media quota release failed; retrying", "community", community, "bytes", size, "attempt", attempt, "err", err)
	}
}

// backgroundRetries runs work after the answer for the server's lifetime:
// at most a fixed number at once, stopped by Shutdown, which waits for
// them until its context ends and then abandons the rest.
type backgroundRetries struct {
	mu      sync.Mutex
	stopped bool
	stop    chan struct{}
	slots   chan struct{}
	running sync.WaitGroup
	// ctx is the retries' own, ended by abandon once Shutdown's time ran
	// out; inFlight counts the retries not yet settled.
	ctx       context.Context
	abandon   context.CancelFunc
	abandoned bool
	inFlight  int
	// onAbandoned is told how many retries Shutdown abandoned.
	onAbandoned func(n int)
}

func newBackgroundRetries(limit int) *backgroundRetries {
	ctx, abandon := context.WithCancel(context.Background())
	return &backgroundRetries{stop: make(chan struct{}), slots: make(chan struct{}, limit), ctx: ctx, abandon: abandon}
}

// start runs fn in a goroutine of its own, handing it the retries'
// context and the stop channel, or reports false when the server is
// stopping or every slot is taken. The record fn returns (nil: none) is
// run when it ends, unless Shutdown abandoned it first and counted it so.
func (b *backgroundRetries) start(fn func(ctx context.Context, stop <-chan struct{}) (record func())) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.stopped {
		return false
	}
	select {
	case b.slots <- struct{}{}:
	default:
		return false
	}
	b.inFlight++
	b.running.Add(1)
	go func() {
		defer func() { <-b.slots; b.running.Done() }()
		record := fn(b.ctx, b.stop)
		b.mu.Lock()
		defer b.mu.Unlock()
		b.inFlight--
		if record != nil && !b.abandoned {
			record()
		}
	}()
	return true
}

// stopping is closed once shutdown began.
func (b *backgroundRetries) stopping() <-chan struct{} { return b.stop }

// shutdown tells every retry to finish now and waits for them, or for ctx.
func (b *backgroundRetries) shutdown(ctx context.Context) error {
	b.mu.Lock()
	if !b.stopped {
		b.stopped = true
		close(b.stop)
	}
	b.mu.Unlock()
	done := make(chan struct{})
	go func() { b.running.Wait(); close(done) }()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
	}
	// Out of time: the retries still running are abandoned (their
	// statements cancelled) and counted, once, here; the process is about
	// to end, and a retry settling later would not be counted at all.
	b.mu.Lock()
	n := 0
	if !b.abandoned {
		b.abandoned, n = true, b.inFlight
	}
	b.mu.Unlock()
	b.abandon()
	if n > 0 && b.onAbandoned != nil {
		b.onAbandoned(n)
	}
	return ctx.Err()
}

func (s *Server) serveMediaUpload(w http.ResponseWriter, r *http.Request, tenant community.Tenant) {
	ev, ok := s.mediaUploader(w, r, tenant)
	if !ok {
		return
	}
	limits := s.media.Limits()
	if r.ContentLength > limits.MaxBytes {
		mediaError(w, http.StatusRequestEntityTooLarge, fmt.Sprintf("invalid: blob too large: %d bytes, the limit is %d", r.ContentLength, limits.MaxBytes))
		return
	}
	release, status, reason := s.admitUpload(s.clientAddr(r))
	if release == nil {
		w.Header().Set("Retry-After", "1")
		mediaError(w, status, reason)
		return
	}
	defer release()
	if s.mediaRateLimited(w, tenant, ev.PubKey) {
		return
	}
	claimed := false // this request claimed its NIP-98 event
	declared := strings.ToLower(strings.TrimSpace(r.Header.Get("X-SHA-256")))
	// The bytes must be the ones the client signed or declared: a NIP-98
	// payload tag, a Blossom event's x tags, the X-SHA-256 header.
	accept := func(sha string) error {
		if declared != "" && declared != sha {
			return fmt.Errorf("%w: the body's SHA-256 is %s, X-SHA-256 names %s", media.ErrHashMismatch, sha, declared)
		}
		if ev.Kind == nostr.KindHTTPAuth {
			payload := ev.Tags.First("payload") // present: mediaAuth
			if !strings.EqualFold(payload[1], sha) {
				return fmt.Errorf("%w: the body's SHA-256 is %s, the payload tag names %s", media.ErrHashMismatch, sha, payload[1])
			}
			// Claimed only for bytes it signed, before anything is stored.
			err := s.claimHTTPAuth(r.Context(), tenant, ev)
			claimed = err == nil
			return authCheckFailed(err)
		}
		if x := hashTags(ev); len(x) > 0 && !slices.Contains(x, sha) {
			return fmt.Errorf("%w: the body's SHA-256 is %s, the auth event's x tag names another", media.ErrHashMismatch, sha)
		}
		return nil
	}
	// The upload writes objects outside the database: it holds a
	// serving-write lease, so a community deletion waits for it before
	// listing what to delete, and an upload cannot start once the
	// deletion began.
	lease, ctx, err := s.mediaLease(r, tenant, "media_upload")
	if err != nil {
		if !s.mediaDatabaseUnreachable(w, err, "media lease") {
			s.mediaFenced(w, r, tenant, err)
		}
		return
	}
	defer lease.Release(r.Context())
	body := &answerAfterBody{ReadCloser: r.Body, rc: http.NewResponseController(w), timeout: s.cfg.HTTPWriteTimeout}
	d, err := s.media.Upload(ctx, tenant.ID(), ev.PubKey, body, accept)
	body.extend() // a refusal that left the body unread is answered on the same terms
	if err != nil {
		err = leaseLapsed(ctx, err)
		if claimed && media.StoredNothing(err) && relayAtFault(r, err) {
			s.releaseHTTPAuth(r.Context(), tenant, ev) // before the answer, which invites the retry
		}
		s.mediaFenced(w, r, tenant, err) // the quota's row is fenced once the deletion quiesces
		return
	}
	writeJSON(w, http.StatusOK, s.descriptor(r, d))
}

// answerAfterBody gives an upload's answer BUZZ_HTTP_WRITE_TIMEOUT from
// the end of its body rather than from its headers: the body alone may
// take BUZZ_HTTP_READ_TIMEOUT, and an upload stored after the server's
// write deadline had its answer cut off, so its client took it for a
// failure. Set once, when the body ends, the deadline still bounds the
// store's writes and the answer.
type answerAfterBody struct {
	io.ReadCloser
	rc       *http.ResponseController
	timeout  time.Duration
	extended bool
}

func (b *answerAfterBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if err != nil {
		b.extend()
	}
	return n, err
}

func (b *answerAfterBody) extend() {
	if b.extended || b.timeout <= 0 {
		return
	}
	b.extended = true
	_ = b.rc.SetWriteDeadline(time.Now().Add(b.timeout))
}

// relayAtFault reports whether a media write failed for the relay's
// reason (busy, its lease lapsed, its spool or store failed), not for the
// client's (a refusal, a hang-up) nor because the community is going away:
// one the client may send again as it was.
func relayAtFault(r *http.Request, err error) bool {
	var ae *authError
	switch {
	case errors.Is(err, errReadSlotsBusy), errors.Is(err, deletion.ErrServingLeaseLapsed), errors.Is(err, media.ErrSpool):
		return true
	case r.Context().Err() != nil, communityBeingDeleted(err), errors.As(err, &ae), errors.Is(err, errAuthCheck),
		errors.Is(err, media.ErrTooLarge), errors.Is(err, media.ErrTypeNotAllowed), errors.Is(err, media.ErrHashMismatch),
		errors.Is(err, media.ErrEmpty), errors.Is(err, media.ErrBodyUnreadable), errors.Is(err, media.ErrNotFound),
		errors.Is(err, media.ErrQuotaExceeded), errors.Is(err, media.ErrNotUploader):
		return false
	}
	return true // the store or the database failed
}

// leaseLapsed is err, marked as the lapse of the operation's serving-write
// lease when that is what ended the operation's context (its statements
// and store calls then fail with a bare cancellation).
func leaseLapsed(ctx context.Context, err error) error {
	if cause := context.Cause(ctx); errors.Is(cause, deletion.ErrServingLeaseLapsed) && !errors.Is(err, cause) {
		return fmt.Errorf("%w: %w", cause, err)
	}
	return err
}

// serveMediaUploadCheck is the upload preflight (BUD-06): the client
// describes the blob in X-SHA-256, X-Content-Length and X-Content-Type and
// learns, before sending a byte, whether an upload with the same
// Authorization would be refused for its size, its declared type or its
// auth. The type is checked again, sniffed from the bytes, on upload.
func (s *Server) serveMediaUploadCheck(w http.ResponseWriter, r *http.Request, tenant community.Tenant) {
	// Checked as the upload it describes: a NIP-98 header signs the PUT's
	// method. Nothing is claimed here, so the same header still uploads.
	asUpload := r.Clone(r.Context())
	asUpload.Method = http.MethodPut
	ev, ok := s.mediaUploader(w, asUpload, tenant)
	if !ok {
		return
	}
	limits := s.media.Limits()
	if v := r.Header.Get("X-Content-Length"); v != "" {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n < 0 {
			mediaError(w, http.StatusBadRequest, "invalid: X-Content-Length must be a byte count")
			return
		}
		if n > limits.MaxBytes {
			mediaError(w, http.StatusRequestEntityTooLarge, fmt.Sprintf("invalid: blob too large: %d bytes, the limit is %d", n, limits.MaxBytes))
			return
		}
	}
	if v := r.Header.Get("X-Content-Type"); v != "" {
		mediaType, _, err := mime.ParseMediaType(v)
		if err != nil || !slices.Contains(limits.AllowedTypes, mediaType) {
			mediaError(w, http.StatusUnsupportedMediaType, fmt.Sprintf("invalid: media type not allowed: %s; allowed: %s", v, strings.Join(limits.AllowedTypes, ", ")))
			return
		}
	}
	sha := strings.ToLower(r.Header.Get("X-SHA-256"))
	if sha != "" && ev.Kind == nostr.KindHTTPAuth {
		if payload := ev.Tags.First("payload"); !strings.EqualFold(payload[1], sha) { // present: mediaAuth
			s.mediaUnauthorized(w, r, tenant, authFail("auth event payload tag does not name %s", sha))
			return
		}
	}
	if sha != "" && ev.Kind == nostr.KindBlossomAuth {
		if x := hashTags(ev); len(x) > 0 && !slices.Contains(x, sha) {
			s.mediaUnauthorized(w, r, tenant, authFail("auth event x tags do not name %s", sha))
			return
		}
	}
	w.WriteHeader(http.StatusOK)
}

func (s *Server) descriptor(r *http.Request, d media.Descriptor) blobDescriptor {
	base := s.requestURL(r)
	base = base[:len(base)-len(r.URL.RequestURI())]
	_, ext, _ := strings.Cut(d.Blob, ".")
	return blobDescriptor{URL: base + "/media/" + d.SHA256 + "." + ext, SHA256: d.SHA256, Size: d.Size, Type: d.Type, Uploaded: d.Uploaded}
}

// errAuthCheck marks an upload's authorization that could not be checked
// (the database failed during its NIP-98 claim): the media store is not at
// fault, and the generic answer would blame it.
var errAuthCheck = errors.New("could not check authorization")

// authCheckFailed marks err, a claim's failure, as errAuthCheck unless it
// is an answer of its own (a refused claim, a busy relay, the deletion's
// fence).
func authCheckFailed(err error) error {
	var ae *authError
	if err == nil || errors.As(err, &ae) || errors.Is(err, errReadSlotsBusy) || communityBeingDeleted(err) {
		return err
	}
	return fmt.Errorf("%w: %w", errAuthCheck, err)
}

// errMediaDatabase marks a database statement an upload or delete makes
// past its lease (an upload's blob lock or quota reservation, a delete's
// blob lock) that could not reach the database: an outage, not the media
// store's failure, whose network errors would otherwise pass for one.
var errMediaDatabase = errors.New("media database statement failed")

// mediaDatabaseFailed marks err as errMediaDatabase when the database
// could not be reached; any other error (a refusal such as a full quota,
// whose text is the answer) is returned as it is.
func mediaDatabaseFailed(err error) error {
	if !dberr.IsUnreachable(err) {
		return err
	}
	return fmt.Errorf("%w: %w", errMediaDatabase, err)
}

// mediaFailed answers a media.Service error.
func (s *Server) mediaFailed(w http.ResponseWriter, r *http.Request, tenant community.Tenant, err error) {
	var ae *authError
	switch {
	case errors.As(err, &ae), errors.Is(err, errAuthCheck):
		s.mediaUnauthorized(w, r, tenant, err)
	case errors.Is(err, media.ErrTooLarge):
		mediaError(w, http.StatusRequestEntityTooLarge, "invalid: "+err.Error())
	case errors.Is(err, media.ErrTypeNotAllowed):
		mediaError(w, http.StatusUnsupportedMediaType, "invalid: "+err.Error())
	case errors.Is(err, media.ErrHashMismatch), errors.Is(err, media.ErrEmpty):
		mediaError(w, http.StatusBadRequest, "invalid: "+err.Error())
	case errors.Is(err, media.ErrBodyUnreadable) && errors.Is(err, os.ErrDeadlineExceeded):
		mediaError(w, http.StatusRequestTimeout, fmt.Sprintf("invalid: the upload body did not arrive within %s", s.cfg.HTTPReadTimeout))
	case errors.Is(err, media.ErrBodyUnreadable):
		mediaError(w, http.StatusBadRequest, "invalid: "+err.Error())
	case errors.Is(err, media.ErrNotFound):
		mediaError(w, http.StatusNotFound, "not found: this community has no such blob")
	case errors.Is(err, media.ErrQuotaExceeded):
		mediaError(w, http.StatusInsufficientStorage, "blocked: "+err.Error())
	case errors.Is(err, media.ErrNotUploader):
		mediaError(w, http.StatusForbidden, "restricted: "+err.Error())
	case errors.Is(err, errReadSlotsBusy):
		mediaError(w, http.StatusServiceUnavailable, busyReadingReason)
	case errors.Is(err, deletion.ErrServingLeaseLapsed):
		s.log.Warn("media write outlived its serving-write lease", "community", tenant.Host(), "method", r.Method, "err", err)
		mediaError(w, http.StatusServiceUnavailable, leaseLapsedReason)
	case errors.Is(err, media.ErrSpool):
		s.log.Error("media upload could not be spooled", "community", tenant.Host(), "err", err)
		status, msg := spoolFailure(err)
		mediaError(w, status, msg)
	default:
		if errors.Is(err, errMediaDatabase) && s.mediaDatabaseUnreachable(w, err, "media database statement") {
			return
		}
		if r.Context().Err() == nil {
			s.log.Error("media request failed", "community", tenant.Host(), "method", r.Method, "err", err)
		}
		mediaError(w, http.StatusInternalServerError, "error: could not reach the media store; try again")
	}
}

// spoolFailure answers an upload whose temporary file failed: a full disk
// is the relay's storage, anything else its fault; neither is the media
// store's, which is what the generic answer would blame.
func spoolFailure(err error) (int, string) {
	if errors.Is(err, syscall.ENOSPC) || errors.Is(err, syscall.EDQUOT) {
		return http.StatusInsufficientStorage, "error: the relay's upload spool is out of disk space; try again later"
	}
	return http.StatusInternalServerError, "error: the relay could not spool the upload; try again later"
}

// serveMediaGet serves a blob, whole or by Range, to anyone who names its
// hash at a community that has it (Blossom reads are capability URLs: the
// hash is the secret). HEAD answers the same headers without the body.
func (s *Server) serveMediaGet(w http.ResponseWriter, r *http.Request, tenant community.Tenant) {
	if s.media == nil {
		mediaError(w, http.StatusNotFound, mediaOffReason)
		return
	}
	sha, _, ok := media.ParseBlobName(r.PathValue("name"))
	if !ok {
		mediaError(w, http.StatusBadRequest, "invalid: want /media/<sha256>[.ext] with a 64-digit hex hash")
		return
	}
	d, obj, err := s.media.Open(r.Context(), tenant.ID(), sha)
	if err != nil {
		s.mediaFailed(w, r, tenant, err)
		return
	}
	defer obj.Close()
	h := w.Header()
	h.Set("Content-Type", d.Type)
	h.Set("ETag", `"`+d.SHA256+`"`)
	h.Set("Cache-Control", "public, max-age=31536000, immutable")
	h.Set("X-Content-Type-Options", "nosniff")
	if strings.Contains(r.Header.Get("Range"), ",") {
		// One range at most. ServeContent seeks once per range, and on S3
		// each seek is a GET of its own, streaming to the end of the blob:
		// one anonymous request naming thousands of one-byte ranges would
		// cost thousands of store requests. A server may ignore Range; such
		// a request gets the whole blob, read once.
		r.Header.Del("Range")
	}
	if zeroSuffixRange(r.Header.Get("Range")) {
		// The last zero bytes name no byte, so the range is unsatisfiable;
		// ServeContent answered it 206 with "Content-Range: bytes N-(N-1)/N".
		// Asked as the range just past the end, it is refused as such, after
		// the conditions (a matching If-None-Match still answers 304).
		r.Header.Set("Range", fmt.Sprintf("bytes=%d-", d.Size))
	}
	// ServeContent answers Range, If-Range, If-None-Match and HEAD, and sets
	// Content-Length.
	http.ServeContent(&contentRefusals{ResponseWriter: w, blob: d}, r, "", time.Unix(d.Uploaded, 0), obj)
}

// zeroSuffixRange reports whether a Range header asks for the last zero
// bytes ("bytes=-0").
func zeroSuffixRange(header string) bool {
	spec, ok := strings.CutPrefix(strings.TrimSpace(header), "bytes=")
	spec, suffix := strings.CutPrefix(strings.TrimSpace(spec), "-")
	return ok && suffix && spec != "" && strings.Trim(spec, "0") == ""
}

// contentRefusals answers the refusals http.ServeContent makes itself (416
// for an unsatisfiable range, 412 for a failed If-Match) like every other
// media refusal, JSON with its reason in X-Reason: ServeContent writes them
// as bare text, which a Blossom client reading X-Reason or the JSON error
// could not tell from a proxy's page.
type contentRefusals struct {
	http.ResponseWriter
	blob    media.Descriptor
	refused bool
}

func (c *contentRefusals) WriteHeader(status int) {
	var reason string
	switch status {
	case http.StatusRequestedRangeNotSatisfiable:
		reason = fmt.Sprintf("invalid: the range is not satisfiable: the blob is %d bytes", c.blob.Size)
		// ServeContent names the size only for a range past the end, not
		// for one it cannot parse; the client needs it either way.
		c.Header().Set("Content-Range", fmt.Sprintf("bytes */%d", c.blob.Size))
	case http.StatusPreconditionFailed:
		reason = fmt.Sprintf("invalid: precondition failed: the blob's ETag is %q", c.blob.SHA256)
	default:
		c.ResponseWriter.WriteHeader(status)
		return
	}
	c.refused = true
	// The blob's caching headers, set for its bytes, would let a shared
	// cache keep this refusal for the blob's URL for a year.
	for _, h := range []string{"Cache-Control", "ETag", "Last-Modified"} {
		c.Header().Del(h)
	}
	c.Header().Set("Cache-Control", "no-store")
	mediaError(c.ResponseWriter, status, reason)
}

// Write drops ServeContent's own text after a refusal answered as JSON.
func (c *contentRefusals) Write(p []byte) (int, error) {
	if c.refused {
		return len(p), nil
	}
	return c.ResponseWriter.Write(p)
}

// ReadFrom passes ServeContent's copy of the blob to the writer's own
// ReadFrom (sendfile), unless a refusal was answered.
func (c *contentRefusals) ReadFrom(r io.Reader) (int64, error) {
	if c.refused {
		return io.Copy(io.Discard, r)
	}
	return readFrom(c.ResponseWriter, r)
}

func (s *Server) serveMediaDelete(w http.ResponseWriter, r *http.Request, tenant community.Tenant) {
	if s.media == nil {
		mediaError(w, http.StatusNotFound, mediaOffReason)
		return
	}
	sha, _, ok := media.ParseBlobName(r.PathValue("name"))
	if !ok {
		mediaError(w, http.StatusBadRequest, "invalid: want /media/<sha256>[.ext] with a 64-digit hex hash")
		return
	}
	ev, err := s.mediaAuth(r, "delete")
	if err != nil {
		s.mediaUnauthorized(w, r, tenant, err)
		return
	}
	// A delete token names the blobs it may delete.
	if ev.Kind == nostr.KindBlossomAuth && !slices.Contains(hashTags(ev), sha) {
		s.mediaUnauthorized(w, r, tenant, authFail("auth event has no x tag naming %s", sha))
		return
	}
	// Before the claim, the lease and the store reads: a Blossom token is
	// reusable until it expires, and each delete costs database writes.
	if s.mediaRateLimited(w, tenant, ev.PubKey) {
		return
	}
	claimed := false
	if ev.Kind == nostr.KindHTTPAuth {
		if err := s.claimHTTPAuth(r.Context(), tenant, ev); err != nil {
			s.mediaUnauthorized(w, r, tenant, err)
			return
		}
		claimed = true
	}
	lease, ctx, err := s.mediaLease(r, tenant, "media_delete")
	if err != nil {
		if claimed && relayAtFault(r, err) {
			s.releaseHTTPAuth(r.Context(), tenant, ev) // nothing deleted yet
		}
		if !s.mediaDatabaseUnreachable(w, err, "media lease") {
			s.mediaFenced(w, r, tenant, err)
		}
		return
	}
	defer lease.Release(r.Context())
	if err := s.media.Delete(ctx, tenant.ID(), sha, ev.PubKey); err != nil {
		err = leaseLapsed(ctx, err)
		if claimed && media.DeletedNothing(err) && relayAtFault(r, err) {
			// Busy, a lapsed lease, a failing store or database before
			// anything was removed: the same request may come again.
			s.releaseHTTPAuth(r.Context(), tenant, ev)
		}
		s.mediaFenced(w, r, tenant, err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]string{"deleted": sha})
}

// leaseLapsedReason answers a media write whose serving-write lease lapsed
// before it was done: an upload stored nothing, a delete may be sent again.
const leaseLapsedReason = "error: the relay's serving-write lease on this community lapsed before the request was done; try again"
