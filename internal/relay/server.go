// Package relay serves Nostr over WebSocket (NIP-01, NIP-42, NIP-45) plus the
// relay's HTTP surface (NIP-11, health, readiness; metrics on their own
// listener). Each connection
// is bound to the community named by its Host before the upgrade.
package relay

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"log/slog"
	"math"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/coder/websocket"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"golang.org/x/sync/semaphore"

	"github.com/buzzrelay/buzz/internal/access"
	"github.com/buzzrelay/buzz/internal/clock"
	"github.com/buzzrelay/buzz/internal/community"
	"github.com/buzzrelay/buzz/internal/config"
	"github.com/buzzrelay/buzz/internal/crossrelay"
	"github.com/buzzrelay/buzz/internal/db"
	"github.com/buzzrelay/buzz/internal/dberr"
	"github.com/buzzrelay/buzz/internal/deletion"
	"github.com/buzzrelay/buzz/internal/eventstore"
	"github.com/buzzrelay/buzz/internal/fanout"
	"github.com/buzzrelay/buzz/internal/ingest"
	"github.com/buzzrelay/buzz/internal/media"
	"github.com/buzzrelay/buzz/internal/nostr"
	"github.com/buzzrelay/buzz/internal/outage"
	"github.com/buzzrelay/buzz/internal/outbox"
	"github.com/buzzrelay/buzz/internal/presence"
	"github.com/buzzrelay/buzz/internal/trace"
	"github.com/buzzrelay/buzz/internal/workflow"
)

// Version is reported in NIP-11.
const Version = "0.1.0"

// accessTTL bounds how long a reader's channel set is trusted when the
// membership change that altered it was committed by another relay process.
const accessTTL = 10 * time.Second

// Server is the relay. Create it with New and serve Handler.
type Server struct {
	handlers *handlers // nil: messageHandlers (see jobs)
	cfg      config.Config
	pool     *pgxpool.Pool
	queries  *db.Queries
	store    *eventstore.Store
	hosts    *hostLookups // every HTTP request's community
	// replays throttles the purge of expired NIP-98 claims, which every
	// claim (bridge, media) runs when due.
	replays  replayPurger
	pipeline *ingest.Pipeline
	hub      *fanout.Hub
	access   *access.Cache
	metrics  *Metrics
	log      *slog.Logger
	outage   *outage.Log // one line per database outage, not one per request
	limits   nostr.Limits
	clock    clock.Clock      // the one time source, handed to every service
	now      func() time.Time // clock.Now

	// Tracer observes reads for conformance runs; NoopTracer in production,
	// which also skips building trace-only inputs. Set it before serving.
	Tracer trace.Tracer
	// PublishLimiter bounds how fast one pubkey publishes in one community.
	// Replace it before serving to share limits between processes.
	PublishLimiter PublishLimiter
	// httpSignatures bounds the bad signatures of signed HTTP requests
	// checked per client address.
	httpSignatures *httpSignatures
	// handshakes bounds how fast each client address opens WebSocket
	// connections (admit).
	handshakes *TokenBuckets

	outboxWorker   atomic.Pointer[outbox.Worker]   // nil: this process delivers nothing
	workflowWorker atomic.Pointer[workflow.Worker] // nil: runs wait for a worker's poll
	// workers counts the outbox and workflow loops started here, so the
	// process can wait for their in-flight work before it exits.
	workers       sync.WaitGroup
	workflowStats *workflow.Metrics // set once by registerWorkflows, before serving
	operatorAPI   atomic.Pointer[http.Handler]
	// ready shares one readiness check among the /ready requests that
	// arrive while it runs.
	ready readyCheck
	media *media.Service // nil: the media routes answer 404
	// mediaSweep removes the blobs no community references (StartMediaSweep).
	mediaSweep *media.Sweeper
	// releaseRetries retries failed media quota releases after the answer.
	releaseRetries *backgroundRetries
	crossRelay     atomic.Pointer[crossrelay.Bus] // nil: this process is the only relay
	// stopCrossRelay ends the bus's Run, which closes crossRelayStopped
	// once its goodbye is sent (StopCrossRelay).
	stopCrossRelay    context.CancelFunc
	crossRelayStopped chan struct{}
	// presence is who is present in each channel (kind 20001), kept for
	// BUZZ_PRESENCE_TTL: in this process, or in Redis once joined.
	presence atomic.Pointer[presenceStore]
	replica  atomic.Pointer[readReplica] // nil: every read on the writer

	mu      sync.Mutex
	conns   map[*conn]struct{}
	closing bool
	// closedCommunities were announced closed by their deletion (not by an
	// archive, which can be undone): their connections are closed and new
	// ones refused. A deleted community never serves again, so the set
	// only grows (by one id per deletion).
	closedCommunities map[uuid.UUID]struct{}
	// Admitted WebSocket connections, all together and per client address,
	// counted from before the upgrade until the connection is forgotten.
	admitted addressCounts
	// Uploads being received, all together and per client address.
	uploading addressCounts
	// HTTP bridge requests being answered, all together and per client
	// address.
	bridging addressCounts
	// Workflow webhook calls being answered, all together and per client
	// address.
	webhookCalls addressCounts

	// beforeHistory, set by tests only, runs when a live REQ is registered
	// and its history not yet read.
	beforeHistory atomic.Pointer[func()]
	// beforeLaterPage, set by tests only, runs before a read's history
	// reads the readable channels again for its next page.
	beforeLaterPage atomic.Pointer[func()]
}

