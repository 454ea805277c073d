package workflow_test

import (
	"io/fs"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/buzzrelay/buzz/internal/db"
	"github.com/buzzrelay/buzz/internal/ingest"
	"github.com/buzzrelay/buzz/internal/nostr"
	"github.com/buzzrelay/buzz/internal/workflow"
	"github.com/buzzrelay/buzz/migrations"
)

// withdrawDisabledApprovals runs the up part of the migration that ends the
// approvals still pending on workflows their owner's removal disabled
// before the removal ended them itself.
func (f *fixture) withdrawDisabledApprovals() {
	f.t.Helper()
	f.migrateUp("withdraw_disabled_workflows_approvals")
}

// migrateUp runs the up part of the migration named name (its file name
// without the number), as tern would, in one transaction.
func (f *fixture) migrateUp(name string) {
	f.t.Helper()
	names, err := fs.Glob(migrations.FS, "*_"+name+".sql")
	require.NoError(f.t, err)
	require.Len(f.t, names, 1)
	text, err := fs.ReadFile(migrations.FS, names[0])
	require.NoError(f.t, err)
	up, _, found := strings.Cut(string(text), "---- create above / drop below ----")
	require.True(f.t, found)
	require.NoError(f.t, pgx.BeginFunc(f.ctx, f.pool, func(tx pgx.Tx) error {
		_, err := tx.Exec(f.ctx, up)
		return err
	}))
}

// An approval left pending on a workflow its owner's removal disabled
// before the removal ended such waits (the database's trigger disabled the
// workflow; nothing ended the wait) is ended by the migration exactly as
// the removal ends one now: here one member is removed by the relay (the
// removal's side rows end the wait) and another only by the database's
// trigger, as before; after the migration the two runs and approvals read
// the same. An approval of an enabled workflow, and one already decided,
// are left alone, and running the migration again changes nothing.
//
// Mutations killed: a migration without the run's update (the run still
// waits), without `NOT w.enabled` (the enabled workflow's approval ends),
// or with another note or diagnostic than the removal's.
func TestMigrationEndsApprovalsOfWorkflowsDisabledBefore(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	owner, removedNow, removedBefore, approver := f.key(), f.key(), f.key(), f.key()
	ch := f.channel(owner, removedNow, removedBefore, approver)

	liveRun, liveRef := f.approvalRun(removedNow, ch, "any")
	f.store(f.sign(owner, ingest.KindRemoveUser, "", nostr.Tags{{"h", ch}, {"p", pubHex(removedNow)}}))

	oldRun, oldRef := f.approvalRun(removedBefore, ch, "any")
	grantedRun, grantedRef := f.approvalRun(removedBefore, ch, "any")
	f.store(f.sign(approver, workflow.KindApprovalGrant, "", nostr.Tags{{"d", grantedRef}}))
	keptRun, keptRef := f.approvalRun(owner, ch, "any")
	_, err := f.pool.Exec(f.ctx, `UPDATE channel_members SET removed_at = now() WHERE channel_id = $1 AND pubkey = decode($2, 'hex')`,
		ch, pubHex(removedBefore))
	require.NoError(t, err)
	require.Equal(t, db.WorkflowRunStatusWaitingApproval, f.run(oldRun).Status, "the trigger alone left the run waiting")
	status, _ := f.approvalStatus(oldRef)
	require.Equal(t, "pending", status)

	f.withdrawDisabledApprovals()
	live, old := f.run(liveRun), f.run(oldRun)
	require.Equal(t, db.WorkflowRunStatusFailed, old.Status)
	require.Equal(t, live.Status, old.Status)
	require.Equal(t, *live.ErrorCode, *old.ErrorCode)
	require.Equal(t, *live.ErrorMessage, *old.ErrorMessage)
	require.NotNil(t, old.CompletedAt)
	liveStatus, liveNote := f.approvalStatus(liveRef)
	oldStatus, oldNote := f.approvalStatus(oldRef)
	require.Equal(t, liveStatus, oldStatus)
	require.Equal(t, liveNote, oldNote)
	f.rejected(f.sign(approver, workflow.KindApprovalGrant, "", nostr.Tags{{"d", oldRef}}), ownerLeftRefusal)

	status, note := f.approvalStatus(grantedRef)
	require.Equal(t, "granted", status, "a decided approval is left alone")
	require.Empty(t, note)
	require.NotEqual(t, "workflow_disabled", ptrOr(f.run(grantedRun).ErrorCode))
	status, _ = f.approvalStatus(keptRef)
	require.Equal(t, "pending", status, "an enabled workflow's approval still waits")
	require.Equal(t, db.WorkflowRunStatusWaitingApproval, f.run(keptRun).Status)

	before := f.approvalsAndRuns()
	f.withdrawDisabledApprovals()
	require.Equal(t, before, f.approvalsAndRuns(), "run again, the migration changes nothing")
}

// approvalsAndRuns is every approval's and run's state as one text, to
// tell whether a backfill run again changed anything.
func (f *fixture) approvalsAndRuns() string {
	f.t.Helper()
	var s string
	require.NoError(f.t, f.pool.QueryRow(f.ctx, `SELECT
		(SELECT string_agg(concat_ws('|', run_id, status, note), ',' ORDER BY run_id) FROM workflow_approvals) ||
		(SELECT string_agg(concat_ws('|', id, status, error_code, error_message, completed_at), ',' ORDER BY id) FROM workflow_runs)`).Scan(&s))
	return s
}

func ptrOr(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}
