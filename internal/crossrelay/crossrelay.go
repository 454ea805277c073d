// Package crossrelay joins several relay processes serving one database into
// one relay for live delivery, through Redis publish/subscribe: each process
// publishes what it committed (and the ephemeral events it relayed) and
// every membership change, and hands what the others published to its own
// fan-out. The database stays the only source of truth; Redis only carries
// "this just happened", so losing it costs live delivery across processes,
// never a stored event (docs/multi-relay.md).
package crossrelay

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"golang.org/x/sync/semaphore"

	"github.com/buzzrelay/buzz/internal/clock"
	"github.com/buzzrelay/buzz/internal/nostr"
)

// Every key and channel of a community lives under buzz:<community id>:.
// One channel per community carries both events and invalidations, so a
// process's invalidation reaches every other process before the events it
// published after it.
const (
	channelSuffix = ":fanout"
	channelPrefix = "buzz:"
	// subscribePattern matches every community's channel.
	subscribePattern = channelPrefix + "*" + channelSuffix
	// controlSuffix names the channel operators use to act on a
	// community's connections on every relay (buzz-admin deletions).
	controlSuffix  = ":conn-control"
	controlPattern = channelPrefix + "*" + controlSuffix
	// aliveChannel carries every process's heartbeat and goodbye
	// (Bus.send), outside every community.
	aliveChannel = channelPrefix + "relays:alive"
	goodbyeWord  = "bye"
	// unpublishedWord, after a process id and before a time (Unix
	// nanoseconds), is a report sent just before an announcement or
	// goodbye by a process that could not publish some events queued since
	// its previous announcement: the oldest of them was queued at that
	// time, and the others replay from it. It is a message of its own, so
	// a process that does not know reports still hears the announcement.
	unpublishedWord = "unpublished"
)

// ChannelName is the Redis channel of one community's live traffic.
func ChannelName(community uuid.UUID) string {
	return channelPrefix + community.String() + channelSuffix
}

// ControlChannel is the Redis channel that carries operator commands for
// one community's connections.
func ControlChannel(community uuid.UUID) string {
	return channelPrefix + community.String() + controlSuffix
}

// DisconnectCommunity is the ControlChannel payload that closes every
// connection of the community on every relay.
const DisconnectCommunity = `{"op":"DisconnectCommunity"}`

// loggedPayload is how much of a message that is not understood is logged.
const loggedPayload = 64

// control is a ControlChannel message.
type control struct {
	Op string `json:"op"`
}

// Timing of the connection to Redis. Not settings: they only bound how fast
// an outage is noticed and how hard a returning Redis is knocked on.
const (
	// proofInterval: the subscription is pinged this often, busy or quiet.
	// Redis answers a subscriber's ping in order with the messages, so each
	// pong proves that everything published before its ping was read.
	proofInterval = 250 * time.Millisecond
	// hearingWindow: how old the last such proof may be for this process
	// to count as hearing the others (Hears). It bounds how long another
	// process's invalidation can go unheard here, a stalled Redis
	// included, before cached access answers stop being trusted.
	hearingWindow = time.Second
	// stallAfter: a subscription without a pong this long is dropped and
	// resubscribed (a stalled Redis, stopped or cut off without a reset).
	stallAfter = 4 * time.Second
	minBackoff = 100 * time.Millisecond
	maxBackoff = 2 * time.Second
	// publishTimeout bounds one batch of publishes; a batch that fails is
	// dropped (counted), never retried, so nothing is delivered twice.
	publishTimeout = 2 * time.Second
	maxBatch       = 256
	// receiveAhead and receiveAheadBytes bound the events read from Redis
	// and not yet handed to the fan-out: how far the reader may run ahead
	// of the fan-out to find the invalidations and closings behind them.
	receiveAhead      = 1024
	receiveAheadBytes = 8 << 20
	// aliveInterval: how often a process announces on aliveChannel that it
	// is alive, in order with what it publishes (the announcement is the
	// last message of its batch), so a heard announcement proves that the
	// events queued before it were published.
	aliveInterval = 500 * time.Millisecond
	// peerDeadAfter: a peer unheard this long, while this process still
	// hears itself or others, is taken for dead (killed between commit
	// and publish, say): what it committed since its last announcement
	// is replayed from the database.
	peerDeadAfter = 3 * time.Second
	// hearingFresh: how recent the last announcement heard (this
	// process's own or another's) must be for silence to count against a
	// peer rather than against this process's own hearing.
	hearingFresh = 2 * aliveInterval
	// mostPeers bounds the processes remembered; announcements of more are
	// ignored (only relay processes publish on Redis).
	mostPeers = 1024
	// unpublishedReach: how far back a replay of the events a peer reports
	// unpublished may start. The relay's fan-out remembers what it
	// delivered for 15 s and a replay reads 5 s before its start, so an
	// older start would send again what it forgot.
	unpublishedReach = 10 * time.Second
	// junkLogEvery: at most one warning this often for messages on the
	// bus's channels that do not decode; the rest are counted, and the
	// next warning says how many were not logged. A buggy or hostile
	// publisher would otherwise write one line per message into every
	// relay's log.
	junkLogEvery = 10 * time.Second
	// reportEvery: a process reports its unpublished events at most this
	// often. While its queue stays full every announcement would carry a
	// report, and every other process would replay from the database
	// twice a second; reports in between join the next (the oldest time).
	reportEvery = 2 * time.Second
)

// Handlers receive what the other processes published. They are called
// from one goroutine, in the order Redis delivered the messages.
type Handlers struct {
	// Deliver hands a remote event to the local fan-out, with the readers
	// version its write read (fanout.Hub.PublishWritten).
	Deliver func(community uuid.UUID, ev *nostr.Event, channel *uuid.UUID, readersVersion int64)
	// Invalidate drops a community's cached access answers.
	Invalidate func(community uuid.UUID)
	// Resync runs on every (re)subscription: invalidations published while
	// this process was not listening are lost, so every cached access
	// answer must go. It runs before Connected reports the bus back.
	Resync func()
	// CloseCommunity closes every local connection of a deleted community.
	CloseCommunity func(community uuid.UUID)
	// CatchUp replays to the local fan-out what the database received
	// between since and until: a subscription failed, and what the other
	// processes published after since (the last proof that everything
	// before it was heard) and before until (the new subscription) may
	// have been lost. It runs on the fan-out's goroutine before any event
	// heard on the new subscription, and returns how many events it
	// handed on.
	CatchUp func(ctx context.Context, since, until time.Time) (replayed int, err error)
}