// Option adjusts a Server.
type Option func(*options)

type options struct {
	clock clock.Clock
	media *media.Service
}

// WithClock makes the relay and every service it builds tell time by c
// (default: the wall clock). Tests use it to drive deadlines and cutoffs.
func WithClock(c clock.Clock) Option {
	return func(o *options) { o.clock = c }
}

// New builds a relay over a migrated database.
func New(cfg config.Config, pool *pgxpool.Pool, log *slog.Logger, opts ...Option) *Server {
	var o options
	for _, opt := range opts {
		opt(&o)
	}
	hub := fanout.NewHub()
	s := &Server{
		cfg:            cfg,
		releaseRetries: newBackgroundRetries(releaseRetriesInFlight),
		pool:           pool,
		queries:        db.New(pool),
		store:          eventstore.New(pool, cfg.MaxLimit),
		pipeline: ingest.New(pool, hub, ingest.Options{
			MaxFutureSkew: cfg.MaxFutureSkew, MaxMentions: cfg.MaxMentionsPerEvent, MaxThreadDepth: cfg.MaxThreadDepth,
			MaxChannelMembers: cfg.MaxChannelMembers,
			GroupMax:          cfg.IngestGroupMax, GroupWriters: cfg.IngestGroupWriters,
			GroupQueue: cfg.IngestQueue, GroupLockTimeout: cfg.IngestGroupLockTimeout,
			WriteTimeout: cfg.IngestWriteTimeout,
			Clock:        o.clock,
		}),
		hub:     hub,
		access:  access.NewCache(db.New(pool), accessTTL, o.clock.Now),
		metrics: NewMetrics(),
		log:     log,
		clock:   o.clock,
		now:     o.clock.Now,
		Tracer:  trace.NoopTracer{},
		media:   o.media,

		PublishLimiter:    NewTokenBuckets(cfg.PublishPerMinute, cfg.PublishBurst, cfg.RateLimitKeys),
		httpSignatures:    newHTTPSignatures(cfg.AuthWindow),
		handshakes:        newHandshakeBuckets(cfg),
		conns:             map[*conn]struct{}{},
		closedCommunities: map[uuid.UUID]struct{}{},

		limits: nostr.Limits{
			MaxFilters:       cfg.MaxFilters,
			MaxSubIDLength:   64,
			MaxFilterValues:  1000,
			MaxTagValueLen:   1024,
			MaxSearchBytes:   1024,
			MaxEventTags:     cfg.MaxEventTags,
			MaxContentLength: cfg.MaxContentLength,
		},
	}
	s.outage = outage.New(log, pool.Ping, s.now)
	s.releaseRetries.onAbandoned = func(n int) {
		s.metrics.MediaQuotaReleaseFailures.WithLabelValues("abandoned").Add(float64(n))
		s.log.Error("media quota releases abandoned: Shutdown's time ran out; their communities' counts stay high", "releases", n)
	}
	s.store.PageRows = cfg.ReqPageRows
	s.store.SearchCandidates = cfg.SearchCandidates
	if s.media != nil {
		s.media.UseClock(s.now)
		s.media.UseLogger(s.log)
		s.mediaSweep = newMediaSweeper(s.media, s)
		// Any key may upload, so the connections an upload takes after its
		// claim (the blob lock's, held while the store is written, and the
		// quota reservation's transaction) wait for a read slot, as any
		// statement a fresh key can cause. Neither is taken while holding
		// the other.
		blobLock := media.AdvisoryBlobLock(pool)
		s.media.UseBlobLock(func(ctx context.Context, shas []string) (func(), error) {
			release, err := s.readSlot(ctx)
			if err != nil {
				return nil, err
			}
			unlock, err := blobLock(ctx, shas)
			if err != nil {
				release()
				return nil, mediaDatabaseFailed(err)
			}
			return func() { unlock(); release() }, nil
		})
		s.media.UseQuota(relayQuota{Quota: media.CommunityQuota{Limit: int64(cfg.MediaCommunityQuotaBytes), Run: func(ctx context.Context, fn func(*db.Queries) error) error {
			return deletion.UnderLease(ctx, pool, fn)
		}}, slot: s.readSlot, log: s.log, failures: s.metrics.MediaQuotaReleaseFailures, retries: s.releaseRetries})
		// An upload renews its serving-write lease right before it makes
		// its blob visible: one whose lease lapsed meanwhile stores nothing.
		s.media.UseCommitGuard(deletion.ConfirmServingLease)
		// A blob referenced again starts the sweep's grace anew when it is
		// unreferenced next. Any key may upload: the statement waits for a
		// read slot, taken after the blob lock's is given back.
		forget := media.ForgetUnreferenced(pool)
		s.media.UseOnReference(func(ctx context.Context, blob string) error {
			release, err := s.readSlot(ctx)
			if err != nil {
				return err
			}
			defer release()
			return forget(ctx, blob)
		})
	}
	s.store.StatementTimeout = cfg.QueryTimeout
	s.store.ReadSlots = eventstore.NewReadSlots(eventReadSlots(pool.Config().MaxConns, cfg.IngestGroupWriters))
	s.hosts = newHostLookups(func(ctx context.Context, host string) (community.Tenant, error) {
		return community.Resolve(ctx, s.queries, host)
	}, s.store.ReadSlots)
	s.pipeline.EphemeralSlot = s.readSlot
	observe := func(name string, seconds float64) {
		s.metrics.DBQuery.WithLabelValues(name).Observe(seconds)
	}
	if timer, ok := pool.Config().ConnConfig.Tracer.(*StatementTimer); ok {
		timer.attach(observe) // times every named statement, generated or not
	} else {
		s.store.ObserveQuery = observe
	}
	s.pipeline.OnMembershipChange = func(community uuid.UUID) {
		s.access.Invalidate(community)
		if bus := s.crossRelay.Load(); bus != nil {
			bus.PublishInvalidation(community)
		}
	}
	s.presence.Store(&presenceStore{presence.NewMemory(cfg.PresenceTTL, cfg.PresenceMaxEntries, cfg.PresenceMaxBytes, cfg.PresenceMaxChannelBytes)})
	s.pipeline.KeepEphemeral = func(community uuid.UUID, ev *nostr.Event, channel *uuid.UUID) error {
		if ev.Kind != presence.Kind || channel == nil {
			return nil
		}
		if errors.Is(s.presence.Load().Remember(community, *channel, ev, s.now()), presence.ErrFull) {
			return ingest.Reject("rate-limited", "the relay keeps as much presence as it may; announce again in %s, as older announcements expire", s.cfg.PresenceTTL)
		}
		return nil
	}
	s.pipeline.OnPublish = func(community uuid.UUID, ev *nostr.Event, channel *uuid.UUID, readersVersion int64) {
		s.noteRemoval(community, ev, channel)
		if bus := s.crossRelay.Load(); bus != nil {
			bus.PublishEvent(community, ev, channel, readersVersion)
		}
	}
	hub.SetChannelReaders(s.access.MayRead)
	// Wakes: a workflow's relay-signed doorbell reaches listeners like a
	// user's message (ingest.Write.EmitWaking).
	s.pipeline.RegisterSideRows(ingest.SideRows{Needs: outbox.Mentions, Apply: s.enqueueMentions, Wakes: true})
	s.registerWorkflows()
	s.pipeline.OnFanout = func(st fanout.Stats) {
		s.metrics.FanoutDelivered.Add(float64(st.Delivered))
		s.metrics.FanoutDropped.Add(float64(st.Dropped))
	}
	s.pipeline.OnGroup = func(st ingest.GroupStats) {
		if st.Events > 0 { // a group that failed whole committed nothing
			s.metrics.IngestGroupEvents.Observe(float64(st.Events))
		}
		s.metrics.IngestGroupWait.Observe(st.Waited.Seconds())
		s.metrics.IngestGroupSeconds.Observe(st.Took.Seconds())
		if st.Failed {
			s.metrics.IngestGroupsFailed.Inc()
		}
	}
	s.pipeline.OnChangeAlone = s.metrics.IngestChangesAlone.Inc
	s.pipeline.OnMemberLimit = s.metrics.ChannelMemberLimitRefusals.Inc
	s.metrics.watchIngestQueue(s.pipeline.WaitingEvents)
	s.metrics.Registry.MustRegister(newPoolCollector(pool))
	return s
}

