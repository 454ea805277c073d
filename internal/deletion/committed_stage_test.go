package deletion_test

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/buzzrelay/buzz/internal/deletion"
)

// lastStageTracer holds the executor's read of a stage's result, right
// after the final stage committed, until the heartbeat has given up on the
// finished request (it cannot be renewed past its last stage) and
// cancelled the stage context: the window a relay's executor hits when the
// heartbeat's tick falls between that commit and that read.
type lastStageTracer struct {
	t          *testing.T
	mu         sync.Mutex
	beatCtx    context.Context // the stage context, as the heartbeat's renewals carry it
	finalStage bool            // the last stage's advance was sent
	held       bool
}

func (tr *lastStageTracer) TraceQueryStart(ctx context.Context, _ *pgx.Conn, data pgx.TraceQueryStartData) context.Context {
	tr.mu.Lock()
	switch {
	case strings.HasPrefix(data.SQL, "-- name: DeletionRequestHeartbeat "):
		tr.beatCtx = ctx
	case strings.HasPrefix(data.SQL, "-- name: DeletionRequestAdvance ") && len(data.Args) > 3 && data.Args[3] == deletion.StageLogicallyVerified:
		tr.finalStage = true
	case strings.HasPrefix(data.SQL, "-- name: DeletionRequestGet ") && tr.finalStage && !tr.held:
		tr.held = true
		tr.mu.Unlock()
		tr.waitForTheHeartbeatToGiveUp()
		return ctx
	}
	tr.mu.Unlock()
	return ctx
}

func (tr *lastStageTracer) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

func (tr *lastStageTracer) waitForTheHeartbeatToGiveUp() {
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		tr.mu.Lock()
		beat := tr.beatCtx
		tr.mu.Unlock()
		if beat != nil {
			select {
			case <-beat.Done():
				return
			case <-time.After(time.Until(deadline)):
			}
		}
		time.Sleep(10 * time.Millisecond)
	}
	tr.t.Errorf("the heartbeat never gave up on the finished request")
}

// The executor reads a stage's result after the stage committed. After the
// last stage the lease cannot be renewed: a heartbeat that ticks in between
// gives up and cancels the stage context. The read must not be cut off by
// it, or a finished deletion is reported as a lost lease (and `buzz-admin
// deletions run` exits with an error for a deletion that completed).
// Mutation killed: reading the committed stage's result with the stage
// context (DeletionRequestGet(stageCtx, ...) in execute) instead of the
// detached one, as before 6575062.
func TestFinishedDeletionIsNotReportedAsALostLease(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	c := f.community("last-stage.test")
	require.NoError(t, seedRows(f.ctx, f.pool, c, uuid.New(), randomBytes(32), randomBytes(32)))
	req := f.submitAndApprove("last-stage.test", nil)

	cfg, err := pgxpool.ParseConfig(f.pool.Config().ConnString())
	require.NoError(t, err)
	tracer := &lastStageTracer{t: t}
	cfg.ConnConfig.Tracer = tracer
	pool, err := pgxpool.NewWithConfig(f.ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)

	execCfg := testConfig()
	// A renewal every second (a sixth of the lease): the run is lost only
	// when none lands within the lease, which 3 s made likelier on a
	// loaded machine.
	execCfg.Lease = 6 * time.Second
	exec := deletion.NewExecutor(deletion.Options{Pool: pool, ID: "last-stage", Config: execCfg})
	out, err := exec.Run(f.ctx, req.ID)
	require.NoError(t, err, "a finished deletion is not a lost lease")
	require.Equal(t, deletion.StageRetentionPending, out.Stage)
	require.False(t, out.Failed())
	require.True(t, tracer.held, "the read after the last stage was held until the heartbeat gave up")
}