// Metrics of the bus.
type Metrics struct {
	Connected prometheus.Gauge
	Published prometheus.Counter
	Dropped   *prometheus.CounterVec // reason: queue_full, redis_error, after_goodbye
	Received  prometheus.Counter
	// Pending counts messages queued or being published: 0 means every
	// message so far was published or dropped.
	Pending prometheus.Gauge
	// Gaps counts lost subscriptions by how their catch-up went
	// (replayed, failed); Replayed the events catch-ups handed on.
	Gaps     *prometheus.CounterVec
	Replayed prometheus.Counter
	// PeerDeaths counts the processes that went silent without a goodbye;
	// their replays count in Gaps as peer_replayed or peer_failed.
	PeerDeaths prometheus.Counter
	// Peers is how many other processes this one hears announce
	// themselves.
	Peers prometheus.Gauge
	// Undecodable counts the messages on the bus's channels that were
	// not understood and skipped (logged at most once per junkLogEvery).
	Undecodable prometheus.Counter
	// PresenceWrittenBack counts the presence announcements written back
	// to Redis (SharedPresence.Restore), PresenceWriteBackFailures the
	// write-backs that failed and wait to be tried again.
	PresenceWrittenBack       prometheus.Counter
	PresenceWriteBackFailures prometheus.Counter
}

// NewMetrics registers the bus's collectors on reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		Connected: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "buzz_redis_connected", Help: "1 while this relay is subscribed to the other relays' live traffic through Redis, else 0 (degraded: local delivery only).",
		}),
		Published: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "buzz_redis_published_total", Help: "Events and invalidations published to the other relays.",
		}),
		Dropped: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "buzz_redis_publish_dropped_total", Help: "Events and invalidations not published to the other relays, by reason.",
		}, []string{"reason"}),
		Received: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "buzz_redis_received_total", Help: "Events and invalidations received from the other relays.",
		}),
	}
	m.Pending = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "buzz_redis_publish_pending", Help: "Events and invalidations queued for, or being published to, the other relays.",
	})
	m.Gaps = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "buzz_redis_gaps_total", Help: "Lost subscriptions to the other relays' live traffic, by how the catch-up from the database went (replayed, failed).",
	}, []string{"outcome"})
	m.Replayed = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "buzz_redis_replayed_total", Help: "Stored events the other relays committed while this relay's subscription was lost, replayed to its subscribers from the database.",
	})
	m.PeerDeaths = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "buzz_redis_peer_deaths_total", Help: "Other relay processes that stopped announcing themselves without a goodbye (killed) while this relay still heard Redis; what they committed since is replayed from the database.",
	})
	m.Peers = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "buzz_redis_peers", Help: "Other relay processes this relay hears announce themselves through Redis.",
	})
	m.Undecodable = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "buzz_redis_undecodable_total", Help: "Messages on the relays' Redis channels that this relay could not decode (or an unknown connection control), skipped; a rising count means a buggy or foreign publisher.",
	})
	m.PresenceWrittenBack = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "buzz_redis_presence_written_back_total", Help: "Presence announcements this relay held and wrote back to Redis: kept only in its memory while Redis could not take them, or all it held once Redis restarted.",
	})
	m.PresenceWriteBackFailures = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "buzz_redis_presence_write_back_failures_total", Help: "Write-backs of presence to Redis that failed (Redis or the database did not answer) and are tried again.",
	})
	reg.MustRegister(m.Connected, m.Published, m.Dropped, m.Received, m.Pending, m.Gaps, m.Replayed, m.PeerDeaths, m.Peers, m.Undecodable,
		m.PresenceWrittenBack, m.PresenceWriteBackFailures)
	return m
}

// message is what travels on a community channel.
type message struct {
	Origin  string          `json:"o"`           // the publishing process: its own messages are skipped
	Event   json.RawMessage `json:"e,omitempty"` // absent: an access invalidation
	Channel *uuid.UUID      `json:"c,omitempty"` // the event's channel (nil: community-global)
	// ReadersVersion is the channel's readers version the event's write
	// read (0: none), so the receiving fan-out does not deliver it from a
	// reader set older than that, whichever invalidation reaches it first.
	ReadersVersion int64 `json:"v,omitempty"`
}

type outgoing struct {
	channel string
	payload []byte
	// invalidates is the community an access invalidation is about (nil
	// for an event).
	invalidates *uuid.UUID
	// queuedAt is when an event was queued: if its publish fails, the
	// next announcement tells the others to replay from then.
	queuedAt time.Time
	// announces: a heartbeat or goodbye, not an event or invalidation
	// (neither queued nor counted as one).
	announces bool
}

// Bus is one process's connection to the others.
type Bus struct {
	client    *redis.Client
	origin    string
	handlers  Handlers
	log       *slog.Logger
	metrics   *Metrics
	queue     chan outgoing
	connected atomic.Bool
	// presence is the store made by Presence, told when a new
	// subscription is to a Redis that restarted: it may have lost what
	// the store wrote to it.
	presence atomic.Pointer[SharedPresence]
	// redisRunID is the run_id of the Redis the last subscription was to
	// (subscribe's alone): it changes when Redis restarts.
	redisRunID string
	// heardUpTo is when (on start's monotonic clock) the ping whose pong
	// came last was sent: everything Redis took before then has been read.
	start     time.Time
	heardUpTo atomic.Int64
	stall     time.Duration // stallAfter; longer in tests that watch Hears alone
	// clock spaces the reports of unpublished events (reportEvery); the
	// zero value is the wall clock, tests stub it.
	clock clock.Clock
	// The reader's waits for the fan-out's room, which prove discounts.
	waitingForRoom atomic.Bool
	readerResumed  atomic.Int64
	// A gap opens when a subscription fails (gapSince: the last proof of
	// hearing before it) and is taken by the next subscription, whose
	// fan-out catches up on it first. catchingUp is set from the failure
	// (before the fan-out drained what was read ahead of it) until a
	// catch-up returned with no newer gap open.
	// The bus starts with a gap open (gapAtStart): a process that starts
	// while Redis is down serves its subscribers without hearing the
	// others until its first subscription.
	gapMu      sync.Mutex
	gapSince   time.Time
	gapOpen    bool
	gapAtStart bool
	catchingUp atomic.Bool

	// unsent holds the communities whose invalidation found the queue full
	// or failed to publish. An invalidation must not be lost while the
	// events queued after it get through: the other processes would go on
	// delivering a private channel to a member removed before those events,
	// for as long as their cached answer lives. Unlike an event, an
	// invalidation is harmless twice, so it is sent again, ahead of the
	// next batch. wake starts the sender when nothing else is queued.
	unsentMu sync.Mutex
	unsent   map[uuid.UUID]struct{}
	wake     chan struct{}

	// peerReplays counts the replays of dead peers queued and not done:
	// the hub keeps what it published meanwhile (CatchingUp).
	peerReplays atomic.Int32
	// killed: Kill was called; nothing more is published.
	killed atomic.Bool
	// stopped: the goodbye is said; what is queued after it is dropped,
	// counted and logged (once): a writer the shutdown did not wait for.
	stopped     atomic.Bool
	lateWarning sync.Once
	// unpublishedSince is when the oldest event was queued that was
	// dropped (queue full, failed publish) and that no announcement heard
	// by the others has reported yet (Unix nanoseconds, 0: none). An
	// announcement vouches for what was queued before it, so it carries
	// this time, and the others replay from the database what this
	// process committed since then.
	unpublishedSince atomic.Int64
	// failNextPublish makes the next batch that carries events fail as a
	// Redis error would (FailNextPublish).
	failNextPublish atomic.Bool
	// reportedSince is the oldest time reported by the peers' reports of
	// unpublished events heard since the replay queued for them, not
	// started yet (Unix nanoseconds, 0: none queued).
	reportedSince atomic.Int64
	// junk limits the warnings about undecodable messages, unreachable
	// those about unpublished events too old to replay, asked the notes
	// about this process's own reports.
	junk, unreachable, asked junkLog
}

