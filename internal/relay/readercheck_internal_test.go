package relay

import (
	"context"
	"io"
	"log/slog"
	"net"
	"net/url"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/buzzrelay/buzz/internal/config"
	"github.com/buzzrelay/buzz/internal/dbtest"
	"github.com/buzzrelay/buzz/internal/replica"
)

// The reader watcher's check does not queue behind routed reads: with
// every reader connection taken (a burst of reads), a check through the
// routed pool would wait out its budget and report, and log, a healthy
// standby as unreachable.
// Mutation killed: checking through the routed pool (unreachable).
func TestReaderCheckDoesNotQueueBehindRoutedReads(t *testing.T) {
	t.Parallel()
	writer := dbtest.URL(t)
	pool := dbtest.PoolOn(t, writer, 0, func(c *pgxpool.Config) { replica.ArmFloor(c, replica.DefaultFloor) })
	cfg := config.Default()
	cfg.ReadDatabaseURL = dbtest.ReaderURL(t, writer)
	cfg.ReadPoolSize = 1
	srv := New(cfg, pool, slog.New(slog.NewTextHandler(io.Discard, nil)))
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	require.NoError(t, srv.StartReadReplica(ctx))
	r := srv.replica.Load()
	require.Eventually(t, func() bool { return *r.state.Load() == "streaming" }, 30*time.Second, 20*time.Millisecond)
	held, err := r.pool.Acquire(ctx) // every routed connection taken
	require.NoError(t, err)
	defer held.Release()
	require.Equal(t, "streaming", srv.checkReader(ctx, r))
}

// A standby whose token the ring still resolves, but to an entry older
// than replica.Staleness (it lags 40 s), proves no read: every read goes
// to the writer as stale, so /ready must not call it streaming.
// Mutation killed: judging the reader by Resolve alone (streaming).
func TestReaderCheckCallsAStandbyBehindStalenessUnproven(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	writer := dbtest.URL(t)
	readerURL := dbtest.ReaderURL(t, writer)
	check, err := pgxpool.New(ctx, readerURL)
	require.NoError(t, err)
	t.Cleanup(check.Close)
	var token int64
	var epoch uuid.UUID
	require.NoError(t, check.QueryRow(ctx, "SELECT token, epoch FROM replica_heartbeat").Scan(&token, &epoch))
	now := time.Now()
	ring := replica.NewRing()
	// The reader holds token; the probe wrote it 40 s ago and token+1 since.
	require.True(t, ring.Record(replica.Entry{Token: token, Epoch: epoch, CommittedAt: now.Add(-40 * time.Second)}))
	require.True(t, ring.Record(replica.Entry{Token: token + 1, Epoch: epoch, CommittedAt: now}))
	srv := &Server{cfg: config.Default(), now: func() time.Time { return now }}
	r := &readReplica{check: check, ring: ring, router: replica.NewRouter(nil, ring, replica.RouterOptions{})}
	require.Equal(t, "unproven", srv.checkReader(ctx, r))
}

