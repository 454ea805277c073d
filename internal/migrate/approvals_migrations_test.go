package migrate_test

import (
	"context"
	"strconv"
	"testing"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/buzzrelay/buzz/internal/dbtest"
	"github.com/buzzrelay/buzz/internal/migrate"
)

// workflowState is how a workflow waiting on an approval was left: its
// name in the test (its kind), status and enabled flag.
type workflowState struct {
	kind, status string
	enabled      bool
}

var (
	// disabledByRemoval: active, not enabled (its owner left the channel).
	disabledByRemoval = workflowState{"disabled", "active", false}
	archived          = workflowState{"archived", "archived", false}
)

// The migration that ends the approvals left pending on workflows their
// owner's removal disabled, run by tern on tables holding hundreds of
// waiting runs: it ends exactly the disabled workflows' waits (approval
// expired with the removal's note, run failed workflow_disabled), and
// leaves alone those of enabled and archived workflows, decided approvals,
// and every row of a community being deleted (whose fence would otherwise
// fail the whole migration).
//
// Mutations killed: the fence check dropped (the migration fails with
// 55000 on the fenced community), `NOT w.enabled` dropped (the enabled
// workflows' approvals end), the pending check dropped (the granted
// approvals become expired).
func TestDisabledWorkflowsApprovalsMigrationOnPopulatedTables(t *testing.T) {
	t.Parallel()
	approvalsMigrationOnPopulatedTables(t, "withdraw_disabled_workflows_approvals", disabledByRemoval, archived,
		"the workflow was disabled while the run waited for approval: its owner is no longer a member of the channel")
}

// The migration that ends the approvals left pending on workflows archived
// before archiving ended them, run by tern on tables holding hundreds of
// waiting runs: it ends exactly the archived workflows' waits (approval
// expired with the archive's note, run failed workflow_disabled), and
// leaves alone those of active workflows (enabled, or disabled by their
// owner's removal: migration 047's), decided approvals, and every row of a
// community being deleted (whose fence would otherwise fail the whole
// migration).
//
// Mutations killed: the fence check dropped (the migration fails with
// 55000 on the fenced community), `w.status = 'archived'` dropped (the
// active workflows' approvals end), the pending check dropped (the granted
// approvals become expired).
func TestArchivedWorkflowsApprovalsMigrationOnPopulatedTables(t *testing.T) {
	t.Parallel()
	approvalsMigrationOnPopulatedTables(t, "withdraw_archived_workflows_approvals", archived, disabledByRemoval,
		"the workflow was archived while the run waited for approval")
}