// New connects lazily to the Redis at url; nothing is sent before Run.
// queue bounds the messages waiting to be published.
func New(url string, queue int, h Handlers, log *slog.Logger, m *Metrics) (*Bus, error) {
	opts, err := redis.ParseURL(url)
	if err != nil {
		return nil, fmt.Errorf("BUZZ_REDIS_URL: %w", err)
	}
	// A retried pipeline could publish a message twice; a failed batch is
	// dropped instead (at most once, like any live delivery).
	opts.MaxRetries = -1
	opts.DialTimeout = publishTimeout
	// Every call carries its own deadline (presence and the rate limiter
	// 500 ms); without this the client ignores it and a stalled Redis
	// holds each call for the client's socket read timeout (5 s) instead.
	opts.ContextTimeoutEnabled = true
	// The library writes a plain-text line to stderr for every dial it gives
	// up on, several a second while Redis is down, outside the JSON log;
	// the bus says once itself that Redis is lost and once that it is back.
	// The library's lines go to the debug level.
	redis.SetLogger(libraryLog{log})
	var id [8]byte
	_, _ = rand.Read(id[:])
	origin := hex.EncodeToString(id[:])
	// Named, so CLIENT LIST tells each relay process's connections (at
	// most the client's pool, 10 per processor, plus the subscription)
	// from the other clients of the Redis, unless the URL names them. Best
	// effort: a Redis user denied CLIENT (an ACL with -client, a renamed
	// command) must still connect, and the library fails a connection
	// whose ClientName it cannot set.
	if opts.ClientName == "" {
		name := "buzz-relay-" + origin
		opts.OnConnect = func(ctx context.Context, cn *redis.Conn) error {
			_ = cn.ClientSetName(ctx, name).Err()
			return nil
		}
	}
	return &Bus{
		client:   redis.NewClient(opts),
		origin:   origin,
		handlers: h,
		log:      log,
		metrics:  m,
		queue:    make(chan outgoing, queue),
		unsent:   map[uuid.UUID]struct{}{},
		wake:     make(chan struct{}, 1),
		start:    time.Now(),
		stall:    stallAfter,
	}, nil
}

// libraryLog takes the Redis client library's own log lines, at debug.
type libraryLog struct{ log *slog.Logger }

func (l libraryLog) Printf(ctx context.Context, format string, v ...any) {
	l.log.DebugContext(ctx, fmt.Sprintf(format, v...), "component", "go-redis")
}

// Connected reports whether the bus is subscribed to the other processes.
func (b *Bus) Connected() bool { return b.connected.Load() }

// Hears reports whether the bus is subscribed and has proof, at most
// hearingWindow old, that it read everything the other processes
// published: what must not outlive an unheard invalidation (cached access
// answers) or wait on a stalled Redis (the shared limiter, presence) asks
// this, not Connected. A stalled Redis is noticed here within about
// hearingWindow, where dropping the subscription takes stallAfter.
func (b *Bus) Hears() bool {
	return b.connected.Load() && b.sinceStart()-b.heardUpTo.Load() <= int64(hearingWindow)
}

// CatchingUp reports whether a gap in what this process heard is not
// caught up yet: from a failed subscription until the catch-up on the
// next one returned.
func (b *Bus) CatchingUp() bool { return b.catchingUp.Load() || b.peerReplays.Load() > 0 }

// Kill makes the bus publish nothing more, not even its goodbye, as if
// its process were killed: the other processes must notice the silence.
// It exists for tests of that recovery.
func (b *Bus) Kill() { b.killed.Store(true) }

// FailNextPublish makes the next publish of events fail as if Redis had
// refused it, while the process goes on announcing itself. It exists for
// tests of that recovery.
func (b *Bus) FailNextPublish() { b.failNextPublish.Store(true) }

// sinceStart is the bus's monotonic clock.
func (b *Bus) sinceStart() int64 { return int64(time.Since(b.start)) }

// Run publishes and subscribes until ctx ends, then closes the client.
func (b *Bus) Run(ctx context.Context) {
	b.gapMu.Lock()
	b.gapSince, b.gapOpen, b.gapAtStart = b.start, true, true
	b.catchingUp.Store(true)
	b.gapMu.Unlock()
	done := make(chan struct{})
	go func() { b.send(ctx); close(done) }()
	b.subscribe(ctx)
	<-done
	_ = b.client.Close()
}

// PublishEvent queues ev (of channel, nil: community-global, written under
// the channel's readersVersion, 0: unknown) for the other processes. It
// never blocks: with the queue full the event is dropped and counted; local
// subscribers have it already.
func (b *Bus) PublishEvent(community uuid.UUID, ev *nostr.Event, channel *uuid.UUID, readersVersion int64) {
	b.enqueue(community, message{Origin: b.origin, Event: ev.AppendJSON(nil), Channel: channel, ReadersVersion: readersVersion})
}

// PublishInvalidation tells the other processes that who may read what in
// community changed.
func (b *Bus) PublishInvalidation(community uuid.UUID) {
	if !b.enqueue(community, message{Origin: b.origin}) {
		b.keepUnsent(community, true)
	}
}

