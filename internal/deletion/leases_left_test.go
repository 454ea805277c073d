package deletion_test

import (
	"testing"

	"github.com/google/uuid"

	"github.com/stretchr/testify/require"

	"github.com/buzzrelay/buzz/internal/db"
	"github.com/buzzrelay/buzz/internal/deletion"
)

// A relay killed -9 mid-upload leaves its serving-write lease behind; the
// fence waits only for live leases, so the deletion goes on once it
// expires. The finished deletion must not leave that row (it names the
// community, the operation and the relay) to a relay's reaper, which may
// never run again: the tombstone takes the community's leases with it.
// Another community's lease, expired too, is its reaper's business.
// Mutation killed: the tombstone without the lease purge (the leaked lease
// outlives the deletion).
func TestDeletionLeavesNoServingLeaseBehind(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	doomed := f.community("leased-doomed.test")
	bystander := f.community("leased-bystander.test")
	leak := func(community uuid.UUID) {
		t.Helper()
		// A lease already lapsed: its uploader died without releasing it.
		_, err := f.q.ServingLeaseAcquire(f.ctx, db.ServingLeaseAcquireParams{CommunityID: community, Operation: "media_upload", Owner: "killed-relay", LeaseSeconds: 0.000001})
		require.NoError(t, err)
	}
	leak(doomed)
	leak(bystander)
	req := f.submitAndApprove("leased-doomed.test", nil)
	out, err := deletion.NewExecutor(deletion.Options{Pool: f.pool, ID: "exec-leases", Config: testConfig()}).Run(f.ctx, req.ID)
	require.NoError(t, err)
	require.Equal(t, deletion.StageRetentionPending, out.Stage, "%+v", out)

	count := func(community uuid.UUID) (n int) {
		t.Helper()
		require.NoError(t, f.pool.QueryRow(f.ctx, `SELECT count(*) FROM community_serving_write_leases WHERE community_id = $1`, community).Scan(&n))
		return n
	}
	require.Zero(t, count(doomed), "the deleted community's leaked lease")
	require.Equal(t, 1, count(bystander), "another community's lease is left to the reaper")
}
