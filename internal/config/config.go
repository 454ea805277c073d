// Package config reads the relay's settings from the environment. Every
// setting has a production-safe default; a malformed value stops start-up
// with an error naming the variable.
package config

import (
	"fmt"
	"log/slog"
	"net/netip"
	"strconv"
	"strings"
	"time"

	"github.com/buzzrelay/buzz/internal/community"
	"github.com/buzzrelay/buzz/internal/workflow/safehttp"
)

// Config is the relay's configuration.
type Config struct {
	DatabaseURL string // BUZZ_DATABASE_URL; empty in dev mode means a private cluster
	ListenAddr  string // BUZZ_LISTEN_ADDR
	PprofAddr   string // BUZZ_PPROF_ADDR: when set, net/http/pprof listens here (keep it on loopback)
	RelayURL    string // BUZZ_RELAY_URL: this deployment's public URL, seeds its community
	LogLevel    slog.Level

	RelayName        string // NIP-11 name
	RelayDescription string
	RelayContact     string

	MaxMessageBytes   int           // largest client message kept; larger ones are refused unread (up to 4x)
	MaxSubscriptions  int           // open REQs per connection
	MessagesPerSecond int           // messages one connection has read per second, sustained (ten times as many at once)
	MaxFilters        int           // filters per REQ/COUNT
	MaxLimit          int           // per-filter cap on stored results (also the default)
	MaxEventTags      int           // tags per event
	MaxContentLength  int           // characters (code points) of content per event
	MaxFutureSkew     time.Duration // how far ahead of now created_at may be
	// MaxMentionsPerEvent bounds the mention rows one event writes (its
	// first distinct p-tagged pubkeys); the event itself is stored whole.
	MaxMentionsPerEvent int
	// MaxThreadDepth bounds how deep a channel reply may sit in its thread:
	// each reply updates one row per ancestor under the thread's lock.
	MaxThreadDepth int
	// MaxChannelMembers bounds a channel's active members: its lists,
	// rewritten whole, and its reader set cost in proportion to them.
	MaxChannelMembers int
	// Group commit of concurrent events (see docs/write-spine.md):
	// IngestGroupMax events at most per transaction (1: each alone),
	// IngestGroupWriters groups written at once at most (the second only
	// while a whole group waits), IngestQueue events waiting
	// before new ones are refused, IngestGroupLockTimeout how long an event
	// in a group may wait for a lock before it runs alone.
	IngestGroupMax         int
	IngestGroupWriters     int
	IngestQueue            int
	IngestGroupLockTimeout time.Duration
	IngestWriteTimeout     time.Duration // bounds one transaction writing events
	AuthWindow             time.Duration // NIP-42 created_at tolerance
	SendQueue              int           // queued outbound messages per connection
	SendQueueBytes         int           // bytes of queued live events per connection
	WriteTimeout           time.Duration // a client that cannot take a write this long is dropped
	PingInterval           time.Duration // WebSocket ping cadence; a missed pong closes the connection
	// ClosedCommunitySweep is how often a relay re-checks that the
	// communities it holds connections for are still serving, in case a
	// closing announcement was lost.
	ClosedCommunitySweep time.Duration
	QueryTimeout         time.Duration // statement budget for one REQ/COUNT
	// EventsAnalyzeInterval is how often the relay checks whether the
	// events table outgrew its planner statistics (0 = never: autovacuum
	// alone); EventsAnalyzeMinRows is the fewest changed rows that can
	// trigger an ANALYZE.
	EventsAnalyzeInterval time.Duration
	EventsAnalyzeMinRows  int
	DBMaxConns            int32

	// Per-client bounds: what one client (one address, one pubkey, one
	// connection) can hold or spend.
	AuthTimeout           time.Duration  // a connection that has not authenticated by then is closed
	MaxConnections        int            // open WebSocket connections, all clients together
	MaxConnectionsPerAddr int            // open WebSocket connections from one client address
	HandshakesPerSecond   int            // new WebSocket connections one client address may open per second, sustained (MaxConnectionsPerAddr at once)
	MaxFilterValues       int            // filter values held by one connection's open subscriptions
	PublishPerMinute      int            // events one pubkey may publish per minute in one community
	PublishBurst          int            // events one pubkey may publish at once before the rate applies
	RateLimitKeys         int            // (community, pubkey) buckets kept in memory; the oldest go first
	ReqPageRows           int            // rows read per database round trip while streaming a REQ
	SearchCandidates      int            // newest matches a NIP-50 search ranks by relevance
	ReplyQueueBytes       int            // bytes of replies (history, OK ...) queued for one connection
	HTTPReadTimeout       time.Duration  // a request's headers and body must arrive within this
	HTTPWriteTimeout      time.Duration  // a response must be written within this
	HTTPIdleTimeout       time.Duration  // an idle keep-alive connection is closed after this
	MetricsAddr           string         // /metrics listens here, apart from the community hosts
	TrustedProxies        []netip.Prefix // peers whose X-Forwarded-For / -Proto are believed

	WorkflowRunLease time.Duration // how long a worker holds a claimed run before another may resume it
	WorkflowPoll     time.Duration // how often an idle workflow worker looks for due runs
	WorkflowMaxRuns  int           // workflow runs one relay process executes at once
	WorkflowCatchUp  time.Duration // how far back the scheduler fires missed schedule slots
	// WorkflowRunRetention is how long ended runs (with their approvals)
	// and schedule slot claims are kept; older ones are deleted.
	WorkflowRunRetention time.Duration
	WebhookMaxBytes      int // largest POST /hooks/{id} body

	// The call_webhook step's HTTPS client.
	WorkflowWebhookTimeout       time.Duration  // one call, from dial to the last response byte
	WorkflowWebhookResponseBytes int            // largest response body kept; a longer one fails the step
	WorkflowWebhookAllowedNets   []netip.Prefix // non-public networks a webhook may reach anyway
	WorkflowMaxUnfinishedRuns    int            // unfinished runs one workflow may have; a trigger beyond fails its run with capacity_exceeded
	WorkflowMaxPerChannel        int            // workflows that may fire in one channel; a save beyond is refused
	WorkflowMinScheduleInterval  time.Duration  // shortest time a schedule saved may leave between two slots
	WorkflowStepTimeout          time.Duration  // deadline of a step without timeout_secs

	// Blossom media (PUT /media/upload, GET|HEAD|DELETE /media/{sha256}).
	MediaStore        string   // "fs" (files under MediaDir) or "s3"
	MediaDir          string   // the fs store's directory; "" with the fs store turns media off (dev: .data/media)
	MediaMaxBytes     int      // largest blob accepted
	MediaAllowedTypes []string // media types accepted, as sniffed from the blob's first bytes
	MediaTempDir      string   // where uploads are spooled while hashed; "" = the system's
	// Uploads received at once, all clients together and from one client
	// address: each spools up to MediaMaxBytes to MediaTempDir.
	MediaMaxUploads        int
	MediaMaxUploadsPerAddr int
	// MediaCommunityQuotaBytes bounds what one community's media takes
	// (blobs in 4 KiB units, sidecars, upload records); an upload past it
	// gets 507.
	MediaCommunityQuotaBytes int
	// The sweep of blobs no community references: how often it runs, and
	// how long a blob stays unreferenced before it is removed.
	MediaSweepInterval time.Duration
	MediaSweepGrace    time.Duration
	MediaS3Endpoint    string // host:port of the S3-compatible server
	MediaS3Bucket      string
	MediaS3AccessKey   string
	MediaS3SecretKey   string
	MediaS3Region      string
	MediaS3TLS         bool // https to the S3 endpoint

	// Several relay processes as one (docs/multi-relay.md).
	RedisURL          string // BUZZ_REDIS_URL: empty means this process is the only relay
	RedisPublishQueue int    // events waiting to go to Redis; past it they are dropped and counted

	// Presence (kind 20001): how long an announcement keeps its author
	// present in a channel for later subscribers, and how many
	// announcements one process holds when there is no Redis, and how many
	// bytes of them (with Redis, the bytes one community holds).
	PresenceTTL        time.Duration
	PresenceMaxEntries int
	PresenceMaxBytes   int
	// PresenceMaxChannelBytes bounds one channel's presence (in process
	// and in Redis), which a presence REQ reads whole.
	PresenceMaxChannelBytes int

	// Read-replica routing (docs/replica.md).
	ReadDatabaseURL         string        // BUZZ_READ_DATABASE_URL: a streaming standby; empty: every read on the writer
	ReadPoolSize            int32         // reader connections; 0: as many as the writer's
	ReplicaReadMaxAge       time.Duration // how old a proved token may be for a fresh read; 0 turns fresh routing off
	ReplicaAcquireTimeout   time.Duration // the one budget for a proved reader transaction before falling back
	ReplicaStatementTimeout time.Duration // statement_timeout of reader sessions
	ReplicaIdleInTxTimeout  time.Duration // idle_in_transaction_session_timeout of reader sessions
	ReplicaProbeInterval    time.Duration // how often the writer-side probe writes a heartbeat token
	CreatedAtFloor          time.Duration // how far before commit a channel event may be dated while routing is on
}