// enqueue queues m for community's channel; false when the queue is full.
func (b *Bus) enqueue(community uuid.UUID, m message) bool {
	payload, err := json.Marshal(m)
	if err != nil {
		b.metrics.Dropped.WithLabelValues("encode").Inc()
		return true
	}
	out := outgoing{channel: ChannelName(community), payload: payload}
	if m.Event == nil {
		out.invalidates = &community
	} else {
		out.queuedAt = time.Now()
	}
	if b.stopped.Load() {
		if m.Event != nil {
			b.droppedAfterGoodbye()
		}
		return true
	}
	b.metrics.Pending.Inc() // before the sender can take it, so the gauge never dips below 0
	select {
	case b.queue <- out:
		if b.stopped.Load() {
			// The goodbye was said between the check above and the send,
			// and the sender's last drain may have missed this one.
			b.dropQueuedAfterGoodbye()
		}
		return true
	default:
		b.metrics.Pending.Dec()
		if m.Event != nil {
			b.metrics.Dropped.WithLabelValues("queue_full").Inc()
			b.noteUnpublished(out.queuedAt)
		}
		return false
	}
}

// dropQueuedAfterGoodbye empties the queue once the goodbye is said:
// nobody reads it any more.
func (b *Bus) dropQueuedAfterGoodbye() {
	for {
		select {
		case m := <-b.queue:
			b.metrics.Pending.Dec()
			if m.invalidates == nil {
				b.droppedAfterGoodbye()
			}
		default:
			return
		}
	}
}

// droppedAfterGoodbye counts an event queued after the goodbye: the
// others, told that everything before it was published, replay nothing
// for it, so it reaches no other process live.
func (b *Bus) droppedAfterGoodbye() {
	b.metrics.Dropped.WithLabelValues("after_goodbye").Inc()
	b.lateWarning.Do(func() {
		b.log.Warn("redis: an event was committed after this relay said goodbye to the others; their subscribers miss it live (a REQ returns it)")
	})
}

// noteUnpublished records that an event queued at queuedAt was not
// published, unless an older one is recorded already.
func (b *Bus) noteUnpublished(queuedAt time.Time) {
	at := queuedAt.UnixNano()
	for {
		old := b.unpublishedSince.Load()
		if old != 0 && old <= at {
			return
		}
		if b.unpublishedSince.CompareAndSwap(old, at) {
			return
		}
	}
}

// noteUnpublishedEvents records the events of a batch that failed.
func (b *Bus) noteUnpublishedEvents(batch []outgoing) {
	for _, m := range batch {
		if !m.queuedAt.IsZero() {
			b.noteUnpublished(m.queuedAt)
		}
	}
}

// appendAnnouncement appends to batch this process's announcement (its
// id, then goodbyeWord when it stops) and, before it, the report of the
// events not published since the oldest queued at unpublished (Unix
// nanoseconds; 0: none): `<id> unpublished <time>`.
func (b *Bus) appendAnnouncement(batch []outgoing, goodbye bool, unpublished int64) []outgoing {
	if unpublished != 0 {
		report := strconv.AppendInt([]byte(b.origin+" "+unpublishedWord+" "), unpublished, 10)
		batch = append(batch, outgoing{channel: aliveChannel, payload: report, announces: true})
	}
	payload := b.origin
	if goodbye {
		payload += " " + goodbyeWord
	}
	return append(batch, outgoing{channel: aliveChannel, payload: []byte(payload), announces: true})
}

// keepUnsent remembers an invalidation for the sender's next batch, and
// starts the sender when wake is set (not after a failed publish: it would
// retry at once, again and again, while Redis is down; the next event
// carries it, ahead of itself).
func (b *Bus) keepUnsent(community uuid.UUID, wake bool) {
	b.unsentMu.Lock()
	b.unsent[community] = struct{}{}
	b.unsentMu.Unlock()
	if !wake {
		return
	}
	select {
	case b.wake <- struct{}{}:
	default:
	}
}

// takeUnsent returns the invalidations kept for sending again, to go
// ahead of batch. Called after batch was taken from the queue, so every
// event queued after an invalidation was kept follows it.
func (b *Bus) takeUnsent(batch []outgoing) []outgoing {
	b.unsentMu.Lock()
	defer b.unsentMu.Unlock()
	if len(b.unsent) == 0 {
		return batch
	}
	payload, _ := json.Marshal(message{Origin: b.origin})
	first := make([]outgoing, 0, len(b.unsent)+len(batch))
	for community := range b.unsent {
		first = append(first, outgoing{channel: ChannelName(community), payload: payload, invalidates: &community})
		b.metrics.Pending.Inc() // counted down with the batch
	}
	clear(b.unsent)
	return append(first, batch...)
}

// send publishes the queue in order on one connection: a batch is one
// pipeline, so a process's messages reach Redis, and so every subscriber, in
// the order they were queued.
func (b *Bus) send(ctx context.Context) {
	batch := make([]outgoing, 0, maxBatch+1)
	failing := false
	// droppedWhileFailing counts the events dropped since the failure was
	// logged: the warning names only its own batch's.
	droppedWhileFailing := 0
	var reported time.Time // the last report published (reportEvery)
	alive := time.NewTicker(aliveInterval)
	defer alive.Stop()
	for {
		announce := false
		select {
		case <-ctx.Done():
			b.sayGoodbye()
			b.stopped.Store(true)
			b.dropQueuedAfterGoodbye() // queued while the goodbye was said
			return
		case m := <-b.queue:
			batch = append(batch[:0], m)
		case <-b.wake:
			batch = batch[:0]
		case <-alive.C:
			// Only while subscribed: during an outage nobody hears it, and
			// each try would dial Redis.
			batch, announce = batch[:0], b.connected.Load()
		}
	fill:
		for len(batch) < maxBatch {
			select {
			case m := <-b.queue:
				batch = append(batch, m)
			default:
				break fill
			}
		}
		batch = b.takeUnsent(batch)
		queued := len(batch)
		if queued == 0 && !announce {
			continue
		}
		if b.killed.Load() {
			b.metrics.Pending.Sub(float64(queued))
			continue
		}
		var unpublished int64
		if announce {
			// Last: heard, it proves the batch before it was published,
			// and the report before it tells since when what failed was
			// not.
			if b.clock.Now().Sub(reported) >= reportEvery {
				unpublished = b.unpublishedSince.Swap(0)
			}
			batch = b.appendAnnouncement(batch, false, unpublished)
		}
		err := b.publish(ctx, batch)
		b.metrics.Pending.Sub(float64(queued))
		if err != nil {
			b.noteUnpublishedEvents(batch)
			if unpublished != 0 {
				b.noteUnpublished(time.Unix(0, unpublished)) // told nobody: the next announcement tells
			}
			kept := 0
			for _, m := range batch {
				if m.invalidates != nil {
					b.keepUnsent(*m.invalidates, false)
					kept++
				}
			}
			if queued == 0 {
				continue // only an announcement: nothing to report
			}
			b.metrics.Dropped.WithLabelValues("redis_error").Add(float64(queued))
			// The kept invalidations go out with the next batch: counted,
			// each failed try of one would add to the events dropped.
			droppedWhileFailing += queued - kept
			if !failing && ctx.Err() == nil {
				b.log.Warn("redis: publishing to the other relays failed; the next announcement asks them to replay these events from the database", "err", err, "dropped", queued-kept)
			}
			failing = true
			continue
		}
		if failing {
			b.log.Info("redis: publishing to the other relays again", "dropped_while_failing", droppedWhileFailing)
			failing, droppedWhileFailing = false, 0
		}
		if unpublished != 0 {
			reported = b.clock.Now()
			if suppressed, ok := b.asked.allow(reported); ok {
				b.log.Info("redis: asked the other relays to replay the events this relay could not publish", "since", time.Unix(0, unpublished),
					"asked_without_logging", suppressed)
			}
		}
		b.metrics.Published.Add(float64(queued))
	}
}

