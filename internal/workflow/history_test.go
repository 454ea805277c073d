package workflow_test

import (
	"context"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/buzzrelay/buzz/internal/clock"
	"github.com/buzzrelay/buzz/internal/db"
	"github.com/buzzrelay/buzz/internal/deletion"
	"github.com/buzzrelay/buzz/internal/workflow"
)

// historyRun inserts a run of workflow in community: ended (completed, or
// failed when failed) at ended, or pending when ended is zero.
func (f *fixture) historyRun(community, workflowID uuid.UUID, ended time.Time, failed bool) uuid.UUID {
	f.t.Helper()
	id := uuid.New()
	status, code, msg := "pending", (*string)(nil), (*string)(nil)
	var completed *time.Time
	if !ended.IsZero() {
		status, completed = "completed", &ended
		if failed {
			c, m := "step_timeout", "step a did not finish"
			status, code, msg = "failed", &c, &m
		}
	}
	created := ended
	if created.IsZero() {
		created = f.clock.Now().Add(-40 * 24 * time.Hour)
	}
	_, err := f.pool.Exec(f.ctx, `INSERT INTO workflow_runs (community_id, id, workflow_id, status, error_code, error_message, completed_at, run_at, created_at)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $8)`, community, id, workflowID, status, code, msg, completed, created)
	require.NoError(f.t, err)
	return id
}

// historyDeleted reads buzz_workflow_history_deleted_total{table}.
func (f *fixture) historyDeleted(table string) float64 {
	return f.counter("buzz_workflow_history_deleted_total", map[string]string{"table": table})
}

func (f *fixture) exists(sql string, args ...any) bool {
	f.t.Helper()
	return f.count(sql, args...) > 0
}

// History retention deletes the runs that ended before the retention (with
// their approvals) and the slot claims made before it, and keeps everything
// younger, every unfinished run however old, and every row of a community
// being deleted (whose fence refuses the deletes: the sweep must not fail
// for everyone over it). Mutations killed: no community_write_allowed (the
// sweep fails on the fenced community's rows); the retention ignored (the
// recent run goes); runs deleted before the slot claims that name them
// (the claimed run stays for a later tick; asserted gone here).
func TestHistoryRetentionDeletesWhatEndedLongAgo(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	owner := f.key()
	ch := f.channel(owner)
	wf := uuid.NewString()
	f.save(owner, ch, wf, boundedYAML)
	wfID := uuid.MustParse(wf)
	community := f.tenant.ID()
	now := f.clock.Now()
	longAgo, recently := now.Add(-40*24*time.Hour), now.Add(-24*time.Hour)

	oldDone := f.historyRun(community, wfID, longAgo, false)
	oldFailed := f.historyRun(community, wfID, longAgo, true)
	_, err := f.pool.Exec(f.ctx, `INSERT INTO workflow_approvals (community_id, token, workflow_id, run_id, step_id, step_index, status, expires_at)
		VALUES ($1, $2, $3, $4, 'a', 0, 'denied', $5)`, community, make([]byte, 32), wfID, oldFailed, longAgo)
	require.NoError(t, err)
	oldScheduled := f.historyRun(community, wfID, longAgo, false)
	_, err = f.pool.Exec(f.ctx, `INSERT INTO scheduled_workflow_fires (community_id, workflow_id, scheduled_for, claimed_at, workflow_run_id)
		VALUES ($1, $2, date_trunc('second', $3::timestamptz), $3, $4)`, community, wfID, longAgo, oldScheduled)
	require.NoError(t, err)
	_, err = f.pool.Exec(f.ctx, `INSERT INTO scheduled_workflow_fires (community_id, workflow_id, scheduled_for, claimed_at)
		VALUES ($1, $2, date_trunc('second', $3::timestamptz), $3)`, community, wfID, recently)
	require.NoError(t, err)
	recentDone := f.historyRun(community, wfID, recently, false)
	oldPending := f.historyRun(community, wfID, time.Time{}, false)

	// Another community, being deleted, with a run as old.
	host := "history-" + uuid.NewString()[:8] + ".example"
	doomed, err := db.New(f.pool).CommunityCreate(f.ctx, host)
	require.NoError(t, err)
	doomedWF := uuid.New()
	_, err = f.pool.Exec(f.ctx, `INSERT INTO workflows (community_id, id, name, owner_pubkey, definition, definition_hash)
		VALUES ($1, $2, 'w', $3, '{}', $3)`, doomed.ID, doomedWF, make([]byte, 32))
	require.NoError(t, err)
	doomedRun := f.historyRun(doomed.ID, doomedWF, longAgo, false)
	quiesce(t, f, host)

	fires, runs, err := workflow.PruneHistory(context.Background(), f.pool, clock.Stub(f.clock.Now), 30*24*time.Hour, f.metrics)
	require.NoError(t, err)
	require.EqualValues(t, 1, fires)
	require.EqualValues(t, 3, runs)

	for name, id := range map[string]uuid.UUID{"old completed": oldDone, "old failed": oldFailed, "old scheduled": oldScheduled} {
		require.False(t, f.exists(`SELECT count(*) FROM workflow_runs WHERE id = $1`, id), name)
	}
	require.False(t, f.exists(`SELECT count(*) FROM workflow_approvals WHERE run_id = $1`, oldFailed), "approvals go with their run")
	for name, id := range map[string]uuid.UUID{"recent": recentDone, "unfinished": oldPending, "community being deleted": doomedRun} {
		require.True(t, f.exists(`SELECT count(*) FROM workflow_runs WHERE id = $1`, id), name)
	}
	require.Equal(t, 1, f.count(`SELECT count(*) FROM scheduled_workflow_fires WHERE community_id = $1`, community), "the recent claim stays")
	require.Equal(t, 1.0, f.historyDeleted("scheduled_workflow_fires"))
	require.Equal(t, 3.0, f.historyDeleted("workflow_runs"))

	// A second sweep finds nothing more.
	fires, runs, err = workflow.PruneHistory(context.Background(), f.pool, clock.Stub(f.clock.Now), 30*24*time.Hour, f.metrics)
	require.NoError(t, err)
	require.Zero(t, fires+runs)
}

// quiesce starts the deletion of the community at host, up to quiescing:
// its fence then refuses ordinary writes.
func quiesce(t *testing.T, f *fixture, host string) {
	t.Helper()
	req, err := deletion.Submit(f.ctx, f.pool, nil, host, "ops@example", "test")
	require.NoError(t, err)
	req, err = deletion.Approve(f.ctx, f.pool, req.ID, "lead@example", "test")
	require.NoError(t, err)
	q := db.New(f.pool)
	row, err := q.DeletionRequestClaim(f.ctx, db.DeletionRequestClaimParams{ID: &req.ID, Owner: "test", LeaseSeconds: 3600})
	require.NoError(t, err)
	require.NoError(t, q.DeletionRequestBeginQuiescing(f.ctx, db.DeletionRequestBeginQuiescingParams{ID: row.ID, Owner: "test", Generation: row.LeaseGeneration}))
}