// MinReplicaProbeInterval keeps the probe's 120 remembered tokens
// spanning the 30 s a token stays usable: a faster probe would forget the
// token a lagging reader still proves.
const MinReplicaProbeInterval = 250 * time.Millisecond

// MaxReplicaProbeInterval keeps a few ticks inside the 30 s after which
// the ring counts as closed: a slower probe would close routing for good,
// silently.
const MaxReplicaProbeInterval = 10 * time.Second

// MaxCreatedAtFloorSecs is the largest floor the writer's trigger reads
// (nine digits): a longer one would leave it disarmed while the probe
// still counted on it.
const MaxCreatedAtFloorSecs = 999_999_999

// MaxReplicaReadMaxAge caps BUZZ_REPLICA_READ_MAX_AGE_MS: a fresher ring
// entry than the probe keeps cannot be asked for.
const MaxReplicaReadMaxAge = 30 * time.Second

// DefaultMediaTypes are the blob types accepted unless
// BUZZ_MEDIA_ALLOWED_TYPES says otherwise: images, audio, video, PDF and
// plain text; nothing a browser would run as a page or script.
var DefaultMediaTypes = []string{
	"image/png", "image/jpeg", "image/gif", "image/webp",
	"video/mp4", "video/webm", "audio/mpeg", "audio/ogg", "audio/wave",
	"application/ogg", "application/pdf", "text/plain",
}