// A standby that answers pg_is_in_recovery() but whose heartbeat proof
// does not answer within the check's budget is reported unreachable, and
// the router is told so: every routed read's proof would hang the same
// way, so each must go to the writer at once (writer/reader_unreachable)
// rather than spend its acquire budget while /ready already says the
// reader is unreachable. Here the writer holds an ACCESS EXCLUSIVE lock on
// replica_heartbeat; the standby replays it and every read of the table
// there waits.
// Mutation killed: not calling SetUnreachable when the proof times out
// (the read spends its budget: reader_acquire_timeout).
func TestReaderCheckWhoseProofHangsTellsTheRouter(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	writer := dbtest.URL(t)
	readerURL := dbtest.ReaderURL(t, writer)
	check := dbtest.PoolOn(t, readerURL, 1)
	routed := dbtest.PoolOn(t, readerURL, 1)
	var token int64
	var epoch uuid.UUID
	require.NoError(t, check.QueryRow(ctx, "SELECT token, epoch FROM replica_heartbeat").Scan(&token, &epoch))
	now := time.Now()
	ring := replica.NewRing()
	require.True(t, ring.Record(replica.Entry{Token: token, Epoch: epoch, CommittedAt: now}))

	w := dbtest.PoolOn(t, writer, 1)
	tx, err := w.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	_, err = tx.Exec(ctx, "LOCK replica_heartbeat IN ACCESS EXCLUSIVE MODE")
	require.NoError(t, err)
	require.Eventually(t, func() bool { // the standby replayed the lock
		var n int
		err := routed.QueryRow(ctx, `SELECT count(*) FROM pg_locks
			WHERE relation = 'replica_heartbeat'::regclass AND mode = 'AccessExclusiveLock'`).Scan(&n)
		return err == nil && n > 0
	}, 30*time.Second, 20*time.Millisecond)

	var reasons []string
	router := replica.NewRouter(routed, ring, replica.RouterOptions{
		MaxAge: time.Hour, AcquireTimeout: 50 * time.Millisecond, Now: func() time.Time { return now },
		RequireStandby: true,
		Observe:        func(_, decision, reason string) { reasons = append(reasons, decision+"/"+reason) },
	})
	cfg := config.Default()
	cfg.ReplicaAcquireTimeout = 50 * time.Millisecond
	srv := &Server{cfg: cfg, now: func() time.Time { return now }}
	r := &readReplica{check: check, ring: ring, router: router}
	require.Equal(t, "unreachable", srv.checkReader(ctx, r))
	require.Nil(t, router.Begin(ctx, "p", replica.Bounded()))
	require.Equal(t, []string{"writer/" + replica.ReasonUnreachable}, reasons)
}

// switchProxy forwards each new TCP connection to its current target;
// connections already forwarded stay where they went (a DNS name or
// virtual IP moved to another server).
type switchProxy struct {
	l      net.Listener
	target atomic.Pointer[string]
}

func newSwitchProxy(t *testing.T, target string) *switchProxy {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	p := &switchProxy{l: l}
	p.target.Store(&target)
	t.Cleanup(func() { l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			up, err := net.Dial("tcp", *p.target.Load())
			if err != nil {
				c.Close()
				continue
			}
			go func() { _, _ = io.Copy(up, c); up.Close() }()
			go func() { _, _ = io.Copy(c, up); c.Close() }()
		}
	}()
	return p
}

// A reader URL that named a server not in recovery (a standby since
// promoted, or the writer) and now names a standby (the name moved to a
// new standby after a failover) is found to be a standby again: the check
// does not keep asking the old server over its pooled connection, which
// would keep every read off the reader until that connection's lifetime
// (an hour) ran out.
// Mutations killed: keeping the check's connection after a not_a_standby
// answer (not_a_standby forever); not resetting the routed pool (its
// pooled connection still reaches the old server).
func TestReaderCheckFindsTheStandbyAReaderURLMovedTo(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	writer := dbtest.URL(t)
	readerURL, err := url.Parse(dbtest.ReaderURL(t, writer))
	require.NoError(t, err)
	writerURL, err := url.Parse(writer)
	require.NoError(t, err)
	p := newSwitchProxy(t, writerURL.Host) // the name first names the writer
	standbyHost := readerURL.Host
	readerURL.Host = p.l.Addr().String()
	check := dbtest.PoolOn(t, readerURL.String(), 1)
	routed := dbtest.PoolOn(t, readerURL.String(), 1)
	ring := replica.NewRing()
	cfg := config.Default()
	srv := &Server{cfg: cfg, now: time.Now}
	r := &readReplica{pool: routed, check: check, ring: ring, router: replica.NewRouter(routed, ring, replica.RouterOptions{RequireStandby: true})}
	var inRecovery bool
	require.NoError(t, routed.QueryRow(ctx, "SELECT pg_is_in_recovery()").Scan(&inRecovery)) // a routed connection, pooled
	require.False(t, inRecovery)
	require.Equal(t, "not_a_standby", srv.checkReader(ctx, r))
	p.target.Store(&standbyHost)
	require.Equal(t, "closed", srv.checkReader(ctx, r), "a standby now (the ring is empty: closed)")
	require.NoError(t, routed.QueryRow(ctx, "SELECT pg_is_in_recovery()").Scan(&inRecovery))
	require.True(t, inRecovery, "a routed read would run on the server no longer a standby")
}
