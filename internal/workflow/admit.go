package workflow

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"

	"github.com/buzzrelay/buzz/internal/db"
)

// DefaultMaxUnfinishedRuns bounds the runs of one workflow that have not
// ended (pending, running or waiting for approval). Runs are durable rows
// that queue for a worker; the bound keeps one busy workflow (a chatty
// channel, a flood of webhook calls) from growing that queue without end.
const DefaultMaxUnfinishedRuns = 1000

// errWorkflowGone: the workflow row vanished between reading it and
// creating its run (deleted in a concurrent transaction).
var errWorkflowGone = errors.New("workflow no longer exists")

// newRun is one run a trigger asks for.
type newRun struct {
	CommunityID    uuid.UUID
	WorkflowID     uuid.UUID
	TriggerEventID []byte // nil for schedule and webhook runs
	Context        TriggerContext
	IdempotencyKey *string
	Now            *time.Time // the injected clock's SQL "now"
}

// admitRun creates a run in q's transaction, bounded by maxUnfinished
// unfinished runs per workflow: under the bound it is queued (pending);
// at the bound it is recorded failed with capacity_exceeded at once, so
// the refusal shows in run history and metrics. It reports whether the
// run was queued.
//
// The bound is exact under concurrency: the workflow row is locked (FOR NO
// KEY UPDATE) until the transaction ends before the count, so concurrent
// triggers of one workflow count one after the other, each seeing the runs
// the previous one committed. Triggers of different workflows do not wait
// for each other.
//
// Lock order: workflow rows first (an event's in id order, see
// createRuns), then approvals, then runs. Triggers take only workflow
// rows, and an approval's decision none (it locks its approval, then its
// run), so the two never deadlock, whatever order a group's events take.
func admitRun(ctx context.Context, q *db.Queries, r newRun, maxUnfinished int) (uuid.UUID, bool, error) {
	if maxUnfinished <= 0 {
		maxUnfinished = DefaultMaxUnfinishedRuns
	}
	n, err := q.WorkflowLockForRuns(ctx, db.WorkflowLockForRunsParams{CommunityID: r.CommunityID, ID: r.WorkflowID})
	if err == nil && n == 0 {
		err = errWorkflowGone
	}
	if err != nil {
		return uuid.Nil, false, err
	}
	id := uuid.New()
	row, err := q.WorkflowRunCreate(ctx, db.WorkflowRunCreateParams{
		CommunityID: r.CommunityID, ID: id, WorkflowID: r.WorkflowID, TriggerEventID: r.TriggerEventID,
		TriggerContext: mustJSON(r.Context), IdempotencyKey: r.IdempotencyKey,
		CapacityCode:    string(CodeCapacityExceeded),
		CapacityMessage: fmt.Sprintf("the workflow already has %d unfinished runs, its limit; the run was not queued", maxUnfinished),
		Now:             r.Now, MaxUnfinished: int32(maxUnfinished),
	})
	if err != nil {
		return uuid.Nil, false, err
	}
	return id, row.Status == db.WorkflowRunStatusPending, nil
}