// eventReadSlots is how many REQ, search and COUNT statements may run on the
// writer pool at once: all but a connection per group writer and two more,
// which stay free for writes and the relay's own short statements (at least
// one, for a pool too small to spare any). Without it a storm of reads held
// every connection and publishes waited in the pool behind them.
func eventReadSlots(poolMax int32, groupWriters int) int {
	return max(1, int(poolMax)-groupWriters-2)
}

// Metrics exposes the relay's collectors (for tests and embedding).
func (s *Server) Metrics() *Metrics { return s.metrics }

// Handler routes the relay's HTTP surface.
func (s *Server) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /health", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
	})
	mux.HandleFunc("GET /ready", s.serveReady)
	mux.HandleFunc("GET /info", s.withTenant(s.serveInfo))
	mux.HandleFunc("OPTIONS /info", s.withTenant(serveInfoPreflight))
	s.registerHTTPBridge(mux) // POST /events, /query, /count (NIP-98)
	s.registerMedia(mux)      // Blossom: PUT /media/upload, GET|HEAD|DELETE /media/{sha256}
	mux.HandleFunc(outbox.RegistrationPath, s.serveOperatorListeners)
	mux.Handle("POST /hooks/{id}", s.holdingPlace(s.admitWebhook, s.withTenant(s.serveWorkflowWebhook)))
	mux.HandleFunc("/", s.refusingUnadmittable(s.withTenant(s.serveRoot)))
	// Every request's reads count against its address's share of the read
	// slots, with the address's WebSocket connections (which set their
	// own): a route left out would let one address hold every slot.
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mux.ServeHTTP(w, r.WithContext(eventstore.WithClient(r.Context(), addressBucket(s.clientAddr(r)))))
	})
}

