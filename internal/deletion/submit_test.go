package deletion_test

import (
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/buzzrelay/buzz/internal/db"
	"github.com/buzzrelay/buzz/internal/deletion"
)

// A submit killed between opening its request and freezing the inventory
// leaves the request at submitted; the requester then retries it from
// several terminals at once. Every retry answers with the one request,
// inventoried, exactly as a retry after the others would: the retries
// that lost the race to freeze do not fail over a request that is fine.
// The retries are held at their freeze (the test locks the request's row)
// until all of them wait there, so they race every time.
//
// Mutation killed: Submit returning the freeze's error as before (the
// retries that lose fail with "deletion request ... is not waiting for
// its inventory").
func TestSubmitRetriedAtOnceAfterAKillReturnsTheOneRequest(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	c := f.community("retried-at-once.test")
	require.NoError(t, seedRows(f.ctx, f.pool, c, uuid.New(), randomBytes(32), randomBytes(32)))
	// The killed submit's first step, committed.
	var id uuid.UUID
	require.NoError(t, f.pool.QueryRow(f.ctx, `SELECT (community_deletion_requests_submit('retried-at-once.test', 'ops', NULL)).id`).Scan(&id))

	// The hold and the watch on connections of their own: the retries
	// take the pool's.
	url := f.pool.Config().ConnString()
	holder, err := pgx.Connect(f.ctx, url)
	require.NoError(t, err)
	defer holder.Close(f.ctx)
	watch, err := pgx.Connect(f.ctx, url)
	require.NoError(t, err)
	defer watch.Close(f.ctx)
	hold, err := holder.Begin(f.ctx)
	require.NoError(t, err)
	defer hold.Rollback(f.ctx)
	_, err = hold.Exec(f.ctx, `SELECT FROM community_deletion_requests WHERE id = $1 FOR UPDATE`, id)
	require.NoError(t, err)

	const retries = 3
	var wg sync.WaitGroup
	results := make([]db.CommunityDeletionRequest, retries)
	errs := make([]error, retries)
	for i := range retries {
		wg.Add(1)
		go func() {
			defer wg.Done()
			results[i], errs[i] = deletion.Submit(f.ctx, f.pool, nil, "retried-at-once.test", "ops", "")
		}()
	}
	require.Eventually(t, func() bool {
		var waiting int
		require.NoError(t, watch.QueryRow(f.ctx, `SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND wait_event_type = 'Lock'
			  AND query LIKE '%name: DeletionRequestFreezeInventory%'`).Scan(&waiting))
		return waiting == retries
	}, time.Minute, 10*time.Millisecond, "every retry waits at its freeze")
	require.NoError(t, hold.Rollback(f.ctx))
	wg.Wait()

	for i := range retries {
		require.NoError(t, errs[i], "retry %d", i)
		require.Equal(t, id, results[i].ID, "retry %d", i)
		require.Equal(t, deletion.StageInventoried, results[i].Stage, "retry %d", i)
		require.Equal(t, results[0].InventoryDigest, results[i].InventoryDigest, "retry %d answers with the inventory that froze", i)
	}
	stored, err := f.q.DeletionRequestGet(f.ctx, id)
	require.NoError(t, err)
	require.Equal(t, stored.InventoryDigest, results[0].InventoryDigest)
}
