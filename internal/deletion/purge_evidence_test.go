package deletion_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/buzzrelay/buzz/internal/db"
	"github.com/buzzrelay/buzz/internal/dberr"
	"github.com/buzzrelay/buzz/internal/deletion"
)

// usersToPurge is a community at host holding users users, its deletion
// approved, and an executor's configuration that purges 10 rows a batch.
func (f *fixture) usersToPurge(host string, users int) (uuid.UUID, db.CommunityDeletionRequest, deletion.Config) {
	f.t.Helper()
	c := f.community(host)
	for range users {
		require.NoError(f.t, insertUser(f.ctx, f.pool, c))
	}
	cfg := testConfig()
	cfg.PurgeBatchRows = 10
	return c, f.submitAndApprove(host, nil), cfg
}

// An executor that stops mid-purge (killed, or its lease lost) has deleted
// some of the community's rows in batches it committed; the executor that
// takes over deletes the rest. The evidence (each table's purge checkpoint
// and the tombstone's) must count every row purged, not only the heir's.
// Mutation killed: counting each generation's own batches (the record said
// 10 of 30 users, the first executor's 20 missing).
func TestPurgeEvidenceCountsTheRowsAStoppedExecutorDeleted(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	const users = 30
	c, req, cfg := f.usersToPurge("purge-evidence.test", users)

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

// An executor frozen (a suspended VM, a long pause) between its last batch
// of a table and that table's completed checkpoint, past its lease, wakes
// after an heir took the request over and finished it. Its first write
// then is the checkpoint, which it must not make: the heir owns the
// request, and the evidence would say the table's purge was completed by
// the lost generation, after the deletion ended. The frozen executor's
// heartbeat is frozen with it, so nothing told it of the loss; its lease is
// ended by hand, as the pause would have ended it.
// Mutation killed: the completed checkpoint written without the lease
// check every other step makes (purge:users says generation 1, completed
// after the request).
func TestFrozenExecutorRecordsNoPurgeAfterItsHeirTookOver(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	_, req, cfg := f.usersToPurge("frozen-purge.test", 5)
	heirCfg := cfg
	cfg.Lease = time.Hour // no heartbeat while the test runs: it is frozen too

	frozen, thaw := make(chan struct{}), make(chan struct{})
	lost := make(chan error, 1)
	go func() {
		_, err := deletion.NewExecutor(deletion.Options{Pool: f.pool, ID: "frozen", Config: cfg, Progress: func(p deletion.Progress) {
			if p.Step == "purge users" {
				close(frozen)
				<-thaw
			}
		}}).Run(f.ctx, req.ID)
		lost <- err
	}()
	select {
	case <-frozen:
	case err := <-lost:
		t.Fatalf("the first executor ended before purging users: %v", err)
	}
	_, err := f.pool.Exec(f.ctx, `UPDATE community_deletion_requests SET lease_until = now() - interval '1 second' WHERE id = $1`, req.ID)
	require.NoError(t, err)
	out, err := deletion.NewExecutor(deletion.Options{Pool: f.pool, ID: "heir", Config: heirCfg}).Run(f.ctx, req.ID)
	require.NoError(t, err)
	require.Equal(t, deletion.StageRetentionPending, out.Stage, "%+v", out)

	close(thaw)
	select {
	case err := <-lost:
		require.ErrorIs(t, err, dberr.ErrDeletionLeaseLost)
	case <-time.After(time.Minute):
		t.Fatal("the thawed executor never stopped")
	}
	var generation int64
	var completedAfterTheRequest bool
	require.NoError(t, f.pool.QueryRow(f.ctx, `
		SELECT k.lease_generation, k.completed_at > r.completed_at
		FROM community_deletion_checkpoints k JOIN community_deletion_requests r ON r.id = k.request_id
		WHERE k.request_id = $1 AND k.unit_key = 'purge:users'`, req.ID).Scan(&generation, &completedAfterTheRequest))
	require.EqualValues(t, 2, generation, "the users' purge was completed by the heir")
	require.False(t, completedAfterTheRequest, "no purge is recorded after the deletion finished")
}
