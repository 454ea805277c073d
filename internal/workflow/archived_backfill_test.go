package workflow_test

import (
	"testing"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/buzzrelay/buzz/internal/db"
	"github.com/buzzrelay/buzz/internal/nostr"
	"github.com/buzzrelay/buzz/internal/workflow"
)

// An approval left pending on a workflow archived before archiving ended
// such waits is ended by the migration exactly as an archive ends one now:
// here one workflow is archived by the relay (a kind 5 of its coordinate,
// whose side rows end the wait) and another only by its row, as the relay
// archived before; deleting that one's coordinate again does not end its
// wait (the archive finds the row archived already), the migration does,
// and after it the two runs and approvals read the same. An approval of an
// active workflow, and one already decided, are left alone, and running the
// migration again changes nothing.
//
// Mutations killed: a migration without the run's update (the run still
// waits), without `w.status = 'archived'` (the active workflow's approval
// ends), or with another note or diagnostic than the archive's.
func TestMigrationEndsApprovalsOfWorkflowsArchivedBefore(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	owner, approver := f.key(), f.key()
	ch := f.channel(owner, approver)
	archive := func(id string) {
		f.store(f.sign(owner, nostr.KindDeletion, "", nostr.Tags{{"a", "30620:" + pubHex(owner) + ":" + id}}))
	}
	archiveAsBefore := func(id string) {
		_, err := f.pool.Exec(f.ctx, `UPDATE workflows SET status = 'archived', enabled = false WHERE id = $1`, id)
		require.NoError(t, err)
	}

	liveID, oldID, grantedID := uuid.NewString(), uuid.NewString(), uuid.NewString()
	liveRun, liveRef := f.approvalRunOf(owner, ch, liveID, "any")
	archive(liveID)
	require.Equal(t, db.WorkflowRunStatusFailed, f.run(liveRun).Status, "an archive ends the wait today")

	oldRun, oldRef := f.approvalRunOf(owner, ch, oldID, "any")
	archiveAsBefore(oldID)
	archive(oldID)
	require.Equal(t, db.WorkflowRunStatusWaitingApproval, f.run(oldRun).Status, "archived before, the run still waits")
	status, _ := f.approvalStatus(oldRef)
	require.Equal(t, "pending", status)

	keptRun, keptRef := f.approvalRun(owner, ch, "any")
	grantedRun, grantedRef := f.approvalRunOf(owner, ch, grantedID, "any")
	f.store(f.sign(approver, workflow.KindApprovalGrant, "", nostr.Tags{{"d", grantedRef}}))
	archiveAsBefore(grantedID)

	f.migrateUp("withdraw_archived_workflows_approvals")
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
	f.rejected(f.sign(approver, workflow.KindApprovalGrant, "", nostr.Tags{{"d", oldRef}}),
		"invalid: the workflow was archived; its run no longer waits for this approval")

	status, note := f.approvalStatus(grantedRef)
	require.Equal(t, "granted", status, "a decided approval is left alone")
	require.Empty(t, note)
	require.NotEqual(t, "workflow_disabled", ptrOr(f.run(grantedRun).ErrorCode), "a granted run fails at its next step, not here")
	status, _ = f.approvalStatus(keptRef)
	require.Equal(t, "pending", status, "an active workflow's approval still waits")
	require.Equal(t, db.WorkflowRunStatusWaitingApproval, f.run(keptRun).Status)

	before := f.approvalsAndRuns()
	f.migrateUp("withdraw_archived_workflows_approvals")
	require.Equal(t, before, f.approvalsAndRuns(), "run again, the migration changes nothing")
}