// publish sends batch as one pipeline, in order, within the publish
// timeout. A batch carrying events fails without reaching Redis after
// FailNextPublish.
func (b *Bus) publish(ctx context.Context, batch []outgoing) error {
	if b.failNextPublish.Load() {
		for _, m := range batch {
			if !m.queuedAt.IsZero() && b.failNextPublish.CompareAndSwap(true, false) {
				return errors.New("publish failed on purpose (FailNextPublish)")
			}
		}
	}
	pctx, cancel := context.WithTimeout(ctx, publishTimeout)
	defer cancel()
	pipe := b.client.Pipeline()
	for _, m := range batch {
		pipe.Publish(pctx, m.channel, m.payload)
	}
	_, err := pipe.Exec(pctx)
	return err
}

// sayGoodbye tells the other processes that this one stops on purpose, so
// its silence is not taken for a death: first what is still queued, then
// the goodbye, in one batch, for at most the publish timeout. Like an
// announcement, the goodbye tells since when events were not published, so
// the others replay them before forgetting this process.
func (b *Bus) sayGoodbye() {
	if b.killed.Load() {
		return
	}
	var batch []outgoing
	for more := true; more; {
		select {
		case m := <-b.queue:
			batch = append(batch, m)
		default:
			more = false
		}
	}
	queued := len(batch)
	batch = b.appendAnnouncement(batch, true, b.unpublishedSince.Swap(0))
	err := b.publish(context.Background(), batch)
	b.metrics.Pending.Sub(float64(queued))
	if err != nil {
		b.metrics.Dropped.WithLabelValues("redis_error").Add(float64(queued))
		return
	}
	b.metrics.Published.Add(float64(queued))
}

// subscribe keeps one pattern subscription to every community channel,
// resubscribing with backoff after a failure.
func (b *Bus) subscribe(ctx context.Context) {
	backoff := minBackoff
	for ctx.Err() == nil {
		ps := b.client.PSubscribe(ctx, subscribePattern, controlPattern, aliveChannel)
		cctx, cancel := context.WithTimeout(ctx, publishTimeout)
		var err error
		for range 3 { // the three subscriptions' confirmations
			if _, err = ps.Receive(cctx); err != nil {
				break
			}
		}
		cancel()
		if err == nil {
			backoff = minBackoff
			// Resync first: what trusts this process's caches while
			// Connected holds (the access cache) must not trust an answer
			// from before the outage in between.
			if b.handlers.Resync != nil {
				b.handlers.Resync()
			}
			if p := b.presence.Load(); p != nil && b.redisRestarted(ctx) {
				p.redisLost()
			}
			b.metrics.Peers.Set(0) // this subscription hears them anew
			b.setConnected(true, nil)
			err = b.receive(ctx, ps)
		}
		_ = ps.Close()
		if ctx.Err() != nil {
			break
		}
		b.setConnected(false, err)
		select {
		case <-ctx.Done():
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, maxBackoff)
	}
	b.setConnected(false, nil)
}

// redisRestarted reports whether Redis is not the one the last
// subscription was to, by its run_id (new at every start): a Redis
// restarted empty lost the presence written to it, while one that only
// dropped the subscription (a network blip, a client killed) kept it, and
// writing the whole store back to it cost Redis 2.7 s of CPU at 100,000
// announcements, for every resubscription. Unknown counts as restarted.
func (b *Bus) redisRestarted(ctx context.Context) bool {
	ictx, cancel := context.WithTimeout(ctx, publishTimeout)
	defer cancel()
	info, err := b.client.Info(ictx, "server").Result()
	runID := ""
	for line := range strings.Lines(info) {
		if id, ok := strings.CutPrefix(strings.TrimSpace(line), "run_id:"); ok {
			runID = id
		}
	}
	if err != nil || runID == "" {
		b.redisRunID = ""
		return true
	}
	restarted := runID != b.redisRunID
	b.redisRunID = runID
	return restarted
}

func (b *Bus) setConnected(up bool, err error) {
	was := b.connected.Swap(up)
	if up {
		b.metrics.Connected.Set(1)
	} else {
		b.metrics.Connected.Set(0)
	}
	switch {
	case up && !was:
		b.log.Info("redis: subscribed to the other relays' live traffic")
	case !up && was && err != nil:
		b.log.Warn("redis: lost the other relays' live traffic; serving local subscribers only, resubscribing", "err", err)
	}
}

// inbound is a remote event read from Redis, waiting for the fan-out.
type inbound struct {
	community uuid.UUID
	event     *nostr.Event
	channel   *uuid.UUID
	version   int64 // the channel's readers version its write read
	weight    int64 // its share of receiveAheadBytes
	// replaySince, when set, is not an event but a replay from the
	// database from then (replayPeers): of dead peers' events from their
	// last announcement, or of the events a peer reported unpublished.
	replaySince time.Time
	replayOf    *replayOf
}