// readyCheck runs at most one readiness check at a time. /ready is
// unauthenticated and served on every host, and each check costs a pooled
// connection for a ping and a catalog query (about 0.5 ms of database time),
// and with media on S3 a request to the bucket (the read replica's state
// comes from its own background check): 40 connections asking for /ready
// back to back ran about 1,500 checks a second, held pool connections the
// writes need, and tripled publish latency (an equal flood of /health
// doubled it). A request that arrives while a check runs waits for that
// check's answer.
type readyCheck struct {
	mu      sync.Mutex
	running *readyCall
	// checks counts the checks run (tests).
	checks atomic.Int64
	// joined counts requests answered by a check another request started
	// (tests).
	joined atomic.Int64
	// timeout bounds a check (0: 2 s).
	timeout time.Duration
}

type readyCall struct {
	done   chan struct{}
	status int
	body   map[string]string
}

func (s *Server) serveReady(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	closing := s.closing
	s.mu.Unlock()
	if closing {
		writeJSON(w, http.StatusServiceUnavailable, map[string]string{"status": "shutting down"})
		return
	}
	s.ready.mu.Lock()
	call := s.ready.running
	if call == nil {
		call = &readyCall{done: make(chan struct{})}
		s.ready.running = call
		s.ready.mu.Unlock()
		s.ready.checks.Add(1)
		func() {
			defer func() {
				s.ready.mu.Lock()
				s.ready.running = nil
				s.ready.mu.Unlock()
				close(call.done)
			}()
			call.status, call.body = http.StatusServiceUnavailable, map[string]string{"status": "readiness check failed"}
			// Not the request's context: the requests sharing the check
			// must not see it fail because its first asker went away.
			timeout := s.ready.timeout
			if timeout <= 0 {
				timeout = 2 * time.Second
			}
			ctx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), timeout)
			defer cancel()
			call.status, call.body = s.checkReady(ctx)
		}()
	} else {
		s.ready.mu.Unlock()
		s.ready.joined.Add(1)
		select {
		case <-call.done:
		case <-r.Context().Done():
			return
		}
	}
	writeJSON(w, call.status, call.body)
}

