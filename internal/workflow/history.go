package workflow

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/buzzrelay/buzz/internal/clock"
	"github.com/buzzrelay/buzz/internal/db"
)

// DefaultRunRetention is how long a run's history is kept after it ended.
const DefaultRunRetention = 30 * 24 * time.Hour

// historyBatch bounds the rows one sweep deletes from each table, so a
// sweep is a short statement however large the backlog: a scheduler tick
// (every BUZZ_WORKFLOW_POLL) on each process takes one more batch.
const historyBatch = 1000

// PruneHistory deletes a batch of the schedule slot claims and a batch of
// the runs (with their approvals) that are older than retention: runs by
// when they ended, claims by when they were made. A claim goes before the
// run it names can, so a backlog drains claims first, then runs.
func PruneHistory(ctx context.Context, pool *pgxpool.Pool, clk clock.Clock, retention time.Duration, m *Metrics) (fires, runs int64, err error) {
	before := clk.Now().Add(-retention)
	q := db.New(pool)
	fires, err = q.ScheduledWorkflowFiresDeleteOld(ctx, db.ScheduledWorkflowFiresDeleteOldParams{Before: before, Batch: historyBatch})
	if err != nil {
		return 0, 0, err
	}
	m.historyDeleted("scheduled_workflow_fires", fires)
	runs, err = q.WorkflowRunsDeleteEnded(ctx, db.WorkflowRunsDeleteEndedParams{Before: before, Batch: historyBatch})
	if err != nil {
		return fires, 0, err
	}
	m.historyDeleted("workflow_runs", runs)
	return fires, runs, nil
}
