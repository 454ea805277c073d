package relay

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/buzzrelay/buzz/internal/db"
	"github.com/buzzrelay/buzz/internal/ingest"
	"github.com/buzzrelay/buzz/internal/nostr"
	"github.com/buzzrelay/buzz/internal/replica"
)

// readReplica is this process's read routing: the lazy reader pool, the
// probe's token ring, and the router the event store asks.
type readReplica struct {
	pool   *pgxpool.Pool // routed reads
	check  *pgxpool.Pool // the watcher's one connection
	ring   *replica.Ring
	router *replica.Router
	// state is the watcher's latest check of the reader (/ready).
	state atomic.Pointer[string]
}

// StartReadReplica routes eligible reads to the standby at
// BUZZ_READ_DATABASE_URL (unset: a no-op, every read on the writer) and
// runs the heartbeat probe on the writer until ctx ends. The writer pool
// must have been armed with the created_at floor (replica.ArmFloor). A
// reader that is down does not stop start-up: reads fall back to the
// writer until it answers. Call it once, before serving.
func (s *Server) StartReadReplica(ctx context.Context) error {
	if s.cfg.ReadDatabaseURL == "" {
		return nil
	}
	size := s.cfg.ReadPoolSize
	if size == 0 {
		size = s.cfg.DBMaxConns
	}
	cfg, err := replica.ReaderPoolConfig(s.cfg.ReadDatabaseURL, size, s.cfg.ReplicaStatementTimeout, s.cfg.ReplicaIdleInTxTimeout)
	if err != nil {
		return fmt.Errorf("BUZZ_READ_DATABASE_URL: %w", err)
	}
	// Reader statements are timed by name like the writer's.
	timer := NewStatementTimer()
	timer.attach(func(name string, seconds float64) { s.metrics.DBQuery.WithLabelValues(name).Observe(seconds) })
	cfg.ConnConfig.Tracer = timer
	pool, err := pgxpool.NewWithConfig(ctx, cfg) // lazy: dials on the first routed read
	if err != nil {
		return fmt.Errorf("reader pool: %w", err)
	}
	// The watcher's checks have a connection of their own: queued behind
	// a burst of routed reads holding every reader connection, a check
	// would wait out its budget and call a healthy standby unreachable.
	checkCfg, err := replica.ReaderPoolConfig(s.cfg.ReadDatabaseURL, 1, s.cfg.ReplicaStatementTimeout, s.cfg.ReplicaIdleInTxTimeout)
	if err != nil {
		pool.Close()
		return fmt.Errorf("BUZZ_READ_DATABASE_URL: %w", err)
	}
	check, err := pgxpool.NewWithConfig(ctx, checkCfg)
	if err != nil {
		pool.Close()
		return fmt.Errorf("reader check pool: %w", err)
	}
	go func() { <-ctx.Done(); pool.Close(); check.Close() }()
	ring := replica.NewRing()
	r := &readReplica{pool: pool, check: check, ring: ring}
	unchecked := "closed" // until the first check answers: nothing routes before the probe's first token anyway
	r.state.Store(&unchecked)
	r.router = replica.NewRouter(pool, ring, replica.RouterOptions{
		MaxAge: s.cfg.ReplicaReadMaxAge, AcquireTimeout: s.cfg.ReplicaAcquireTimeout, Now: s.now, Log: s.log,
		StatementTimeout: s.cfg.ReplicaStatementTimeout,
		RequireStandby:   true, // the watcher tells (checkReader)
		Observe: func(path, decision, reason string) {
			s.metrics.RouteDecision.WithLabelValues(path, decision, reason).Inc()
		},
	})
	s.metrics.Registry.MustRegister(
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "buzz_db_replica_heartbeat_age_seconds",
			Help: "Age of the newest heartbeat token this process's probe committed (grows while the probe fails).",
		}, func() float64 {
			age, ok := ring.HeartbeatAge(s.now())
			if !ok {
				return 0
			}
			return age.Seconds()
		}),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "buzz_db_replica_wall_lag_seconds",
			Help: "How far the newest token's wall trails its commit: the created_at floor plus 5 s, more while an open writer transaction holds it back (covered reads newer than the wall go to the writer).",
		}, func() float64 {
			newest, ok := ring.Newest(s.now())
			if !ok {
				return 0
			}
			return newest.CommittedAt.Sub(newest.Wall).Seconds()
		}),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "buzz_db_read_pool_max", Help: "The reader pool's connection limit (BUZZ_DB_READ_POOL_SIZE).",
		}, func() float64 { return float64(pool.Config().MaxConns) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "buzz_db_read_pool_active", Help: "Reader connections in use by routed reads.",
		}, func() float64 { return float64(pool.Stat().AcquiredConns()) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "buzz_db_replica_fence_open",
			Help: "1 while the probe's tokens are fresh enough for any read to route to the replica, else 0.",
		}, func() float64 {
			if _, ok := ring.Newest(s.now()); ok {
				return 1
			}
			return 0
		}),
	)
	s.store.Router = r.router
	s.replica.Store(r)
	probeFailures := prometheus.NewCounter(prometheus.CounterOpts{
		Name: "buzz_db_replica_probe_failures_total",
		Help: "Heartbeat probe ticks that failed (each closes read routing until a tick succeeds); the log names the first, then reminds at most once a minute.",
	})
	s.metrics.Registry.MustRegister(probeFailures)
	probe := replica.NewProbe(s.pool, ring, s.cfg.CreatedAtFloor, s.cfg.ReplicaProbeInterval, s.now, s.log)
	probe.OnError = func(error) { probeFailures.Inc() }
	go probe.Run(ctx)
	go s.watchReader(ctx, r)
	return nil
}