// approvalsMigrationOnPopulatedTables runs migration (by name) over two
// communities, one serving and one being deleted, each with a run waiting
// on a pending approval for 300 workflows left as ends (the migration's
// own), 200 enabled and 50 left as other (another migration's), plus 20
// of ends' whose approval was granted; only the serving community's 300
// waits must end, with reason.
func approvalsMigrationOnPopulatedTables(t *testing.T, migration string, ends, other workflowState, reason string) {
	ctx := context.Background()
	version := migrationVersion(t, migration)

	conn := connect(t, dbtest.EmptyURL(t))
	require.NoError(t, migrate.To(ctx, conn, version-1))
	exec := func(sql string, args ...any) {
		t.Helper()
		_, err := conn.Exec(ctx, sql, args...)
		require.NoError(t, err)
	}
	count := func(sql string, args ...any) int {
		t.Helper()
		var c int
		require.NoError(t, conn.QueryRow(ctx, sql, args...).Scan(&c))
		return c
	}
	serving, deleting := uuid.New(), uuid.New()
	for i, community := range []uuid.UUID{serving, deleting} {
		channel := uuid.New()
		exec(`INSERT INTO communities (id, host) VALUES ($1, $2)`, community, migration+"-"+strconv.Itoa(i)+".example")
		exec(`INSERT INTO channels (community_id, id, name, created_by) VALUES ($1, $2, 'room', decode(repeat('01', 32), 'hex'))`, community, channel)
		// Workflows named by kind: 300 left as ends, 200 enabled, 50 left
		// as other; each has a run waiting for a pending approval. 20 more
		// left as ends have a granted approval and a run due again.
		for _, w := range []struct {
			kind, status, approval, run string
			enabled                     bool
			n                           int
		}{
			{ends.kind, ends.status, "pending", "waiting_approval", ends.enabled, 300},
			{"enabled", "active", "pending", "waiting_approval", true, 200},
			{other.kind, other.status, "pending", "waiting_approval", other.enabled, 50},
			{"granted", ends.status, "granted", "pending", ends.enabled, 20},
		} {
			exec(`
				WITH wf AS (
					INSERT INTO workflows (community_id, id, name, owner_pubkey, channel_id, definition, definition_hash, status, enabled)
					SELECT $1, gen_random_uuid(), $3::text, decode(repeat('02', 32), 'hex'), $2, '{}', sha256(convert_to($3::text || i, 'UTF8')),
					       $4::workflow_status, $5
					FROM generate_series(1, $6::int) i
					RETURNING id
				), run AS (
					INSERT INTO workflow_runs (community_id, id, workflow_id, status)
					SELECT $1, gen_random_uuid(), id, $7::workflow_run_status FROM wf
					RETURNING id, workflow_id
				)
				INSERT INTO workflow_approvals (community_id, token, workflow_id, run_id, step_id, step_index, status, expires_at)
				SELECT $1, sha256(convert_to(run.id::text, 'UTF8')), run.workflow_id, run.id, 'ask', 0, $8::workflow_approval_status,
				       now() + interval '1 day'
				FROM run`,
				community, channel, w.kind, w.status, w.enabled, w.n, w.run, w.approval)
		}
	}
	// Fenced as its deletion's executor would, without the executor.
	tx, err := conn.Begin(ctx)
	require.NoError(t, err)
	_, err = tx.Exec(ctx, `SET LOCAL session_replication_role = replica`)
	require.NoError(t, err)
	_, err = tx.Exec(ctx, `UPDATE communities SET deletion_state = 'fenced' WHERE id = $1`, deleting)
	require.NoError(t, err)
	require.NoError(t, tx.Commit(ctx))

	require.NoError(t, migrate.To(ctx, conn, version))

	// ended counts the community's workflows named kind whose approval
	// expired with the reason and whose run failed with it.
	ended := func(community uuid.UUID, kind string) int {
		return count(`
			SELECT count(*) FROM workflow_approvals a
			JOIN workflows w ON w.community_id = a.community_id AND w.id = a.workflow_id
			JOIN workflow_runs r ON r.community_id = a.community_id AND r.id = a.run_id
			WHERE a.community_id = $1 AND w.name = $2
			  AND a.status = 'expired' AND a.note = $3
			  AND r.status = 'failed' AND r.error_code = 'workflow_disabled' AND r.error_message = $3 AND r.completed_at IS NOT NULL`,
			community, kind, reason)
	}
	untouched := func(community uuid.UUID, kind, approval, run string) int {
		return count(`
			SELECT count(*) FROM workflow_approvals a
			JOIN workflows w ON w.community_id = a.community_id AND w.id = a.workflow_id
			JOIN workflow_runs r ON r.community_id = a.community_id AND r.id = a.run_id
			WHERE a.community_id = $1 AND w.name = $2 AND a.status = $3::workflow_approval_status AND a.note IS NULL
			  AND r.status = $4::workflow_run_status AND r.error_code IS NULL AND r.completed_at IS NULL`,
			community, kind, approval, run)
	}
	require.Equal(t, 300, ended(serving, ends.kind), "every wait of a workflow left as %s ended", ends.kind)
	require.Equal(t, 200, untouched(serving, "enabled", "pending", "waiting_approval"), "enabled workflows still wait")
	require.Equal(t, 50, untouched(serving, other.kind, "pending", "waiting_approval"), "%s workflows are not this migration's", other.kind)
	require.Equal(t, 20, untouched(serving, "granted", "granted", "pending"), "decided approvals are left alone")
	require.Equal(t, 300, untouched(deleting, ends.kind, "pending", "waiting_approval"), "a community being deleted is left to its deletion")
	require.Equal(t, 300, count(`SELECT count(*) FROM workflow_approvals WHERE note IS NOT NULL`), "nothing else changed")
}
