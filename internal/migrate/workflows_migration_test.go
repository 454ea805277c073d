package migrate_test

import (
	"context"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/buzzrelay/buzz/internal/dbtest"
	"github.com/buzzrelay/buzz/internal/migrate"
)

// Migrations 012 and 013 on a database with channels and members: the workflow
// tables apply, the owner-removal trigger disables exactly the removed
// owner's workflows in that channel, the run table's CHECKs refuse an
// unknown error code and a code without a message, and the down part
// removes everything so 012 applies again.
//
// Mutations killed: a trigger that disables every workflow of the channel
// fails "other owner keeps firing"; a trigger missing the WHEN clause's
// transition (firing on re-add) fails "re-adding does not enable"; dropping
// workflow_runs_error_pair or workflow_runs_error_code_known fails the CHECK
// assertions; a down part that forgets a type fails the second migrate.To(12).
func TestWorkflowsMigrationOnADatabaseWithMembers(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	conn := connect(t, dbtest.EmptyURL(t))
	exec := func(sql string, args ...any) error {
		_, err := conn.Exec(ctx, sql, args...)
		return err
	}
	require.NoError(t, migrate.To(ctx, conn, 11))
	const community = "00000000-0000-4000-8000-000000000012"
	const channel = "00000000-0000-4000-8000-0000000000c1"
	owner, other := strings.Repeat("aa", 32), strings.Repeat("bb", 32)
	require.NoError(t, exec(`INSERT INTO communities (id, host) VALUES ($1, 'wf.example')`, community))
	require.NoError(t, exec(`INSERT INTO channels (community_id, id, name, created_by) VALUES ($1, $2, 'c', decode($3, 'hex'))`, community, channel, owner))
	for _, pk := range []string{owner, other} {
		require.NoError(t, exec(`INSERT INTO channel_members (community_id, channel_id, pubkey, role) VALUES ($1, $2, decode($3, 'hex'), 'owner')`, community, channel, pk))
	}

	require.NoError(t, migrate.To(ctx, conn, 12))
	insertWorkflow := func(id, pk string) {
		require.NoError(t, exec(`
			INSERT INTO workflows (community_id, id, name, owner_pubkey, channel_id, definition, definition_hash)
			VALUES ($1, $2, 'w', decode($3, 'hex'), $4, '{}', sha256('{}'))`, community, id, pk, channel))
	}
	mine, theirs := "00000000-0000-4000-8000-0000000000f1", "00000000-0000-4000-8000-0000000000f2"
	insertWorkflow(mine, owner)
	insertWorkflow(theirs, other)
	enabled := func(id string) bool {
		var on bool
		require.NoError(t, conn.QueryRow(ctx, `SELECT enabled FROM workflows WHERE id = $1`, id).Scan(&on))
		return on
	}
	require.NoError(t, exec(`UPDATE channel_members SET removed_at = now() WHERE pubkey = decode($1, 'hex')`, owner))
	require.False(t, enabled(mine), "the removed owner's workflow is disabled")
	require.True(t, enabled(theirs), "other owner keeps firing")
	require.NoError(t, exec(`UPDATE channel_members SET removed_at = NULL WHERE pubkey = decode($1, 'hex')`, owner))
	require.False(t, enabled(mine), "re-adding does not enable: the owner must save again")

	insertRun := func(code, message any) error {
		return exec(`INSERT INTO workflow_runs (community_id, id, workflow_id, status, error_code, error_message)
			VALUES ($1, gen_random_uuid(), $2, 'failed', $3, $4)`, community, theirs, code, message)
	}
	require.NoError(t, insertRun("workflow_disabled", "workflow is disabled"))
	require.ErrorContains(t, insertRun("made_up", "x"), "workflow_runs_error_code_known")
	require.ErrorContains(t, insertRun("database_error", nil), "workflow_runs_error_pair")
	require.ErrorContains(t, exec(`INSERT INTO workflow_runs (community_id, id, workflow_id, status) VALUES ($1, gen_random_uuid(), $2, 'running')`,
		community, theirs), "workflow_runs_running_is_claimed")

	// 013 on the runs above: a key is unique per workflow, runs without
	// one are unaffected, and the down part drops it.
	require.NoError(t, migrate.To(ctx, conn, 13))
	keyed := func() error {
		return exec(`INSERT INTO workflow_runs (community_id, id, workflow_id, idempotency_key) VALUES ($1, gen_random_uuid(), $2, 'k1')`, community, theirs)
	}
	require.NoError(t, keyed())
	require.ErrorContains(t, keyed(), "workflow_runs_idempotency")
	require.NoError(t, insertRun("workflow_disabled", "again"), "runs without a key are unaffected")
	require.NoError(t, migrate.To(ctx, conn, 12))

	require.NoError(t, migrate.To(ctx, conn, 11))
	require.NoError(t, exec(`UPDATE channel_members SET removed_at = now() WHERE pubkey = decode($1, 'hex')`, other), "rolled back: no trigger left")
	require.NoError(t, migrate.To(ctx, conn, 13))
}