// checkReady is one readiness check: the status and body /ready answers.
func (s *Server) checkReady(ctx context.Context) (int, map[string]string) {
	if err := s.pool.Ping(ctx); err != nil {
		return http.StatusServiceUnavailable, map[string]string{"status": "database unavailable"}
	}
	// A community-scoped table without its write fence would let writes
	// land in a community being deleted: not ready until it is fixed.
	if err := deletion.CheckReady(ctx, s.pool); err != nil {
		if !errors.Is(err, deletion.ErrCatalogUnsafe) {
			// The check could not run: /ready is public, so the server's
			// message (values, names, a backend's FATAL) stays in the log.
			s.log.Warn("readiness check failed", "err", err)
			return http.StatusServiceUnavailable, map[string]string{"status": "readiness check failed"}
		}
		return http.StatusServiceUnavailable, map[string]string{"status": "community write fence incomplete", "detail": err.Error()}
	}
	ready := map[string]string{"status": "ready"}
	// Without Redis this relay still stores, answers reads and delivers to
	// its own subscribers: it stays ready (taking every pod out of a load
	// balancer at once would turn a partial outage into a total one) and
	// says what it lacks.
	if bus := s.crossRelay.Load(); bus != nil {
		ready["redis"] = "connected"
		if !bus.Connected() {
			ready["redis"] = "degraded"
		}
	}
	// The same holds for media: events flow without it.
	if s.media != nil {
		ready["media"] = "ok"
		if err := s.media.Check(ctx); err != nil {
			ready["media"] = "unavailable"
			s.log.Warn("media store unavailable", "err", err)
		}
	}
	// And for the read replica: the writer answers every read.
	if state, ok := s.readerState(); ok {
		ready["reader"] = state
	}
	return http.StatusOK, ready
}

// deliverFromBus hands this process's subscribers an event another relay
// process wrote.
func (s *Server) deliverFromBus(community uuid.UUID, ev *nostr.Event, channel *uuid.UUID, readersVersion int64) {
	s.noteRemoval(community, ev, channel)
	st := s.hub.PublishWritten(community, ev, channel, readersVersion)
	s.metrics.FanoutDelivered.Add(float64(st.Delivered))
	s.metrics.FanoutDropped.Add(float64(st.Dropped))
}

// StartCrossRelay joins this process to the other relay processes through
// the Redis at BUZZ_REDIS_URL (unset: a no-op, this process is the only
// relay). Call it once, before serving; it runs until ctx ends or
// StopCrossRelay.
func (s *Server) StartCrossRelay(ctx context.Context) error {
	if s.cfg.RedisURL == "" {
		return nil
	}
	bus, err := crossrelay.New(s.cfg.RedisURL, s.cfg.RedisPublishQueue, crossrelay.Handlers{
		Deliver:        s.deliverFromBus,
		Invalidate:     s.access.Invalidate,
		Resync:         s.access.InvalidateAll,
		CloseCommunity: func(id uuid.UUID) { s.closeCommunity(id, closingDeleted) },
		CatchUp:        s.catchUp,
	}, s.log, crossrelay.NewMetrics(s.metrics.Registry))
	if err != nil {
		return err
	}
	// What this process publishes is remembered, so the replay after a
	// lost subscription does not send it twice.
	s.hub.RememberPublished(publishedWindow, publishedMost, bus.CatchingUp)
	// Every process counts a publisher's events in one shared bucket.
	s.PublishLimiter = bus.Limiter(s.cfg.PublishPerMinute, s.cfg.PublishBurst, s.PublishLimiter)
	// Presence accepted by any process is seen by a REQ on every other.
	shared := bus.Presence(s.cfg.PresenceTTL, s.cfg.PresenceMaxEntries, s.cfg.PresenceMaxChannelBytes, s.cfg.PresenceMaxBytes, s.presence.Load().Store)
	s.presence.Store(&presenceStore{shared})
	s.crossRelay.Store(bus)
	// Cached access answers stand only while this process hears the
	// others' invalidations; until it subscribes, and whenever Redis is
	// lost, every answer comes from the database.
	s.access.TrustOnlyWhile(bus.Hears)
	ctx, s.stopCrossRelay = context.WithCancel(ctx)
	s.crossRelayStopped = make(chan struct{})
	go func() {
		// Presence written back after an outage or a Redis restarted
		// empty; ended before crossRelayStopped closes. Run closes the
		// client meanwhile: a write-back in flight then fails, unlogged,
		// as its context is cancelled too.
		restoring := make(chan struct{})
		go func() {
			shared.KeepRestored(ctx, s.now, s.communitiesClosedAmong)
			close(restoring)
		}()
		bus.Run(ctx)
		<-restoring
		close(s.crossRelayStopped)
	}()
	return nil
}

