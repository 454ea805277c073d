package deletion_test

import (
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/buzzrelay/buzz/internal/db"
)

// A serving-write lease is renewed every ten seconds for as long as its
// upload runs. Each renewal must be a HOT update (no indexed column
// changes, room on the page for the new version), or every renewal adds an
// entry to each index and a dead tuple on another page (docs/storage.md,
// "Heartbeat tables"). The counts are this transaction's own, so they are
// exact whatever else runs.
// Mutation killed: keeping lease_until in the community index (migration
// 041's old community_serving_write_leases_by_community): no renewal is HOT.
func TestServingLeaseRenewalIsAHOTUpdate(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	c := f.community("hot-lease.test")
	const renewals = 20
	err := pgx.BeginFunc(f.ctx, f.pool, func(tx pgx.Tx) error {
		q := db.New(tx)
		var leases []db.ServingLeaseRenewParams
		for range 10 { // several operations in flight, sharing a page
			id, err := q.ServingLeaseAcquire(f.ctx, db.ServingLeaseAcquireParams{CommunityID: c, Operation: "media_upload", Owner: "test", LeaseSeconds: 60})
			require.NoError(t, err)
			leases = append(leases, db.ServingLeaseRenewParams{ID: id, LeaseSeconds: 60})
		}
		for i := range renewals {
			// now() is fixed within the transaction: a longer lease each
			// time moves lease_until as renewals ten seconds apart do.
			renewal := leases[i%len(leases)]
			renewal.LeaseSeconds += float64(i + 1)
			ok, err := q.ServingLeaseRenew(f.ctx, renewal)
			require.NoError(t, err)
			require.True(t, ok)
		}
		var updated, hot int64
		require.NoError(t, tx.QueryRow(f.ctx, `SELECT pg_stat_get_xact_tuples_updated(oid), pg_stat_get_xact_tuples_hot_updated(oid)
			FROM pg_class WHERE oid = 'community_serving_write_leases'::regclass`).Scan(&updated, &hot))
		require.EqualValues(t, renewals, updated)
		require.EqualValues(t, renewals, hot, "every renewal stays on its page without an index entry")
		return nil
	})
	require.NoError(t, err)
}
