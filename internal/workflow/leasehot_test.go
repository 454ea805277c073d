package workflow_test

import (
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/buzzrelay/buzz/internal/db"
)

// A step at work renews its run's lease every third of it
// (WorkflowRunKeepLease), and the renewal is a HOT update: no index entry
// and no dead tuple on another page for each renewal. lease_until was a key
// of workflow_runs_recovery, and an update of an indexed column is never
// HOT, so every renewal wrote a new heap tuple and an entry in each of the
// table's indexes, and left the old ones to vacuum (migration 045).
//
// The runs are claimed by the real claim, and each renewal is its own
// transaction, as a worker's is; PostgreSQL counts the session's updates,
// and how many were HOT, in pg_stat_xact_user_tables. A HOT update also
// needs room on the row's page, which pruning makes by removing versions
// no snapshot of the cluster may still see, and any long transaction
// anywhere in the cluster (another test's CREATE DATABASE) holds them: the
// test's table keeps room for every version without pruning (fillfactor
// 10), so what it measures is the indexes alone. (Migration 045's header
// gives the share measured with the table's own fillfactor: 994 of 1,000.)
//
// Mutation killed: the running runs' index keyed on lease_until again (as
// workflow_runs_recovery was): no renewal is HOT.
func TestLeaseRenewalsAreHOTUpdates(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	owner := f.key()
	workflowID := uuid.NewString()
	f.save(owner, f.channel(owner), workflowID, twoSteps)
	insert := func(n int) {
		t.Helper()
		_, err := f.pool.Exec(f.ctx, `
			INSERT INTO workflow_runs (community_id, id, workflow_id, run_at, trigger_context)
			SELECT $1, gen_random_uuid(), $2, now() - interval '1 minute',
			       jsonb_build_object('text', repeat('x', 200), 'channel_id', gen_random_uuid()::text)
			FROM generate_series(1, $3::int)`, f.tenant.ID(), workflowID, n)
		require.NoError(t, err)
	}
	_, err := f.pool.Exec(f.ctx, `ALTER TABLE workflow_runs SET (fillfactor = 10)`)
	require.NoError(t, err)
	insert(200)
	claims, err := f.engine(time.Minute).ClaimDue(f.ctx, 50)
	require.NoError(t, err)
	require.Len(t, claims, 50)

	conn, err := f.pool.Acquire(f.ctx)
	require.NoError(t, err)
	defer conn.Release()
	var updates, hot int
	const rounds = 5
	for range rounds {
		insert(50) // other runs keep arriving
		for _, c := range claims {
			err := pgx.BeginFunc(f.ctx, conn, func(tx pgx.Tx) error {
				// The counters hold what the session has not reported yet,
				// so the renewal's are what it adds to them.
				counts := func() (u, h int, err error) {
					err = tx.QueryRow(f.ctx, `SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_xact_user_tables
						WHERE relid = 'workflow_runs'::regclass`).Scan(&u, &h)
					return u, h, err
				}
				u0, h0, err := counts()
				if err != nil {
					return err
				}
				n, err := db.New(tx).WorkflowRunKeepLease(f.ctx, db.WorkflowRunKeepLeaseParams{
					CommunityID: c.Run.CommunityID, ID: c.Run.ID, ClaimID: c.ClaimID, Step: c.Run.CurrentStep,
					LeaseMs: time.Hour.Milliseconds(),
				})
				if err != nil {
					return err
				}
				require.EqualValues(t, 1, n)
				u, h, err := counts()
				if err != nil {
					return err
				}
				updates, hot = updates+u-u0, hot+h-h0
				return nil
			})
			require.NoError(t, err)
		}
	}
	t.Logf("lease renewals: %d updates, %d HOT", updates, hot)
	require.Equal(t, rounds*len(claims), updates)
	require.Equal(t, updates, hot, "every renewal is HOT")
}