// StopCrossRelay publishes what is still queued for the other relay
// processes, then this process's goodbye, and waits for it (or ctx). Call
// it last when stopping, after Shutdown and WaitForWorkers: the goodbye
// tells the others that everything committed before it was published (or
// reported unpublished), so they replay nothing for this process, and an
// event a closing connection or a finishing workflow step commits after
// it would reach no other process's subscriber live.
func (s *Server) StopCrossRelay(ctx context.Context) error {
	if s.stopCrossRelay == nil {
		return nil
	}
	s.stopCrossRelay()
	select {
	case <-s.crossRelayStopped:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// withTenant resolves the community from Host; unknown hosts get 404 before
// any handler (and before any WebSocket upgrade).
func (s *Server) withTenant(next func(http.ResponseWriter, *http.Request, community.Tenant)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		tenant, err := s.hosts.Resolve(r.Context(), r.Host)
		if errors.Is(err, community.ErrUnknownHost) {
			writeError(w, http.StatusNotFound, "invalid: no community is served at this host")
			return
		}
		if errors.Is(err, errReadSlotsBusy) {
			s.log.Warn("host lookup found every read slot busy", "host", r.Host)
			writeError(w, http.StatusServiceUnavailable, busyReadingReason)
			return
		}
		if err != nil && r.Context().Err() != nil {
			return // the client left during the lookup: no one to answer, nothing wrong
		}
		if err != nil {
			s.databaseFailed(w, r, err, "resolve community")
			return
		}
		next(w, r, tenant)
	}
}

// refusingUnadmittable refuses a WebSocket upgrade that admit would
// refuse before next looks up its host: a client reconnecting in a loop
// past its handshake bucket or its connections is refused for the price of
// reading its address and headers, not of a database read each time (the
// lookup is most of a refusal's cost). Whatever it lets through, admit
// decides again after the lookup.
func (s *Server) refusingUnadmittable(next http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if wantsWebSocket(r) {
			// First: an upgrade bound to fail its handshake spent a token
			// of its address's bucket (and a host lookup) before the
			// WebSocket library refused it, so a client sending a broken
			// upgrade in a loop refused its address's real clients.
			if reason := handshakeFault(r); reason != "" {
				refuseBrokenHandshake(w, reason)
				return
			}
			if status, reason, retry := s.wouldAdmit(s.clientAddr(r)); status != 0 {
				refuseAdmission(w, status, reason, retry)
				return
			}
		}
		next(w, r)
	}
}

// wantsWebSocket reports whether serveRoot would take r for a WebSocket
// upgrade. Only a GET can upgrade: any other method asking to is refused
// by serveRoot (upgradeNotGET) before it is admitted, so it spends no
// handshake token on an upgrade bound to fail.
func wantsWebSocket(r *http.Request) bool {
	return r.URL.Path == "/" && r.Method == http.MethodGet && asksToUpgrade(r)
}

// upgradeNotGET reports whether r asks for a WebSocket upgrade with a
// method that cannot have one (a HEAD or a POST, say).
func upgradeNotGET(r *http.Request) bool {
	return r.Method != http.MethodGet && r.Method != http.MethodOptions && asksToUpgrade(r)
}

func asksToUpgrade(r *http.Request) bool {
	return strings.EqualFold(r.Header.Get("Upgrade"), "websocket")
}

// notGETReason answers a WebSocket upgrade asked for with another method.
const notGETReason = "invalid: a WebSocket upgrade must be a GET request"

// handshakeFault says why the WebSocket library would refuse r, a GET
// asking to upgrade, as a handshake it cannot complete; "" when it would
// not. The checks are the library's own (RFC 6455 4.2.1), made before r
// takes a handshake token.
func handshakeFault(r *http.Request) string {
	if !r.ProtoAtLeast(1, 1) {
		return "invalid: a WebSocket upgrade needs HTTP/1.1 or later"
	}
	if !headerHasToken(r.Header, "Connection", "upgrade") {
		return "invalid: a WebSocket upgrade needs a Connection header naming Upgrade"
	}
	if r.Header.Get("Sec-WebSocket-Version") != "13" {
		return "invalid: unsupported WebSocket version; only 13 is supported"
	}
	keys := r.Header.Values("Sec-WebSocket-Key")
	if len(keys) != 1 {
		return "invalid: a WebSocket upgrade needs exactly one Sec-WebSocket-Key header"
	}
	if key, err := base64.StdEncoding.DecodeString(strings.TrimSpace(keys[0])); err != nil || len(key) != 16 {
		return "invalid: Sec-WebSocket-Key must be 16 bytes in base64"
	}
	return ""
}

// refuseBrokenHandshake answers an upgrade handshakeFault refused: 400 and
// the JSON error, with the version the relay speaks (RFC 6455 4.4).
func refuseBrokenHandshake(w http.ResponseWriter, reason string) {
	w.Header().Set("Sec-WebSocket-Version", "13")
	writeError(w, http.StatusBadRequest, reason)
}

// headerHasToken reports whether one of the comma-separated values of
// header key is token, ignoring case.
func headerHasToken(h http.Header, key, token string) bool {
	for _, v := range h.Values(key) {
		for t := range strings.SplitSeq(v, ",") {
			if strings.EqualFold(strings.TrimSpace(t), token) {
				return true
			}
		}
	}
	return false
}

