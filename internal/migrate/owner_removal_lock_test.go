package migrate_test

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/buzzrelay/buzz/internal/dbtest"
)

// A member's removal and a message of their channel lock the member's
// workflows in one order (by id), so neither waits for the other while
// holding what the other waits for. Here the workflow with the higher id
// comes first in the table, so an UPDATE meets it first: the message holds
// the lower one, the removal (its trigger disabling the member's workflows)
// starts, then the message asks for the higher one. Before, the removal
// held the higher one and waited for the lower: a deadlock, one of them
// failed with 40P01. Now the removal waits for the lower one holding
// nothing, and both commit.
//
// Mutation killed: the trigger's ordered PERFORM dropped (migration 046
// undone): the message or the removal fails with a deadlock.
func TestOwnerRemovalLocksWorkflowsInIDOrder(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := dbtest.URL(t)
	setup := connect(t, url)
	community, channel := uuid.New(), uuid.New()
	owner, member := make([]byte, 32), make([]byte, 32)
	owner[0], member[0] = 1, 2
	exec := func(sql string, args ...any) {
		t.Helper()
		_, err := setup.Exec(ctx, sql, args...)
		require.NoError(t, err)
	}
	exec(`INSERT INTO communities (id, host) VALUES ($1, 'owner-removal-locks.example')`, community)
	exec(`INSERT INTO channels (community_id, id, name, created_by) VALUES ($1, $2, 'room', $3)`, community, channel, owner)
	exec(`INSERT INTO channel_members (community_id, channel_id, pubkey, role) VALUES ($1, $2, $3, 'owner'), ($1, $2, $4, 'member')`,
		community, channel, owner, member)
	lower, higher := uuid.New(), uuid.New()
	if bytes.Compare(lower[:], higher[:]) > 0 {
		lower, higher = higher, lower
	}
	for _, id := range []uuid.UUID{higher, lower} { // the higher first in the table
		exec(`INSERT INTO workflows (community_id, id, name, owner_pubkey, channel_id, definition, definition_hash)
			VALUES ($1, $2, 'w', $3, $4, '{}', sha256($5))`, community, id, member, channel, id[:])
	}

	lockWorkflow := `SELECT 1 FROM workflows WHERE community_id = $1 AND id = $2 FOR NO KEY UPDATE`
	message, removal := connect(t, url), connect(t, url)
	_, err := message.Exec(ctx, `SET deadlock_timeout = '50ms'`)
	require.NoError(t, err)
	_, err = removal.Exec(ctx, `SET deadlock_timeout = '50ms'`)
	require.NoError(t, err)
	var removalPID uint32
	require.NoError(t, removal.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&removalPID))

	messageTx, err := message.Begin(ctx)
	require.NoError(t, err)
	defer messageTx.Rollback(ctx)
	_, err = messageTx.Exec(ctx, lockWorkflow, community, lower)
	require.NoError(t, err)

	removed := make(chan error, 1)
	go func() {
		_, err := removal.Exec(ctx, `UPDATE channel_members SET removed_at = now() WHERE community_id = $1 AND channel_id = $2 AND pubkey = $3`,
			community, channel, member)
		removed <- err
	}()
	require.Eventually(t, func() bool {
		var waiting bool
		require.NoError(t, setup.QueryRow(ctx, `SELECT coalesce(bool_or(wait_event_type = 'Lock'), false) FROM pg_stat_activity WHERE pid = $1`, removalPID).Scan(&waiting))
		return waiting
	}, time.Minute, 5*time.Millisecond, "the removal waits for the message's lock")

	_, err = messageTx.Exec(ctx, lockWorkflow, community, higher)
	require.NoError(t, err, "the message's second lock")
	require.NoError(t, messageTx.Commit(ctx))
	require.NoError(t, <-removed, "the removal")
	var enabled int
	require.NoError(t, setup.QueryRow(ctx, `SELECT count(*) FROM workflows WHERE community_id = $1 AND enabled`, community).Scan(&enabled))
	require.Zero(t, enabled, "the removed member's workflows are disabled")
}