// readerCheckInterval is how often the watcher checks the reader.
const readerCheckInterval = time.Second

// watchReader checks the reader every readerCheckInterval until ctx ends,
// keeps the latest state for /ready (which then answers without touching
// the reader: a frozen or blackholed standby would otherwise hold every
// readiness check for the whole check budget, past the usual readiness
// timeouts, and take every relay out of its load balancer), and logs each
// change, so a standby that goes away or comes back after start-up is in
// the log too.
func (s *Server) watchReader(ctx context.Context, r *readReplica) {
	previous, logged := "", ""
	for {
		state := s.checkReader(ctx, r)
		if ctx.Err() != nil {
			return
		}
		r.state.Store(&state)
		// A state is logged once two checks in a row found it: a relay's
		// start rotates the epoch, and the standby is unproven until it
		// replays that, usually well under a second; that is no news.
		// Nor is closed at start (the probe's first tokens take a moment).
		if state == previous && state != logged {
			if logged != "" || state != "closed" {
				s.logReaderState(state)
			}
			logged = state
		}
		previous = state
		select {
		case <-ctx.Done():
			return
		case <-time.After(readerCheckInterval):
		}
	}
}

func (s *Server) logReaderState(state string) {
	switch state {
	case "unreachable":
		s.log.Warn("read replica unreachable; reads go to the writer until it answers")
	case "not_a_standby":
		s.log.Warn("BUZZ_READ_DATABASE_URL names a server that is not a standby (pg_is_in_recovery() is false: the writer, or a promoted standby); reads stay on the writer")
	case "unproven":
		s.log.Warn("read replica proves no reads (another deployment's database, one without the migrations, another timeline, or far behind); reads go to the writer")
	case "closed":
		s.log.Warn("read replica routing closed: the probe's heartbeat tokens are stale; reads go to the writer")
	default:
		s.log.Info("read replica streaming; reads may route to it")
	}
}

// readerState is the reader's state as the watcher last saw it (see
// checkReader), for /ready; false when no reader is configured.
func (s *Server) readerState() (string, bool) {
	r := s.replica.Load()
	if r == nil {
		return "", false
	}
	return *r.state.Load(), true
}

// checkReader is what /ready reports about the reader: "streaming" (a
// standby answering that proves reads against the probe's tokens),
// "not_a_standby", "unreachable", "closed" (the probe's tokens are stale:
// every read goes to the writer), or "unproven" (a standby answering whose
// heartbeat proves nothing: a database of another deployment or without
// the migrations, another timeline, or more than replica.Staleness behind;
// every read goes to the writer, and buzz_db_route_decision tells which). The relay stays ready in every case: the writer answers
// every read.
func (s *Server) checkReader(ctx context.Context, r *readReplica) string {
	ctx, cancel := context.WithTimeout(ctx, s.cfg.ReplicaAcquireTimeout+time.Second)
	defer cancel()
	conn, err := r.check.Acquire(ctx)
	if err != nil {
		r.router.SetUnreachable()
		return "unreachable"
	}
	defer conn.Release()
	var inRecovery bool
	if err := conn.QueryRow(ctx, "SELECT pg_is_in_recovery()").Scan(&inRecovery); err != nil {
		r.router.SetUnreachable()
		return "unreachable"
	}
	r.router.SetStandby(inRecovery)
	if !inRecovery {
		// Keep no connection to a server not in recovery: the reader's
		// name may move to a new standby (a failover), and pooled
		// connections would keep asking the old server, this check for
		// the pool's connection lifetime (an hour) and routed reads, once
		// routing resumes, on a server that no longer replays. Each
		// check dials afresh until a standby answers.
		_ = conn.Conn().Close(ctx) // destroyed, not pooled, on release
		if r.pool != nil {
			r.pool.Reset()
		}
		return "not_a_standby"
	}
	if _, ok := r.ring.Newest(s.now()); !ok {
		return "closed"
	}
	// What a routed read's proof reads, outside a transaction: the token
	// this standby holds, resolved against the probe's ring.
	row, err := db.New(conn).ReplicaHeartbeatProve(ctx)
	if err != nil {
		if ctx.Err() != nil {
			// The proof a routed read runs did not answer in the check's
			// budget: each read's proof would wait out its own the same
			// way, so tell the router, as for a reader that did not answer.
			r.router.SetUnreachable()
			return "unreachable"
		}
		return "unproven"
	}
	proved, err := r.ring.Resolve(row.Token, row.Epoch)
	if err != nil || s.now().Sub(proved.CommittedAt) > replica.Staleness {
		// A token older than Staleness proves no read: every read, covered
		// or fresh, would go to the writer as stale.
		return "unproven"
	}
	return "streaming"
}

// noteRemoval tells the router of a committed event that hid or replaced
// stored rows in channel (a NIP-09 or NIP-29 deletion, a newer replaceable
// version), so that no read of that channel routes to a standby until it
// holds the change (replica.Router.Removed). Called before the event's
// author gets its OK, and, for another process's event, as its fan-out
// arrives (which bounds that process's readers no better than the fan-out's
// delay).
func (s *Server) noteRemoval(community uuid.UUID, ev *nostr.Event, channel *uuid.UUID) {
	switch {
	case ingest.IsChannelList(ev.Kind):
		// A channel's own list, named by the channel: its versions never
		// leave it.
		s.store.Router.Removed(community, channel)
	case nostr.IsReplaceable(ev.Kind) || nostr.IsAddressable(ev.Kind):
		// The version it replaced may lie in another channel.
		s.store.Router.Replaced(community, channel)
	case ev.Kind == nostr.KindDeletion || ev.Kind == ingest.KindDeleteEvent:
		s.store.Router.Removed(community, channel)
	}
}
