package deletion_test

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/buzzrelay/buzz/internal/deletion"
)

// An executor that stops mid-purge (killed, or its lease lost) has deleted
// some of the community's rows in batches it committed; the executor that
// takes over deletes the rest. The evidence (each table's purge checkpoint
// and the tombstone's) must count every row purged, not only the heir's.
// Mutation killed: counting each generation's own batches (the record said
// 10 of 30 users, the first executor's 20 missing).
func TestPurgeEvidenceCountsTheRowsAStoppedExecutorDeleted(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	c := f.community("purge-evidence.test")
	const users = 30
	for range users {
		require.NoError(t, insertUser(f.ctx, f.pool, c))
	}
	req := f.submitAndApprove("purge-evidence.test", nil)
	cfg := testConfig()
	cfg.PurgeBatchRows = 10

	// The first executor stops once two batches of users are committed.
	ctx, stop := context.WithCancel(f.ctx)
	defer stop()
	userBatches := 0
	_, _ = deletion.NewExecutor(deletion.Options{Pool: f.pool, ID: "stopped", Config: cfg, Progress: func(p deletion.Progress) {
		if p.Step == "purge users" {
			if userBatches++; userBatches == 2 {
				stop()
			}
		}
	}}).Run(ctx, req.ID)
	var left int
	require.NoError(t, f.pool.QueryRow(f.ctx, `SELECT count(*) FROM users WHERE community_id = $1`, c).Scan(&left))
	require.Equal(t, users-20, left, "the first executor purged two batches")

	eventually(t, func() bool {
		var free bool
		return f.pool.QueryRow(f.ctx, `SELECT lease_owner IS NULL OR lease_until < now() FROM community_deletion_requests WHERE id = $1`, req.ID).Scan(&free) == nil && free
	}, "the stopped executor's claim to end")
	out, err := deletion.NewExecutor(deletion.Options{Pool: f.pool, ID: "heir", Config: cfg}).Run(f.ctx, req.ID)
	require.NoError(t, err)
	require.Equal(t, deletion.StageRetentionPending, out.Stage, "%+v", out)

	cps, err := f.q.DeletionCheckpointsOfRequest(f.ctx, req.ID)
	require.NoError(t, err)
	recorded := map[string]string{}
	for _, cp := range cps {
		recorded[cp.UnitKey] = string(cp.Detail)
	}
	var usersPurged struct{ Rows int }
	require.NoError(t, json.Unmarshal([]byte(recorded["purge:users"]), &usersPurged))
	require.Equal(t, users, usersPurged.Rows, "purge:users")
	var tombstone struct {
		Rows      map[string]int
		TotalRows int `json:"total_rows"`
	}
	require.NoError(t, json.Unmarshal([]byte(recorded["postgres_tombstone_committed"]), &tombstone))
	require.Equal(t, users, tombstone.Rows["users"], "the tombstone's users")
	require.Equal(t, users, tombstone.TotalRows, "the tombstone's total")
}
