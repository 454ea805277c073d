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
	ctx := context.Background()
	version := migrationVersion(t, "withdraw_archived_workflows_approvals")

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
		exec(`INSERT INTO communities (id, host) VALUES ($1, $2)`, community, "archived-approvals-"+strconv.Itoa(i)+".example")
		exec(`INSERT INTO channels (community_id, id, name, created_by) VALUES ($1, $2, 'room', decode(repeat('01', 32), 'hex'))`, community, channel)
		// Workflows named by kind: 300 archived, 200 enabled, 50 disabled
		// by their owner's removal (active, not enabled); each has a run
		// waiting for a pending approval. 20 more archived ones have a
		// granted approval and a run due again.
		for _, w := range []struct {
			kind, status, approval, run string
			enabled                     bool
			n                           int
		}{
			{"archived", "archived", "pending", "waiting_approval", false, 300},
			{"enabled", "active", "pending", "waiting_approval", true, 200},
			{"disabled", "active", "pending", "waiting_approval", false, 50},
			{"granted", "archived", "granted", "pending", false, 20},
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

	const reason = "the workflow was archived while the run waited for approval"
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
	require.Equal(t, 300, ended(serving, "archived"), "every wait of an archived workflow ended")
	require.Equal(t, 200, untouched(serving, "enabled", "pending", "waiting_approval"), "enabled workflows still wait")
	require.Equal(t, 50, untouched(serving, "disabled", "pending", "waiting_approval"), "disabled workflows are not this migration's")
	require.Equal(t, 20, untouched(serving, "granted", "granted", "pending"), "decided approvals are left alone")
	require.Equal(t, 300, untouched(deleting, "archived", "pending", "waiting_approval"), "a community being deleted is left to its deletion")
	require.Equal(t, 300, count(`SELECT count(*) FROM workflow_approvals WHERE note IS NOT NULL`), "nothing else changed")
}