// databaseUnreachable answers a request the database failed because it
// could not be reached, as every route does during an outage: 503 with
// dberr.UnavailableAnswer and Retry-After (the outage log pings once a
// second), logged once per outage rather than once per request; neither
// the client's fault nor a bug of the relay. A server refusing the
// relay's login gets the same answer without Retry-After (no wait ends
// it), logged as the outage log bounds it. It reports false, having
// answered nothing, for any other error.
func (s *Server) databaseUnreachable(w http.ResponseWriter, err error, what string) bool {
	if !s.outage.Failed(err, what) {
		return false
	}
	answerUnavailable(w, err)
	return true
}

// databaseFailed answers a request whose statement what failed with err,
// the database's fault whatever it was: 503 dberr.UnavailableAnswer, as
// an outage (Retry-After, logged once per outage) when the database could
// not be reached, else with err logged, unless the client went away.
func (s *Server) databaseFailed(w http.ResponseWriter, r *http.Request, err error, what string) {
	if s.databaseUnreachable(w, err, what) {
		return
	}
	if r.Context().Err() == nil {
		s.log.Error(what, "host", r.Host, "path", r.URL.Path, "err", err)
	}
	writeError(w, http.StatusServiceUnavailable, dberr.UnavailableAnswer)
}

// answerUnavailable is the answer to a request whose failure err the
// outage log took: 503 dberr.UnavailableAnswer, to be sent again after
// the outage log's next ping when the database is unreachable.
func answerUnavailable(w http.ResponseWriter, err error) {
	if dberr.IsUnreachable(err) {
		w.Header().Set("Retry-After", "1")
	}
	writeError(w, http.StatusServiceUnavailable, dberr.UnavailableAnswer)
}

func (s *Server) serveRoot(w http.ResponseWriter, r *http.Request, tenant community.Tenant) {
	switch {
	case r.URL.Path != "/":
		writeError(w, http.StatusNotFound, "invalid: not found")
	case r.Method == http.MethodOptions:
		serveInfoPreflight(w, r, tenant)
	case wantsWebSocket(r):
		s.serveWebSocket(w, r, tenant)
	case upgradeNotGET(r):
		w.Header().Set("Allow", http.MethodGet)
		writeError(w, http.StatusMethodNotAllowed, notGETReason)
	case strings.Contains(r.Header.Get("Accept"), "application/nostr+json"):
		s.serveInfo(w, r, tenant)
	default:
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		_, _ = w.Write([]byte("Buzz relay for " + tenant.Host() + ". Connect with a Nostr client over WebSocket.\n"))
	}
}

func (s *Server) serveWebSocket(w http.ResponseWriter, r *http.Request, tenant community.Tenant) {
	addr := s.clientAddr(r)
	// admit also refuses every connection once the relay is shutting down.
	if status, reason, retry := s.admit(addr); status != 0 {
		refuseAdmission(w, status, reason, retry)
		return
	}
	hw := &hijackWriter{ResponseWriter: w}
	// Set below, before anything reads from ws (the only reader of pings).
	var c *conn
	ws, err := websocket.Accept(hw, r, &websocket.AcceptOptions{
		// Nostr clients connect from any origin; authentication is NIP-42
		// signatures, never cookies, so there is no CSRF surface to guard.
		InsecureSkipVerify: true,
		CompressionMode:    websocket.CompressionDisabled,
		OnPingReceived:     func(ctx context.Context, _ []byte) bool { return c.pacePing(ctx) },
	})
	if err != nil {
		s.release(addr)
		return // Accept already wrote the HTTP error
	}
	// Frames up to 4x the advertised limit are read past and refused (see
	// readMessage); beyond that the library closes with 1009 (message too big).
	ws.SetReadLimit(int64(s.cfg.MaxMessageBytes) * 4)
	// Its reads count against its address's share of the read slots.
	ctx, cancel := context.WithCancel(eventstore.WithClient(context.Background(), addressBucket(addr)))
	c = &conn{
		srv:       s,
		ws:        ws,
		sock:      hw.conn,
		tenant:    tenant,
		log:       s.connLog(tenant, addr),
		addr:      addr,
		challenge: newChallenge(),
		replyRoom: semaphore.NewWeighted(int64(s.cfg.ReplyQueueBytes)),
		ctx:       ctx,
		cancel:    cancel,
		subs:      map[string]int{},
		closing:   make(chan struct{}),
		// Every bucket is set before anything can read from ws.
		messages:   tokenBucket{tokens: s.messageBurst(), at: s.now()},
		authChecks: tokenBucket{tokens: authChecksAtOnce, at: s.now()},
		pings:      tokenBucket{tokens: pingsAtOnce, at: s.now()},
	}
	c.initWriteWatchdog()
	if status, reason := s.track(c); status != 0 {
		s.release(addr)
		cancel()
		ws.Close(status, reason)
		return
	}
	// The connection runs on a goroutine of its own and this handler
	// returns: net/http's goroutine, its stack and its per-connection state
	// would otherwise be held for the connection's whole life.
	go func() {
		defer c.containPanic()
		c.run()
	}()
}