// receive hands messages to the handlers until the subscription fails.
// The subscription is pinged every proofInterval (prove), and each pong
// (which Redis sends in order with the messages) moves heardUpTo to its
// ping's sending: Hears trusts the bus only while that proof is recent. A
// subscription without a pong for stallAfter has failed: a stalled Redis
// (stopped, or cut off without a reset) takes the pings into its socket
// buffer without a word, and the subscription would otherwise count as
// connected for good.
//
// Events go to the fan-out on a goroutine of their own, in the order
// read; invalidations and closings are handled as soon as they are read,
// ahead of the events still waiting for the fan-out. A fan-out that fell
// behind (a large audience, a burst) would otherwise hold back another
// process's removal of a member, and this process would go on delivering
// the channel to that member from its cached answer, its own publishes
// included, for as long as it lagged. Applied early, an invalidation
// costs only the events committed before it, which are then authorized
// against the answer after it.
func (b *Bus) receive(ctx context.Context, ps *redis.PubSub) (err error) {
	ahead := make(chan inbound, receiveAhead)
	room := semaphore.NewWeighted(receiveAheadBytes)
	delivered := make(chan struct{})
	subscribedAt := time.Now()
	// Taken before anything is read: a failure of this subscription opens
	// a gap of its own, from what this one heard.
	gapSince, atStart, catchUp := b.takeGap()
	go func() {
		defer close(delivered)
		if catchUp {
			b.catchUp(ctx, gapSince, subscribedAt, atStart)
		}
		for in := range ahead {
			if !in.replaySince.IsZero() {
				b.replayPeers(ctx, in.replaySince, in.replayOf)
				continue
			}
			// On shutdown what is still queued is dropped: the connections
			// it was for are closing, and each delivery may look up a
			// channel's readers (up to 2 s on a database that hangs), which
			// for a full queue would hold the shutdown for minutes.
			if b.handlers.Deliver != nil && ctx.Err() == nil {
				b.handlers.Deliver(in.community, in.event, in.channel, in.version)
			}
			room.Release(in.weight)
		}
	}()
	// What was read before a failure is still delivered, before the next
	// subscription (and its resync) begins. The bus counts as cut off
	// from then on, not once the fan-out caught up: invalidations are no
	// longer heard, and a cached access answer must not be trusted while
	// a lagging fan-out drains (this process's own publishes use it too).
	defer func() {
		if ctx.Err() != nil {
			b.setConnected(false, nil)
		} else {
			b.setConnected(false, err)
			// Before the drain: the hub keeps what it publishes meanwhile
			// for the catch-up (CatchingUp).
			b.openGap()
		}
		close(ahead)
		<-delivered
	}()
	// The subscription was confirmed just now: what was published before
	// it is not this subscription's to hear (the resync covers it).
	b.heardUpTo.Store(b.sinceStart())
	b.readerResumed.Store(b.sinceStart())
	proving, stopProving := context.WithCancel(ctx)
	stalled := make(chan error, 1)
	go b.prove(proving, ps, stalled)
	defer stopProving()
	// The peers heard on this subscription: each one's silence counts from
	// here. Those heard before it are forgotten, as is their silence
	// during the outage: the gap's catch-up replays what they committed.
	peers := newPeers(subscribedAt)
	// What this subscription's catch-up replays: a peer's events reported
	// unpublished within it need no replay of their own.
	var caughtUp span
	if catchUp {
		caughtUp = span{from: gapSince, until: subscribedAt}
	}
	for {
		// No read deadline: one that fell inside a large message would
		// leave the connection in the middle of it. The prover closes the
		// subscription when Redis stops answering, or when ctx ends.
		msg, err := ps.Receive(ctx)
		if err != nil {
			select {
			case stall := <-stalled:
				return stall
			default:
				return err
			}
		}
		switch m := msg.(type) {
		case *redis.Pong:
			if sent, err := strconv.ParseInt(m.Payload, 10, 64); err == nil && sent > b.heardUpTo.Load() {
				b.heardUpTo.Store(sent)
			}
			// Every pong (proofInterval): often enough, and not per event.
			if err := b.noticeDeadPeers(ctx, peers, room, ahead); err != nil {
				return err
			}
		case *redis.Message:
			if m.Channel == aliveChannel {
				unpublished := peers.heard(m.Payload, b.origin, time.Now())
				b.metrics.Peers.Set(float64(len(peers.lastHeard)))
				if unpublished.IsZero() {
					continue
				}
				unpublished = b.withinReach(unpublished, caughtUp)
				if b.reportUnpublished(unpublished) {
					// A report heard before this replay starts joins it
					// (reportedSince).
					if err := b.queueReplay(ctx, room, ahead, unpublished, &unpublishedReplay); err != nil {
						b.reportedSince.Store(0)
						return err
					}
				}
				continue
			}
			in, ok := b.handle(m)
			if !ok {
				continue
			}
			in.weight = min(int64(len(m.Payload)), receiveAheadBytes)
			if err := b.handOn(ctx, room, ahead, in); err != nil {
				return err
			}
		}
	}
}

// noticeDeadPeers queues for the fan-out, in order with the events, one
// replay for the peers that went silent, if any.
func (b *Bus) noticeDeadPeers(ctx context.Context, peers *peers, room *semaphore.Weighted, ahead chan<- inbound) error {
	since, dead := peers.dead(time.Now(), b.Hears())
	if dead == 0 {
		return nil
	}
	b.metrics.PeerDeaths.Add(float64(dead))
	b.metrics.Peers.Set(float64(len(peers.lastHeard)))
	b.log.Warn("redis: other relay processes went silent without a goodbye; replaying what they committed since their last sign of life",
		"dead", dead, "since", since)
	return b.queueReplay(ctx, room, ahead, since, &peersReplay)
}

// reportUnpublished records a peer's report of events unpublished since
// then for the replay queued and not started yet, if any; it reports
// whether a replay must be queued for it. One replay covers every report
// heard before it starts (it reads up to when it runs), so a peer that
// reports again and again, in a burst or by a bug, costs one replay at a
// time rather than a queue of them.
func (b *Bus) reportUnpublished(since time.Time) (queue bool) {
	at := since.UnixNano()
	for {
		old := b.reportedSince.Load()
		if old != 0 && old <= at {
			return false
		}
		if b.reportedSince.CompareAndSwap(old, at) {
			return old == 0
		}
	}
}

// span is a stretch of time.
type span struct{ from, until time.Time }

// withinReach is since, or the oldest time a replay of a peer's
// unpublished events may start from without sending again what this
// process delivered and no longer remembers. A peer whose publishes and
// announcements failed for that long was taken for dead meanwhile and
// replayed up to then; what it committed between that replay and the
// reach is not replayed, and that is logged, unless this subscription's
// own catch-up (caughtUp: after an outage that was everyone's) replayed it.
func (b *Bus) withinReach(since time.Time, caughtUp span) time.Time {
	oldest := time.Now().Add(-unpublishedReach)
	if !since.Before(oldest) {
		return since
	}
	missedFrom := since
	if !caughtUp.from.IsZero() && !since.Before(caughtUp.from) && since.Before(caughtUp.until) {
		missedFrom = caughtUp.until
	}
	if !missedFrom.Before(oldest) {
		return oldest
	}
	if suppressed, ok := b.unreachable.allow(time.Now()); ok {
		b.log.Warn("redis: another relay process reports events unpublished for longer than can be replayed without duplicates; replaying only the newest (a REQ returns the others)",
			"unpublished_since", since, "replayed_since", oldest, "skipped_without_warning", suppressed)
	}
	return oldest
}