// Default is the configuration with every variable unset.
func Default() Config {
	return Config{
		ListenAddr:        ":3000",
		RelayURL:          "ws://localhost:3000",
		LogLevel:          slog.LevelInfo,
		RelayName:         "Buzz",
		RelayDescription:  "A Postgres-centric Nostr relay where people and agents share channels.",
		MaxMessageBytes:   256 << 10,
		MaxSubscriptions:  32,
		MessagesPerSecond: 100,
		MaxFilters:        10,
		MaxLimit:          500,
		MaxEventTags:      2000,
		MaxContentLength:  64 << 10,
		MaxFutureSkew:     15 * time.Minute,
		// Enough for any real mention list; a 2,000-entry follow list still
		// stores, with mention rows for its first 100 pubkeys.
		MaxMentionsPerEvent: 100,
		// Far deeper than conversations go, small enough that one reply's
		// ancestor updates stay cheap under the thread's lock.
		MaxThreadDepth: 64,
		// A fold of a channel's lists was measured at up to about 90 µs a
		// member: 9 s at 100,000, a third of the 30 s write timeout it must
		// finish in (docs/limits.md).
		MaxChannelMembers: 100_000,
		// Below 64 so a group's savepoints stay in PostgreSQL's per-backend
		// subtransaction cache (beyond it every snapshot gets slower).
		IngestGroupMax:         32,
		IngestGroupWriters:     2,
		IngestQueue:            1024,
		IngestGroupLockTimeout: 250 * time.Millisecond,
		IngestWriteTimeout:     30 * time.Second,
		AuthWindow:             60 * time.Second,
		SendQueue:              1024,
		SendQueueBytes:         16 << 20,
		WriteTimeout:           10 * time.Second,
		PingInterval:           30 * time.Second,
		// The announcement closes connections at once; the sweep only
		// bounds how long a lost announcement leaves them open.
		ClosedCommunitySweep:  30 * time.Second,
		QueryTimeout:          10 * time.Second,
		EventsAnalyzeInterval: time.Second,
		EventsAnalyzeMinRows:  1000,
		DBMaxConns:            20,

		AuthTimeout:           30 * time.Second,
		MaxConnections:        10000,
		MaxConnectionsPerAddr: 50,
		HandshakesPerSecond:   10,
		MaxFilterValues:       2000,
		PublishPerMinute:      120,
		PublishBurst:          60,
		RateLimitKeys:         100000,
		ReqPageRows:           200,
		SearchCandidates:      1000,
		ReplyQueueBytes:       1 << 20,
		HTTPReadTimeout:       30 * time.Second,
		HTTPWriteTimeout:      30 * time.Second,
		HTTPIdleTimeout:       60 * time.Second,
		MetricsAddr:           "127.0.0.1:9464",

		WorkflowRunLease:     30 * time.Second,
		WorkflowPoll:         time.Second,
		WorkflowMaxRuns:      100,
		WorkflowCatchUp:      10 * time.Minute,
		WorkflowRunRetention: 30 * 24 * time.Hour,
		WebhookMaxBytes:      61440,

		WorkflowWebhookTimeout:       safehttp.DefaultTimeout,
		WorkflowWebhookResponseBytes: safehttp.DefaultMaxResponseBytes,
		WorkflowMaxUnfinishedRuns:    1000,
		WorkflowMaxPerChannel:        20,
		WorkflowMinScheduleInterval:  60 * time.Second,
		WorkflowStepTimeout:          300 * time.Second,

		MediaStore:               "fs",
		MediaMaxBytes:            100 << 20,
		MediaMaxUploads:          16,
		MediaMaxUploadsPerAddr:   4,
		MediaCommunityQuotaBytes: 10 << 30,
		MediaSweepInterval:       10 * time.Minute,
		MediaSweepGrace:          time.Hour,
		MediaAllowedTypes:        DefaultMediaTypes,
		MediaS3Region:            "us-east-1",
		MediaS3TLS:               true,
		RedisPublishQueue:        10000,

		PresenceTTL:             60 * time.Second,
		PresenceMaxEntries:      100000,
		PresenceMaxBytes:        64 << 20,
		PresenceMaxChannelBytes: 4 << 20,

		ReplicaAcquireTimeout:   150 * time.Millisecond,
		ReplicaStatementTimeout: 5 * time.Second,
		ReplicaIdleInTxTimeout:  10 * time.Second,
		ReplicaProbeInterval:    500 * time.Millisecond,
		// Fifteen minutes (how far ahead ingest accepts created_at) and a
		// minute of slack.
		CreatedAtFloor: 960 * time.Second,
	}
}

