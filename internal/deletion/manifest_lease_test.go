package deletion_test

import (
	"context"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/buzzrelay/buzz/internal/dberr"
	"github.com/buzzrelay/buzz/internal/dbtest"
	"github.com/buzzrelay/buzz/internal/deletion"
	"github.com/buzzrelay/buzz/internal/media"
)

// statementPause is one stop of statementPauses: reached is closed once a
// session is held before the statement named name, which is sent once
// resume is closed; pid is that session's backend.
type statementPause struct {
	name            string
	pid             atomic.Uint32
	reached, resume chan struct{}
}

func pauseBefore(name string) *statementPause {
	return &statementPause{name: name, reached: make(chan struct{}), resume: make(chan struct{})}
}

// statementPauses is a pgx tracer holding its pool's statements in order:
// the first statement named as stops[0] is held at stops[0], the first one
// named as stops[1] after it at stops[1], and so on; the others pass.
type statementPauses struct {
	mu    sync.Mutex
	stops []*statementPause
}

func (s *statementPauses) TraceQueryStart(ctx context.Context, conn *pgx.Conn, data pgx.TraceQueryStartData) context.Context {
	s.mu.Lock()
	var stop *statementPause
	if len(s.stops) > 0 && strings.Contains(data.SQL, "-- name: "+s.stops[0].name+" ") {
		stop, s.stops = s.stops[0], s.stops[1:]
	}
	s.mu.Unlock()
	if stop != nil {
		stop.pid.Store(conn.PgConn().PID())
		close(stop.reached)
		<-stop.resume
	}
	return ctx
}

func (s *statementPauses) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// pausedPool is a pool on f's database whose statements stop at stops.
func (f *fixture) pausedPool(stops ...*statementPause) *pgxpool.Pool {
	f.t.Helper()
	tracer := &statementPauses{stops: stops}
	return dbtest.PoolOn(f.t, f.pool.Config().ConnString(), 4, func(c *pgxpool.Config) { c.ConnConfig.Tracer = tracer })
}

// waitFor waits for ch to close, failing the test if what never happens.
func waitFor(t *testing.T, ch <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(time.Minute):
		t.Fatalf("%s never happened", what)
	}
}

// An executor frozen (a suspended VM, a long pause) inside a manifest
// chunk's transaction, after its lease check and before its insert, past
// its lease, writes no chunk among its heir's. The lease check holds the
// request row to the end of the transaction that made it, so the heir
// waits for that transaction, then claims the request and clears what it
// wrote; the frozen executor's next check finds the lease lost. The check
// held nothing before: the heir claimed the request and cleared the chunks
// while the frozen transaction stood open, the frozen executor's chunk 0
// then landed among the heir's (the chunk guard checks only the stage),
// and the heir's own chunk 0 failed on it, so the heir did not finish.
// Real executors on their own sessions, each held before a named
// statement. The frozen executor's heartbeat is frozen with it (a lease
// of an hour renews nothing here); its lease is ended by hand, as the
// pause would have ended it.
// Mutation killed: community_deletion_requests_verify_lease without FOR
// SHARE OF q (migration 071's down body): the heir ends at fenced, its
// chunk 0 refused (23505) for the frozen executor's.
func TestFrozenExecutorWritesNoManifestChunkAfterItsHeirTookOver(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	const host = "frozen-manifest.test"
	c := f.community(host)
	dir := memoryDir(t)
	writeUploadRecords(t, dir, c, 3)
	store, err := media.NewFSStore(dir)
	require.NoError(t, err)
	req := f.submitAndApprove(host, store)
	heirCfg := testConfig()
	heirCfg.ManifestChunkKeys = 1 // three chunks
	cfg := heirCfg
	cfg.Lease = time.Hour

	// The frozen executor stops before its first chunk's insert (its lease
	// checked in that transaction), then before its next lease check.
	atInsert, atNextCheck := pauseBefore("DeletionManifestChunkInsert"), pauseBefore("DeletionRequestEnterExecutor")
	frozenPool := f.pausedPool(atInsert, atNextCheck)
	lost := make(chan error, 1)
	go func() {
		_, err := deletion.NewExecutor(deletion.Options{Pool: frozenPool, Store: store, ID: "frozen", Config: cfg}).Run(f.ctx, req.ID)
		lost <- err
	}()
	waitFor(t, atInsert.reached, "the first executor's first chunk")

	heirAtInsert := pauseBefore("DeletionManifestChunkInsert")
	heirPool := f.pausedPool(heirAtInsert)
	type outcome struct {
		out deletion.Outcome
		err error
	}
	heir := make(chan outcome, 1)
	go func() {
		_, err := f.pool.Exec(f.ctx, `UPDATE community_deletion_requests SET lease_until = now() - interval '1 second' WHERE id = $1`, req.ID)
		if err != nil {
			heir <- outcome{err: err}
			return
		}
		out, err := deletion.NewExecutor(deletion.Options{Pool: heirPool, Store: store, ID: "heir", Config: heirCfg}).Run(f.ctx, req.ID)
		heir <- outcome{out, err}
	}()
	// The heir gets as far as the frozen transaction lets it: its own
	// first chunk, past its clear, or a wait for that transaction.
	eventually(t, func() bool {
		select {
		case <-heirAtInsert.reached:
			return true
		default:
		}
		var waiting bool
		require.NoError(t, f.pool.QueryRow(f.ctx, `SELECT EXISTS (SELECT FROM pg_stat_activity WHERE $1::int = ANY (pg_blocking_pids(pid)))`,
			int32(atInsert.pid.Load())).Scan(&waiting))
		return waiting
	}, "the heir to take over or to wait for the frozen transaction")

	close(atInsert.resume)
	waitFor(t, atNextCheck.reached, "the first executor's chunk to commit")
	waitFor(t, heirAtInsert.reached, "the heir's first chunk")
	close(atNextCheck.resume)
	select {
	case err := <-lost:
		require.ErrorIs(t, err, dberr.ErrDeletionLeaseLost)
	case <-time.After(time.Minute):
		t.Fatal("the thawed executor never stopped")
	}
	close(heirAtInsert.resume)
	var got outcome
	select {
	case got = <-heir:
	case <-time.After(time.Minute):
		t.Fatal("the heir never finished")
	}
	require.NoError(t, got.err)
	var lastError string
	if got.out.LastError != nil {
		lastError = *got.out.LastError
	}
	require.False(t, got.out.Failed(), "the heir failed: %s", lastError)
	require.Equal(t, deletion.StageRetentionPending, got.out.Stage, "%+v", got.out)
}