// queueReplay queues for the fan-out, in order with the events read
// before and after it, a replay from the database from since; the hub
// keeps what it publishes until it is done (CatchingUp).
func (b *Bus) queueReplay(ctx context.Context, room *semaphore.Weighted, ahead chan<- inbound, since time.Time, of *replayOf) error {
	b.peerReplays.Add(1)
	if err := b.handOn(ctx, room, ahead, inbound{replaySince: since, replayOf: of}); err != nil {
		b.peerReplays.Add(-1)
		return err
	}
	return nil
}

// peers is what one subscription heard of the other processes'
// announcements (aliveChannel), read and changed by its reader alone.
type peers struct {
	lastHeard map[string]time.Time // by process id
	// heardAny is the last announcement heard, this process's own
	// included: silence counts against a peer only while it is recent.
	heardAny time.Time
}

func newPeers(subscribed time.Time) *peers {
	return &peers{lastHeard: map[string]time.Time{}, heardAny: subscribed}
}

// heard records a message on aliveChannel (Bus.appendAnnouncement): an
// announcement, a goodbye or a report, each a sign of life. A goodbye
// forgets the process: it stopped on purpose after publishing what it had.
// unpublished is when the oldest event a reporting process could not
// publish was queued (zero: none, or this process's own). What does not
// start with a process id is ignored.
func (p *peers) heard(payload, self string, now time.Time) (unpublished time.Time) {
	id, goodbye, since, ok := parseAnnouncement(payload)
	if !ok {
		return unpublished
	}
	p.heardAny = now
	if id == self {
		return unpublished
	}
	switch _, known := p.lastHeard[id]; {
	case goodbye:
		delete(p.lastHeard, id)
	case known || len(p.lastHeard) < mostPeers:
		p.lastHeard[id] = now
	}
	return since
}

// parseAnnouncement reads a message on aliveChannel: `<id>`, `<id> bye`
// or `<id> unpublished <Unix nanoseconds>`. Words it does not know after
// a process id leave a sign of life and nothing more, so that a later
// release may say more without its processes being taken for dead here.
func parseAnnouncement(payload string) (id string, goodbye bool, unpublished time.Time, ok bool) {
	id, rest, _ := strings.Cut(payload, " ")
	if !isProcessID(id) {
		return "", false, unpublished, false
	}
	word, arg, _ := strings.Cut(rest, " ")
	switch word {
	case goodbyeWord:
		goodbye = true
	case unpublishedWord:
		if n, err := strconv.ParseInt(arg, 10, 64); err == nil && n > 0 {
			unpublished = time.Unix(0, n)
		}
	}
	return id, goodbye, unpublished, true
}

// dead forgets the peers unheard for peerDeadAfter, if this process
// still hears (hearing, and an announcement heard within hearingFresh):
// since is the earliest last sign of life among them.
func (p *peers) dead(now time.Time, hearing bool) (since time.Time, dead int) {
	if !hearing || now.Sub(p.heardAny) > hearingFresh {
		return since, 0
	}
	for id, last := range p.lastHeard {
		if now.Sub(last) <= peerDeadAfter {
			continue
		}
		delete(p.lastHeard, id)
		if dead == 0 || last.Before(since) {
			since = last
		}
		dead++
	}
	return since, dead
}

// isProcessID reports whether id is a process's random id (New).
func isProcessID(id string) bool {
	if len(id) != 16 {
		return false
	}
	_, err := hex.DecodeString(id)
	return err == nil
}

// replayPeers replays from the database what other processes may have
// committed and not published: from since (a dead peer's last sign of
// life, or when a live one queued the oldest event it could not publish)
// to now, each widened by the catch-up's margins. What this process heard
// of it is not sent twice (the hub remembers it).
func (b *Bus) replayPeers(ctx context.Context, since time.Time, of *replayOf) {
	defer b.peerReplays.Add(-1)
	if of == &unpublishedReplay {
		since = time.Unix(0, b.reportedSince.Swap(0))
	}
	if ctx.Err() == nil {
		b.replay(ctx, since, time.Now(), *of, false)
	}
}

// openGap records that the subscription failed: what the others published
// after the last proof of hearing may be lost, and the next subscription
// catches up on it. A gap not taken yet began earlier and covers this one.
func (b *Bus) openGap() {
	b.gapMu.Lock()
	defer b.gapMu.Unlock()
	if !b.gapOpen {
		b.gapSince, b.gapOpen, b.gapAtStart = b.start.Add(time.Duration(b.heardUpTo.Load())), true, false
	}
	b.catchingUp.Store(true)
}

// takeGap hands the open gap, if any, to a new subscription's catch-up;
// atStart: the gap is the time before the first subscription.
func (b *Bus) takeGap() (since time.Time, atStart, open bool) {
	b.gapMu.Lock()
	defer b.gapMu.Unlock()
	since, atStart, open = b.gapSince, b.gapAtStart, b.gapOpen
	b.gapOpen = false
	return since, atStart, open
}

// catchUp replays the gap from since to until, the new subscription,
// from the database (CatchUp), once: a catch-up that fails is logged and
// counted, not retried. CatchingUp holds on after it if the subscription
// failed meanwhile. The gap before the first subscription is logged and
// counted only when it replayed something or failed: an ordinary start
// has nobody subscribed yet.
func (b *Bus) catchUp(ctx context.Context, since, until time.Time, atStart bool) {
	defer func() {
		b.gapMu.Lock()
		defer b.gapMu.Unlock()
		if !b.gapOpen {
			b.catchingUp.Store(false)
		}
	}()
	b.replay(ctx, since, until, gapReplay, atStart)
}

// replayOf names one kind of replay in the metrics and the log.
type replayOf struct {
	outcomePrefix string // of buzz_redis_gaps_total's outcome
	failed, done  string
}

var (
	gapReplay = replayOf{
		failed: "redis: could not replay the events committed elsewhere while unsubscribed; subscribers here missed them live (a REQ since then returns them)",
		done:   "redis: replayed the events committed while unsubscribed",
	}
	peersReplay = replayOf{
		outcomePrefix: "peer_",
		failed:        "redis: could not replay what a dead relay process committed; subscribers here missed it live (a REQ since then returns it)",
		done:          "redis: replayed what dead relay processes committed since their last sign of life",
	}
	unpublishedReplay = replayOf{
		outcomePrefix: "unpublished_",
		failed:        "redis: could not replay the events another relay process failed to publish; subscribers here missed them live (a REQ since then returns them)",
		done:          "redis: replayed the events another relay process failed to publish",
	}
)