// track registers the connection, or says why it must close at once: the
// relay is shutting down, or the community was closed between resolving
// its host and now.
func (s *Server) track(c *conn) (websocket.StatusCode, string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closing {
		return websocket.StatusGoingAway, "relay shutting down"
	}
	if _, closed := s.closedCommunities[c.tenant.ID()]; closed {
		return websocket.StatusPolicyViolation, closingDeleted.reason
	}
	s.conns[c] = struct{}{}
	s.metrics.Connections.Inc()
	return 0, ""
}

func (s *Server) forget(c *conn) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.conns[c]; ok {
		delete(s.conns, c)
		s.metrics.Connections.Dec()
		s.releaseLocked(c.addr)
	}
}

// Shutdown stops accepting connections, then asks every connection to flush
// its queue and close with 1001, waiting until they are gone or ctx ends;
// then it has the media quota releases still being retried make their last
// attempt, and waits for them (or ctx, which abandons the rest).
func (s *Server) Shutdown(ctx context.Context) error {
	s.outage.Stop()
	err := s.closeConnections(ctx)
	if rerr := s.releaseRetries.shutdown(ctx); err == nil {
		err = rerr
	}
	return err
}

func (s *Server) closeConnections(ctx context.Context) error {
	s.mu.Lock()
	s.closing = true
	for c := range s.conns {
		c.shutdown()
	}
	s.mu.Unlock()
	t := time.NewTicker(10 * time.Millisecond)
	defer t.Stop()
	for {
		s.mu.Lock()
		n := len(s.conns)
		s.mu.Unlock()
		if n == 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			s.mu.Lock()
			for c := range s.conns {
				c.cancel()
			}
			s.mu.Unlock()
			return ctx.Err()
		case <-t.C:
		}
	}
}

// WaitForWorkers waits until the outbox worker, the workflow worker and the
// schedule scheduler have returned, or ctx ends. Call it once the context
// they were started with has ended: they then finish the deliveries and
// steps in flight and record them. A process that exits without waiting
// leaves those rows leased, to be delivered again (or a call's outcome
// reported unknown) after the lease.
func (s *Server) WaitForWorkers(ctx context.Context) error {
	done := make(chan struct{})
	go func() {
		s.workers.Wait()
		close(done)
	}()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// verifyAuth checks a NIP-42 AUTH event against this connection's challenge
// and community. The checks that cost nothing come first; the signature,
// tens of microseconds of CPU that a client replaying one message costs
// nothing to ask for again and again, is checked last, and only while the
// connection has checks left (authChecks).
func (s *Server) verifyAuth(ev *nostr.Event, challenge string, tenant community.Tenant, checks *tokenBucket) error {
	if ev.Kind != nostr.KindAuth {
		return ingest.Reject("invalid", "AUTH event must be kind 22242")
	}
	if tag := ev.Tags.First("challenge"); tag == nil || tag[1] != challenge {
		return ingest.Reject("invalid", "AUTH challenge does not match the one this connection was given")
	}
	if tag := ev.Tags.First("relay"); tag == nil || community.RelayURLAuthority(tag[1]) != tenant.Host() {
		return ingest.Reject("invalid", "AUTH relay tag must name this relay (%s)", tenant.Host())
	}
	if skew := s.now().Unix() - ev.CreatedAt; math.Abs(float64(skew)) > s.cfg.AuthWindow.Seconds() {
		return ingest.Reject("invalid", "AUTH created_at must be within %s of now", s.cfg.AuthWindow)
	}
	if wait, ok := checks.take(s.now(), 1/authCheckEvery.Seconds(), authChecksAtOnce); !ok {
		s.metrics.AuthRateLimited.Inc()
		return ingest.Reject("rate-limited", "too many AUTH attempts on this connection; try again in %s", time.Duration(math.Ceil(wait.Seconds()))*time.Second)
	}
	if err := ev.Verify(); err != nil {
		return ingest.Reject("invalid", "AUTH event: %v", err)
	}
	return nil
}

// connLog is the logger of a connection from addr to tenant.
func (s *Server) connLog(tenant community.Tenant, addr string) *slog.Logger {
	return s.log.With("community", tenant.Host(), "remote", addr)
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}