// FromEnv reads the configuration through getenv (os.Getenv in main).
func FromEnv(getenv func(string) string) (Config, error) {
	c := Default()
	r := reader{getenv: getenv}
	r.str("BUZZ_DATABASE_URL", &c.DatabaseURL)
	r.str("BUZZ_LISTEN_ADDR", &c.ListenAddr)
	r.str("BUZZ_PPROF_ADDR", &c.PprofAddr)
	r.str("BUZZ_RELAY_URL", &c.RelayURL)
	r.str("BUZZ_RELAY_NAME", &c.RelayName)
	r.str("BUZZ_RELAY_DESCRIPTION", &c.RelayDescription)
	r.str("BUZZ_RELAY_CONTACT", &c.RelayContact)
	r.level("BUZZ_LOG_LEVEL", &c.LogLevel)
	r.positive("BUZZ_MAX_MESSAGE_BYTES", &c.MaxMessageBytes)
	r.positive("BUZZ_MAX_SUBSCRIPTIONS", &c.MaxSubscriptions)
	r.positive("BUZZ_MESSAGES_PER_SECOND", &c.MessagesPerSecond)
	r.positive("BUZZ_MAX_FILTERS", &c.MaxFilters)
	r.positive("BUZZ_MAX_LIMIT", &c.MaxLimit)
	r.positive("BUZZ_MAX_EVENT_TAGS", &c.MaxEventTags)
	r.positive("BUZZ_MAX_CONTENT_LENGTH", &c.MaxContentLength)
	r.positive("BUZZ_MAX_MENTIONS_PER_EVENT", &c.MaxMentionsPerEvent)
	r.positive("BUZZ_MAX_THREAD_DEPTH", &c.MaxThreadDepth)
	r.positive("BUZZ_MAX_CHANNEL_MEMBERS", &c.MaxChannelMembers)
	r.positive("BUZZ_INGEST_GROUP_MAX", &c.IngestGroupMax)
	r.positive("BUZZ_INGEST_GROUP_WRITERS", &c.IngestGroupWriters)
	r.positive("BUZZ_INGEST_QUEUE", &c.IngestQueue)
	r.duration("BUZZ_INGEST_GROUP_LOCK_TIMEOUT", &c.IngestGroupLockTimeout)
	r.duration("BUZZ_INGEST_WRITE_TIMEOUT", &c.IngestWriteTimeout)
	r.positive("BUZZ_SEND_QUEUE", &c.SendQueue)
	r.positive("BUZZ_SEND_QUEUE_BYTES", &c.SendQueueBytes)
	r.duration("BUZZ_WRITE_TIMEOUT", &c.WriteTimeout)
	r.duration("BUZZ_PING_INTERVAL", &c.PingInterval)
	r.duration("BUZZ_CLOSED_COMMUNITY_SWEEP", &c.ClosedCommunitySweep)
	r.duration("BUZZ_QUERY_TIMEOUT", &c.QueryTimeout)
	r.millis("BUZZ_EVENTS_ANALYZE_INTERVAL_MS", &c.EventsAnalyzeInterval, true)
	r.positive("BUZZ_EVENTS_ANALYZE_MIN_ROWS", &c.EventsAnalyzeMinRows)
	r.duration("BUZZ_AUTH_TIMEOUT", &c.AuthTimeout)
	r.positive("BUZZ_MAX_CONNECTIONS", &c.MaxConnections)
	r.positive("BUZZ_MAX_CONNECTIONS_PER_ADDRESS", &c.MaxConnectionsPerAddr)
	r.positive("BUZZ_HANDSHAKES_PER_SECOND", &c.HandshakesPerSecond)
	r.positive("BUZZ_MAX_FILTER_VALUES", &c.MaxFilterValues)
	r.positive("BUZZ_PUBLISH_PER_MINUTE", &c.PublishPerMinute)
	r.positive("BUZZ_PUBLISH_BURST", &c.PublishBurst)
	r.positive("BUZZ_RATE_LIMIT_KEYS", &c.RateLimitKeys)
	r.positive("BUZZ_REQ_PAGE_ROWS", &c.ReqPageRows)
	r.positive("BUZZ_SEARCH_CANDIDATES", &c.SearchCandidates)
	r.positive("BUZZ_REPLY_QUEUE_BYTES", &c.ReplyQueueBytes)
	r.duration("BUZZ_HTTP_READ_TIMEOUT", &c.HTTPReadTimeout)
	r.duration("BUZZ_HTTP_WRITE_TIMEOUT", &c.HTTPWriteTimeout)
	r.duration("BUZZ_HTTP_IDLE_TIMEOUT", &c.HTTPIdleTimeout)
	r.str("BUZZ_METRICS_ADDR", &c.MetricsAddr)
	r.prefixes("BUZZ_TRUSTED_PROXIES", &c.TrustedProxies)
	r.duration("BUZZ_WORKFLOW_RUN_LEASE", &c.WorkflowRunLease)
	r.duration("BUZZ_WORKFLOW_POLL", &c.WorkflowPoll)
	r.positive("BUZZ_WORKFLOW_MAX_RUNS", &c.WorkflowMaxRuns)
	r.duration("BUZZ_WORKFLOW_SCHEDULE_CATCH_UP", &c.WorkflowCatchUp)
	r.duration("BUZZ_WORKFLOW_RUN_RETENTION", &c.WorkflowRunRetention)
	if c.WorkflowRunRetention <= c.WorkflowCatchUp && r.err == nil {
		// A slot claim deleted inside the catch-up window would fire again.
		r.fail("BUZZ_WORKFLOW_RUN_RETENTION", c.WorkflowRunRetention.String(), "a duration longer than BUZZ_WORKFLOW_SCHEDULE_CATCH_UP ("+c.WorkflowCatchUp.String()+")")
	}
	r.positive("BUZZ_WORKFLOW_WEBHOOK_MAX_BYTES", &c.WebhookMaxBytes)
	r.duration("BUZZ_WORKFLOW_WEBHOOK_TIMEOUT", &c.WorkflowWebhookTimeout)
	r.positive("BUZZ_WORKFLOW_WEBHOOK_RESPONSE_BYTES", &c.WorkflowWebhookResponseBytes)
	r.prefixes("BUZZ_WORKFLOW_WEBHOOK_ALLOWED_NETS", &c.WorkflowWebhookAllowedNets)
	r.positive("BUZZ_WORKFLOW_MAX_UNFINISHED_RUNS", &c.WorkflowMaxUnfinishedRuns)
	r.positive("BUZZ_WORKFLOW_MAX_PER_CHANNEL", &c.WorkflowMaxPerChannel)
	r.duration("BUZZ_WORKFLOW_MIN_SCHEDULE_INTERVAL", &c.WorkflowMinScheduleInterval)
	r.duration("BUZZ_WORKFLOW_STEP_TIMEOUT", &c.WorkflowStepTimeout)
	r.str("BUZZ_MEDIA_STORE", &c.MediaStore)
	r.str("BUZZ_MEDIA_DIR", &c.MediaDir)
	r.positive("BUZZ_MEDIA_MAX_BYTES", &c.MediaMaxBytes)
	r.list("BUZZ_MEDIA_ALLOWED_TYPES", &c.MediaAllowedTypes)
	r.str("BUZZ_MEDIA_TEMP_DIR", &c.MediaTempDir)
	r.positive("BUZZ_MEDIA_MAX_UPLOADS", &c.MediaMaxUploads)
	r.positive("BUZZ_MEDIA_MAX_UPLOADS_PER_ADDRESS", &c.MediaMaxUploadsPerAddr)
	r.positive("BUZZ_MEDIA_COMMUNITY_QUOTA_BYTES", &c.MediaCommunityQuotaBytes)
	r.duration("BUZZ_MEDIA_SWEEP_INTERVAL", &c.MediaSweepInterval)
	r.duration("BUZZ_MEDIA_SWEEP_GRACE", &c.MediaSweepGrace)
	r.str("BUZZ_MEDIA_S3_ENDPOINT", &c.MediaS3Endpoint)
	r.str("BUZZ_MEDIA_S3_BUCKET", &c.MediaS3Bucket)
	r.str("BUZZ_MEDIA_S3_ACCESS_KEY", &c.MediaS3AccessKey)
	r.str("BUZZ_MEDIA_S3_SECRET_KEY", &c.MediaS3SecretKey)
	r.str("BUZZ_MEDIA_S3_REGION", &c.MediaS3Region)
	r.boolean("BUZZ_MEDIA_S3_TLS", &c.MediaS3TLS)
	r.str("BUZZ_REDIS_URL", &c.RedisURL)
	r.positive("BUZZ_REDIS_PUBLISH_QUEUE", &c.RedisPublishQueue)
	r.duration("BUZZ_PRESENCE_TTL", &c.PresenceTTL)
	r.positive("BUZZ_PRESENCE_MAX_ENTRIES", &c.PresenceMaxEntries)
	r.positive("BUZZ_PRESENCE_MAX_BYTES", &c.PresenceMaxBytes)
	r.positive("BUZZ_PRESENCE_MAX_CHANNEL_BYTES", &c.PresenceMaxChannelBytes)
	r.str("BUZZ_READ_DATABASE_URL", &c.ReadDatabaseURL)
	var readPool int
	r.positive("BUZZ_DB_READ_POOL_SIZE", &readPool)
	c.ReadPoolSize = int32(readPool)
	r.millis("BUZZ_REPLICA_READ_MAX_AGE_MS", &c.ReplicaReadMaxAge, true)
	c.ReplicaReadMaxAge = min(c.ReplicaReadMaxAge, MaxReplicaReadMaxAge)
	r.millis("BUZZ_REPLICA_ACQUIRE_TIMEOUT_MS", &c.ReplicaAcquireTimeout, false)
	r.millis("BUZZ_REPLICA_STATEMENT_TIMEOUT_MS", &c.ReplicaStatementTimeout, false)
	r.millis("BUZZ_REPLICA_IDLE_IN_TRANSACTION_TIMEOUT_MS", &c.ReplicaIdleInTxTimeout, false)
	r.millis("BUZZ_REPLICA_PROBE_INTERVAL_MS", &c.ReplicaProbeInterval, false)
	if (c.ReplicaProbeInterval < MinReplicaProbeInterval || c.ReplicaProbeInterval > MaxReplicaProbeInterval) && r.err == nil {
		r.fail("BUZZ_REPLICA_PROBE_INTERVAL_MS", r.getenv("BUZZ_REPLICA_PROBE_INTERVAL_MS"), "between 250 and 10000 milliseconds")
	}
	var floorSecs int
	r.positive("BUZZ_REPLICA_CREATED_AT_FLOOR_SECS", &floorSecs)
	if floorSecs > MaxCreatedAtFloorSecs {
		r.fail("BUZZ_REPLICA_CREATED_AT_FLOOR_SECS", r.getenv("BUZZ_REPLICA_CREATED_AT_FLOOR_SECS"), "at most 999999999 seconds")
	} else if floorSecs > 0 {
		c.CreatedAtFloor = time.Duration(floorSecs) * time.Second
	}
	// The old setting counted seconds and gated fewer reads; a deployment
	// still setting it would silently get different routing.
	if v := r.getenv("BUZZ_REPLICA_HEAD_MAX_AGE_SECS"); v != "" && r.err == nil {
		r.err = fmt.Errorf("BUZZ_REPLICA_HEAD_MAX_AGE_SECS is no longer read: set BUZZ_REPLICA_READ_MAX_AGE_MS (milliseconds, 0 = off) instead and remove it")
	}
	// The old setting counted bytes; the limit is now in characters, as
	// NIP-11 advertises it, and a value kept under the old name would be
	// silently ignored.
	if v := r.getenv("BUZZ_MAX_CONTENT_BYTES"); v != "" && r.err == nil {
		r.err = fmt.Errorf("BUZZ_MAX_CONTENT_BYTES is no longer read: set BUZZ_MAX_CONTENT_LENGTH (characters) instead and remove it")
	}
	var maxConns int
	r.positive("BUZZ_DB_MAX_CONNS", &maxConns)
	if maxConns > 0 {
		c.DBMaxConns = int32(maxConns)
	}

	if r.err != nil {
		return Config{}, r.err
	}
	switch c.MediaStore {
	case "fs":
	case "s3":
		if c.MediaS3Endpoint == "" || c.MediaS3Bucket == "" {
			return Config{}, fmt.Errorf("BUZZ_MEDIA_STORE=s3 needs BUZZ_MEDIA_S3_ENDPOINT and BUZZ_MEDIA_S3_BUCKET")
		}
	default:
		return Config{}, fmt.Errorf("BUZZ_MEDIA_STORE=%q: want fs or s3", c.MediaStore)
	}
	if c.ReadDatabaseURL != "" && c.ReplicaStatementTimeout >= c.QueryTimeout {
		// A routed read the standby cannot finish falls back to the writer
		// within the read's one budget: with no time left, it fails instead.
		return Config{}, fmt.Errorf("BUZZ_REPLICA_STATEMENT_TIMEOUT_MS (%s) must be below BUZZ_QUERY_TIMEOUT (%s): a read the standby cannot finish needs time left for the writer",
			c.ReplicaStatementTimeout, c.QueryTimeout)
	}
	if community.RelayURLAuthority(c.RelayURL) == "" {
		return Config{}, fmt.Errorf("BUZZ_RELAY_URL=%q: want a URL with a host, such as wss://relay.example.com", c.RelayURL)
	}
	return c, nil
}