// replay hands on from the database (CatchUp) the events received from
// since to until, and counts and logs it as of says; quietWhenEmpty
// leaves out one that found nothing and did not fail.
func (b *Bus) replay(ctx context.Context, since, until time.Time, of replayOf, quietWhenEmpty bool) {
	if b.handlers.CatchUp == nil {
		return
	}
	start := time.Now()
	replayed, err := b.handlers.CatchUp(ctx, since, until)
	b.metrics.Replayed.Add(float64(replayed))
	if err != nil {
		if ctx.Err() == nil {
			b.metrics.Gaps.WithLabelValues(of.outcomePrefix + "failed").Inc()
			b.log.Warn(of.failed, "since", since, "replayed", replayed, "err", err)
		}
		return
	}
	if quietWhenEmpty && replayed == 0 {
		return
	}
	b.metrics.Gaps.WithLabelValues(of.outcomePrefix + "replayed").Inc()
	b.log.Info(of.done, "since", since, "replayed", replayed, "took", time.Since(start).Round(time.Millisecond))
}

// handOn queues in for the fan-out, waiting for room in the queue (its
// count and its bytes) if the fan-out lags.
func (b *Bus) handOn(ctx context.Context, room *semaphore.Weighted, ahead chan<- inbound, in inbound) error {
	b.waitingForRoom.Store(true)
	defer func() {
		b.readerResumed.Store(b.sinceStart())
		b.waitingForRoom.Store(false)
	}()
	if err := room.Acquire(ctx, in.weight); err != nil {
		return err
	}
	select {
	case ahead <- in:
		return nil
	case <-ctx.Done():
		room.Release(in.weight)
		return ctx.Err()
	}
}

// prove pings ps every proofInterval until ctx ends, then closes it. Each
// ping carries its sending time, which its pong, read by receive in order
// with the messages, makes heardUpTo. Without a pong for b.stall while the
// reader waited on the socket, it reports the stall and closes ps, which
// ends the reader's Receive. Time the reader spent waiting for the
// fan-out's room does not count: pongs unread behind a backlog are no sign
// of a stall (Hears is false meanwhile all the same).
func (b *Bus) prove(ctx context.Context, ps *redis.PubSub, stalled chan<- error) {
	defer ps.Close()
	tick := time.NewTicker(proofInterval)
	defer tick.Stop()
	for {
		now := b.sinceStart()
		quiet := now - max(b.heardUpTo.Load(), b.readerResumed.Load())
		if !b.waitingForRoom.Load() && quiet > int64(b.stall) {
			stalled <- fmt.Errorf("no answer from redis for %s", b.stall)
			return
		}
		pctx, cancel := context.WithTimeout(ctx, publishTimeout)
		err := ps.Ping(pctx, strconv.FormatInt(now, 10))
		cancel()
		if err != nil && ctx.Err() == nil {
			stalled <- fmt.Errorf("pinging redis: %w", err)
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

// handle handles a control message or an invalidation at once; an event
// it returns, for the fan-out, with ok set.
func (b *Bus) handle(m *redis.Message) (in inbound, ok bool) {
	if community, ok := communityOf(m.Channel, controlSuffix); ok {
		var op control
		if err := json.Unmarshal([]byte(m.Payload), &op); err != nil || op.Op != "DisconnectCommunity" {
			if err == nil {
				err = errors.New("unknown op")
			}
			b.skipJunk("redis: unknown connection control message", m, err)
			return in, false
		}
		if b.handlers.CloseCommunity != nil {
			b.handlers.CloseCommunity(community)
		}
		return in, false
	}
	community, ok := communityOf(m.Channel, channelSuffix)
	if !ok {
		return in, false
	}
	var msg message
	if err := json.Unmarshal([]byte(m.Payload), &msg); err != nil {
		b.skipJunk("redis: undecodable message", m, err)
		return in, false
	}
	if msg.Origin == b.origin {
		return in, false // delivered locally when it was committed
	}
	b.metrics.Received.Inc()
	if msg.Event == nil {
		if b.handlers.Invalidate != nil {
			b.handlers.Invalidate(community)
		}
		return in, false
	}
	var ev nostr.Event
	if err := json.Unmarshal(msg.Event, &ev); err != nil {
		b.skipJunk("redis: undecodable event", m, err)
		return in, false
	}
	return inbound{community: community, event: &ev, channel: msg.Channel, version: msg.ReadersVersion}, true
}

// junkLog lets one warning of a kind through per interval (junkLogEvery;
// tests shorten it) and counts the others: what a peer sends, by a bug or
// on purpose, may repeat in every message.
type junkLog struct {
	mu         sync.Mutex
	interval   time.Duration
	last       time.Time // the last warning
	suppressed int       // messages skipped since then without a warning
}

// skipJunk counts a message that was not understood, and warns about it
// unless a warning was logged within the interval: then the next warning
// says how many were skipped without one. It logs the payload's length
// and start, not the payload: whatever published it may send megabytes,
// once or many times.
func (b *Bus) skipJunk(warning string, m *redis.Message, err error) {
	b.metrics.Undecodable.Inc()
	suppressed, ok := b.junk.allow(time.Now())
	if !ok {
		return
	}
	b.log.Warn(warning, "channel", m.Channel, "bytes", len(m.Payload),
		"start", m.Payload[:min(len(m.Payload), loggedPayload)], "err", err,
		"skipped_without_warning", suppressed)
}

// allow reports whether a warning may be logged at now, and how many were
// not since the last one.
func (j *junkLog) allow(now time.Time) (suppressed int, ok bool) {
	j.mu.Lock()
	defer j.mu.Unlock()
	interval := j.interval
	if interval == 0 {
		interval = junkLogEvery
	}
	if !j.last.IsZero() && now.Sub(j.last) < interval {
		j.suppressed++
		return 0, false
	}
	suppressed = j.suppressed
	j.last, j.suppressed = now, 0
	return suppressed, true
}

func communityOf(channel, suffix string) (uuid.UUID, bool) {
	rest, ok := strings.CutPrefix(channel, channelPrefix)
	if !ok {
		return uuid.UUID{}, false
	}
	rest, ok = strings.CutSuffix(rest, suffix)
	if !ok {
		return uuid.UUID{}, false
	}
	id, err := uuid.Parse(rest)
	return id, err == nil
}