// RelayHost is the normalized authority of RelayURL: the host this
// deployment's own community is seeded under.
func (c Config) RelayHost() string { return community.RelayURLAuthority(c.RelayURL) }

type reader struct {
	getenv func(string) string
	err    error
}

func (r *reader) fail(name, value, want string) {
	if r.err == nil {
		r.err = fmt.Errorf("%s=%q: want %s", name, value, want)
	}
}

func (r *reader) str(name string, dst *string) {
	if v := strings.TrimSpace(r.getenv(name)); v != "" {
		*dst = v
	}
}

func (r *reader) positive(name string, dst *int) {
	v := strings.TrimSpace(r.getenv(name))
	if v == "" {
		return
	}
	n, err := strconv.Atoi(v)
	if err != nil || n <= 0 {
		r.fail(name, v, "a positive integer")
		return
	}
	*dst = n
}

// millis reads a whole number of milliseconds; zero is allowed only when
// zeroOK (it then means off).
func (r *reader) millis(name string, dst *time.Duration, zeroOK bool) {
	v := strings.TrimSpace(r.getenv(name))
	if v == "" {
		return
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil || n < 0 || (n == 0 && !zeroOK) || n > 1<<31 {
		if zeroOK {
			r.fail(name, v, "a non-negative whole number of milliseconds (0 = off)")
		} else {
			r.fail(name, v, "a positive whole number of milliseconds")
		}
		return
	}
	*dst = time.Duration(n) * time.Millisecond
}

func (r *reader) duration(name string, dst *time.Duration) {
	v := strings.TrimSpace(r.getenv(name))
	if v == "" {
		return
	}
	d, err := time.ParseDuration(v)
	if err != nil || d <= 0 {
		r.fail(name, v, "a positive duration such as 10s")
		return
	}
	*dst = d
}

func (r *reader) level(name string, dst *slog.Level) {
	v := strings.TrimSpace(r.getenv(name))
	if v == "" {
		return
	}
	if err := dst.UnmarshalText([]byte(v)); err != nil {
		r.fail(name, v, "debug, info, warn or error")
	}
}

// list reads a comma-separated list of non-empty items.
func (r *reader) list(name string, dst *[]string) {
	v := strings.TrimSpace(r.getenv(name))
	if v == "" {
		return
	}
	var out []string
	for _, item := range strings.Split(v, ",") {
		if item = strings.TrimSpace(item); item == "" {
			r.fail(name, v, "a comma-separated list without empty items")
			return
		}
		out = append(out, strings.ToLower(item))
	}
	*dst = out
}

func (r *reader) boolean(name string, dst *bool) {
	v := strings.TrimSpace(r.getenv(name))
	if v == "" {
		return
	}
	b, err := strconv.ParseBool(v)
	if err != nil {
		r.fail(name, v, "true or false")
		return
	}
	*dst = b
}

// prefixes reads a comma-separated list of IP addresses and CIDR prefixes
// (a bare address means just that address).
func (r *reader) prefixes(name string, dst *[]netip.Prefix) {
	v := strings.TrimSpace(r.getenv(name))
	if v == "" {
		return
	}
	var out []netip.Prefix
	for _, item := range strings.Split(v, ",") {
		item = strings.TrimSpace(item)
		if p, err := netip.ParsePrefix(item); err == nil {
			out = append(out, p.Masked())
			continue
		}
		addr, err := netip.ParseAddr(item)
		if err != nil {
			r.fail(name, v, "comma-separated IP addresses or CIDR prefixes such as 10.0.0.0/8,192.0.2.7")
			return
		}
		addr = addr.Unmap()
		out = append(out, netip.PrefixFrom(addr, addr.BitLen()))
	}
	*dst = out
}
