package deletion_test

import (
	"context"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/buzzrelay/buzz/internal/db"
	"github.com/buzzrelay/buzz/internal/dbtest"
	"github.com/buzzrelay/buzz/internal/deletion"
	"github.com/buzzrelay/buzz/internal/relaytest"
)

// Every table with a community_id column carries the fence, found from the
// catalog. Kills: dropping the attach loop from the migration (or one
// table's trigger).
func TestFenceCoversEveryCommunityScopedTable(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	scoped, err := deletion.ScopedTables(f.ctx, f.pool)
	require.NoError(t, err)
	fenced, err := deletion.FencedTables(f.ctx, f.pool)
	require.NoError(t, err)
	require.Contains(t, scoped, "events")
	require.Contains(t, scoped, "operator_listener_outbox")
	require.NotContains(t, scoped, "community_deletion_requests", "the control tables stay writable")
	require.Equal(t, scoped, fenced)
	require.NoError(t, deletion.CheckReady(f.ctx, f.pool))
}

// A write from a plain session after the fence fails, whatever the
// statement. Kills: the trigger returning before the state check.
func TestPlainSessionWriteAfterFenceFails(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	c := f.community("doomed.example")
	other := f.community("bystander.example")
	ch, ev, pk := uuid.New(), randomBytes(32), randomBytes(32)
	require.NoError(t, seedRows(f.ctx, f.pool, c, ch, ev, pk))
	f.fence("doomed.example")

	conn := f.plainConn()
	for _, stmt := range []string{
		`INSERT INTO users (community_id, pubkey) VALUES ($1, '\x` + "00000000000000000000000000000000000000000000000000000000000000ff" + `')`,
		`UPDATE users SET display_name = 'changed' WHERE community_id = $1`,
		`DELETE FROM events WHERE community_id = $1`,
		`UPDATE channels SET name = 'renamed' WHERE community_id = $1`,
	} {
		_, err := conn.Exec(f.ctx, stmt, c)
		require.Error(t, err, stmt)
		require.Equal(t, "55000", sqlState(err), "%s: %v", stmt, err)
		require.Contains(t, err.Error(), "community write fenced")
	}
	// The bystander writes on.
	require.NoError(t, insertUser(f.ctx, conn, other))
}

// The same from the psql binary an operator would use.
func TestPsqlWriteAfterFenceFails(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	c := f.community("psql-doomed.example")
	f.fence("psql-doomed.example")
	cmd := exec.Command(dbtest.PsqlPath(t), "-X", "-v", "ON_ERROR_STOP=1", "-c",
		"INSERT INTO users (community_id, pubkey) VALUES ('"+c.String()+"', '\\x"+"11111111111111111111111111111111111111111111111111111111111111ff"+"')",
		psqlURL(t, f))
	cmd.Env = append(os.Environ(), "PGTZ=UTC")
	out, err := cmd.CombinedOutput()
	require.Error(t, err, "%s", out)
	require.Contains(t, string(out), "community write fenced")
	var n int
	require.NoError(t, f.pool.QueryRow(f.ctx, `SELECT count(*) FROM users WHERE community_id = $1`, c).Scan(&n))
	require.Zero(t, n)
}

// psqlURL is the test database's URL without the pgx-only parameters
// psql refuses.
func psqlURL(t *testing.T, f *fixture) string {
	t.Helper()
	u, err := url.Parse(f.pool.Config().ConnString())
	require.NoError(t, err)
	q := u.Query()
	q.Del("timezone")
	u.RawQuery = q.Encode()
	return u.String()
}

// The fence waits for a writer that is already inside its transaction,
// and a writer that starts while the fence waits is rejected once the
// fence commits. Kills: removing the shared advisory lock from the write
// check (the late writer reads "active" and its row lands after the fence).
func TestFenceWaitsForOpenWriterAndRejectsTheNextOne(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	// From active to quiescing: the first step of the fence takes the
	// community's lock exclusively.
	c2 := f.community("racing2.example")
	req2 := f.submitAndApprove("racing2.example", nil)
	row2 := f.claim(req2.ID, "tester", 3600e9)

	early, err := f.pool.Begin(f.ctx)
	require.NoError(t, err)
	defer early.Rollback(f.ctx)
	require.NoError(t, insertUser(f.ctx, early, c2), "before the fence the write is admitted")

	quiesced := make(chan error, 1)
	go func() {
		quiesced <- f.q.DeletionRequestBeginQuiescing(f.ctx, db.DeletionRequestBeginQuiescingParams{ID: row2.ID, Owner: "tester", Generation: row2.LeaseGeneration})
	}()
	waitForAdvisoryWaiters(t, f, 1)

	late := make(chan error, 1)
	go func() {
		tx, err := f.pool.Begin(f.ctx)
		if err != nil {
			late <- err
			return
		}
		defer tx.Rollback(context.Background())
		if err := insertUser(f.ctx, tx, c2); err != nil {
			late <- err
			return
		}
		late <- tx.Commit(f.ctx)
	}()
	waitForAdvisoryWaiters(t, f, 2)
	select {
	case err := <-quiesced:
		t.Fatalf("the fence did not wait for the open writer: %v", err)
	default:
	}
	require.NoError(t, early.Commit(f.ctx))
	require.NoError(t, <-quiesced)
	err = <-late
	require.Error(t, err, "a writer queued behind the fence must not land")
	require.Equal(t, "55000", sqlState(err))
	var n int
	require.NoError(t, f.pool.QueryRow(f.ctx, `SELECT count(*) FROM users WHERE community_id = $1`, c2).Scan(&n))
	require.Equal(t, 1, n, "only the writer admitted before the fence")
}

// waitForAdvisoryWaiters waits until n sessions wait for an advisory lock.
func waitForAdvisoryWaiters(t *testing.T, f *fixture, n int) {
	t.Helper()
	eventually(t, func() bool {
		var waiting int
		err := f.pool.QueryRow(f.ctx, `SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted
			AND database = (SELECT oid FROM pg_database WHERE datname = current_database())`).Scan(&waiting)
		return err == nil && waiting >= n
	}, "sessions waiting on the community lock")
}

// Under REPEATABLE READ or SERIALIZABLE the state read would come from a
// snapshot older than the fence, so the write check refuses them first,
// before looking at any executor setting. Kills: moving the isolation
// check after the executor bypass.
func TestSnapshotIsolationRejectedBeforeForgedExecutorSettings(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	c := f.community("iso.example")
	row := f.fence("iso.example")
	for _, level := range []pgx.TxIsoLevel{pgx.RepeatableRead, pgx.Serializable} {
		tx, err := f.pool.BeginTx(f.ctx, pgx.TxOptions{IsoLevel: level})
		require.NoError(t, err)
		defer tx.Rollback(f.ctx)
		_, err = tx.Exec(f.ctx, `SELECT set_config('buzz.deletion_executor_community', $1, true),
			set_config('buzz.deletion_fence_generation', '1', true),
			set_config('buzz.deletion_lease_generation', $2, true)`, c.String(), strconv.FormatInt(row.LeaseGeneration, 10))
		require.NoError(t, err)
		err = insertUser(f.ctx, tx, c)
		require.Error(t, err)
		require.Equal(t, "25000", sqlState(err), "%s: %v", level, err)
		require.NoError(t, tx.Rollback(f.ctx))
	}
	// Even an active community refuses snapshot-isolation writes.
	other := f.community("iso-active.example")
	tx, err := f.pool.BeginTx(f.ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead})
	require.NoError(t, err)
	defer tx.Rollback(f.ctx)
	require.Equal(t, "25000", sqlState(insertUser(f.ctx, tx, other)))
}

// The executor's settings admit writes only with the live lease's
// generation: a dead executor's late write is refused. Kills: dropping the
// lease-generation check from the executor bypass.
func TestExecutorBypassNeedsTheLiveLeaseGeneration(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	c := f.community("gen.example")
	row := f.fence("gen.example")
	write := func(fence, lease string) error {
		tx, err := f.pool.Begin(f.ctx)
		require.NoError(t, err)
		defer tx.Rollback(f.ctx)
		_, err = tx.Exec(f.ctx, `SELECT set_config('buzz.deletion_executor_community', $1, true),
			set_config('buzz.deletion_fence_generation', $2, true),
			set_config('buzz.deletion_lease_generation', $3, true)`, c.String(), fence, lease)
		require.NoError(t, err)
		return insertUser(f.ctx, tx, c)
	}
	cur := func(n int64) string { return strconv.FormatInt(n, 10) }
	require.NoError(t, write("1", cur(row.LeaseGeneration)), "the live executor writes")
	require.Equal(t, "55000", sqlState(write("0", cur(row.LeaseGeneration))), "wrong fence generation")
	require.Equal(t, "55000", sqlState(write("1", cur(row.LeaseGeneration-1))), "an older lease generation")
	require.Equal(t, "55000", sqlState(write("1", "x")), "malformed")
}

// Writers of another community run in parallel with the fence and never
// fail; the fenced community gains no row after the fence returns. Kills:
// a write check that reads the wrong community's state.
func TestParallelWritersAcrossTheFence(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	doomed := f.community("par-doomed.example")
	bystander := f.community("par-bystander.example")
	var stop atomic.Bool
	var wg sync.WaitGroup
	var bystanderErrs, doomedOK, doomedFenced atomic.Int64
	for i := 0; i < 4; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			for !stop.Load() {
				if i%2 == 0 {
					if err := insertUser(f.ctx, f.pool, bystander); err != nil {
						bystanderErrs.Add(1)
					}
					continue
				}
				switch err := insertUser(f.ctx, f.pool, doomed); {
				case err == nil:
					doomedOK.Add(1)
				case sqlState(err) == "55000":
					doomedFenced.Add(1)
				default:
					bystanderErrs.Add(1)
				}
			}
		}(i)
	}
	eventually(t, func() bool { return doomedOK.Load() > 10 }, "writers running")
	f.fence("par-doomed.example")
	var atFence int
	require.NoError(t, f.pool.QueryRow(f.ctx, `SELECT count(*) FROM users WHERE community_id = $1`, doomed).Scan(&atFence))
	eventually(t, func() bool { return doomedFenced.Load() > 10 }, "fenced writes refused")
	stop.Store(true)
	wg.Wait()
	var after int
	require.NoError(t, f.pool.QueryRow(f.ctx, `SELECT count(*) FROM users WHERE community_id = $1`, doomed).Scan(&after))
	require.Equal(t, atFence, after, "no row of the fenced community lands after the fence")
	require.Zero(t, bystanderErrs.Load(), "the bystander never fails")
}

// The tombstone guard: nobody but the executor changes a non-active
// community's lifecycle, and a non-active community is never deleted.
// Kills: dropping the guard trigger.
func TestCommunityLifecycleOnlyMovesUnderTheExecutor(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	c := f.community("life.example")
	f.fence("life.example")
	_, err := f.pool.Exec(f.ctx, `UPDATE communities SET deletion_state = 'active' WHERE id = $1`, c)
	require.Equal(t, "55000", sqlState(err), "%v", err)
	_, err = f.pool.Exec(f.ctx, `DELETE FROM communities WHERE id = $1`, c)
	require.Equal(t, "55000", sqlState(err))
	require.Contains(t, err.Error(), "tombstones are permanent")
	// An active community's ordinary changes pass.
	other := f.community("life-other.example")
	_, err = f.pool.Exec(f.ctx, `UPDATE communities SET archived_at = now() WHERE id = $1`, other)
	require.NoError(t, err)
	_, err = f.pool.Exec(f.ctx, `UPDATE communities SET deletion_state = 'fenced' WHERE id = $1`, other)
	require.Equal(t, "55000", sqlState(err))
}

// A session cannot fool the fence or the tombstone guard with temporary
// tables of the names they read (pg_temp is searched first unless the
// search_path says otherwise, and TEMP is granted to everyone). Mutation
// killed: migration 032 without its search_path settings (the shadowed
// write lands in the fenced community, the tombstone guard lets the forged
// executor make the community active again).
func TestTemporaryTablesCannotShadowTheFence(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	c := f.community("shadow.example")
	f.fence("shadow.example")
	conn := f.plainConn()
	_, err := conn.Exec(f.ctx, `CREATE TEMP TABLE communities AS
		SELECT id, 'active'::text AS deletion_state, deletion_fence_generation FROM public.communities`)
	require.NoError(t, err)
	err = insertUser(f.ctx, conn, c)
	require.Equal(t, "55000", sqlState(err), "a write into the fenced community: %v", err)
	var allowed bool
	require.NoError(t, conn.QueryRow(f.ctx, `SELECT community_write_allowed($1)`, c).Scan(&allowed))
	require.False(t, allowed)

	_, err = conn.Exec(f.ctx, `CREATE TEMP TABLE community_deletion_requests AS
		SELECT $1::uuid AS community_id, 999::bigint AS lease_generation,
		       now() + interval '1 hour' AS lease_until, NULL::timestamptz AS blocked_at`, c)
	require.NoError(t, err)
	tx, err := conn.Begin(f.ctx)
	require.NoError(t, err)
	defer tx.Rollback(f.ctx)
	_, err = tx.Exec(f.ctx, `SELECT set_config('buzz.deletion_executor_community', $1, true),
		set_config('buzz.deletion_fence_generation', '1', true),
		set_config('buzz.deletion_lease_generation', '999', true)`, c.String())
	require.NoError(t, err)
	_, err = tx.Exec(f.ctx, `UPDATE public.communities SET deletion_state = 'active' WHERE id = $1`, c)
	require.Equal(t, "55000", sqlState(err), "a forged executor with a made-up lease: %v", err)
}

// The deletion request's guards are not fooled by temporary tables either:
// a made-up approval does not move a request to 'approved' (which would
// wedge it: unclaimable, and no real approval can follow), and a made-up
// request does not let its requester approve it. Mutation killed:
// migration 032 without the community_deletion_requests_guard line (the
// stage moves) or without the community_deletion_approvals_not_requester
// line (the self-approval is inserted).
func TestTemporaryTablesCannotShadowTheDeletionGuards(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.community("shadow-guards.example")
	req, err := deletion.Submit(f.ctx, f.pool, nil, "shadow-guards.example", "ops@example", "")
	require.NoError(t, err)
	conn := f.plainConn()
	_, err = conn.Exec(f.ctx, `CREATE TEMP TABLE community_deletion_approvals AS
		SELECT id AS request_id, community_id, inventory_digest FROM public.community_deletion_requests WHERE id = $1`, req.ID)
	require.NoError(t, err)
	_, err = conn.Exec(f.ctx, `UPDATE public.community_deletion_requests SET stage = 'approved' WHERE id = $1`, req.ID)
	require.ErrorContains(t, err, "no approval of this exact inventory")

	_, err = conn.Exec(f.ctx, `CREATE TEMP TABLE community_deletion_requests AS
		SELECT $1::uuid AS id, 'someone-else'::text AS requested_by`, req.ID)
	require.NoError(t, err)
	_, err = conn.Exec(f.ctx, `INSERT INTO public.community_deletion_approvals (request_id, community_id, inventory_digest, approved_by)
		SELECT id, community_id, inventory_digest, 'ops@example' FROM public.community_deletion_requests WHERE id = $1`, req.ID)
	require.ErrorContains(t, err, "who requested it; a second person approves")
	row, err := f.q.DeletionRequestGet(f.ctx, req.ID)
	require.NoError(t, err)
	require.Equal(t, deletion.StageInventoried, row.Stage)
}

// Serving-write leases: quiescing refuses new leases but renews an
// admitted one, whose transaction may still write; the fence waits until
// it is released. Kills: acquisition that ignores the state, or a fence
// that does not count live leases.
func TestServingLeasesDrainBeforeTheFence(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	c := f.community("lease.example")
	lease, err := f.q.ServingLeaseAcquire(f.ctx, db.ServingLeaseAcquireParams{CommunityID: c, Operation: "media_upload", Owner: "relay-1", LeaseSeconds: 60})
	require.NoError(t, err)
	req := f.submitAndApprove("lease.example", nil)
	row := f.claim(req.ID, "tester", 3600e9)
	require.NoError(t, f.q.DeletionRequestBeginQuiescing(f.ctx, db.DeletionRequestBeginQuiescingParams{ID: row.ID, Owner: "tester", Generation: row.LeaseGeneration}))

	_, err = f.q.ServingLeaseAcquire(f.ctx, db.ServingLeaseAcquireParams{CommunityID: c, Operation: "media_upload", Owner: "relay-2", LeaseSeconds: 60})
	require.Equal(t, "55000", sqlState(err), "no new lease while quiescing")
	renewed, err := f.q.ServingLeaseRenew(f.ctx, db.ServingLeaseRenewParams{ID: lease, LeaseSeconds: 60})
	require.NoError(t, err)
	require.True(t, renewed, "the admitted lease renews")

	// The admitted operation's database step still writes, a plain one not.
	require.Equal(t, "55000", sqlState(insertUser(f.ctx, f.pool, c)))
	err = pgx.BeginFunc(f.ctx, f.pool, func(tx pgx.Tx) error {
		if err := db.New(tx).ServingLeaseGuard(f.ctx, lease); err != nil {
			return err
		}
		return insertUser(f.ctx, tx, c)
	})
	require.NoError(t, err)

	_, err = f.q.DeletionRequestFence(f.ctx, db.DeletionRequestFenceParams{ID: row.ID, Owner: "tester", Generation: row.LeaseGeneration})
	require.Equal(t, "BZ003", sqlState(err), "%v", err)
	require.Contains(t, err.Error(), "1 live leases (media_upload)")
	released, err := f.q.ServingLeaseRelease(f.ctx, lease)
	require.NoError(t, err)
	require.True(t, released)
	gen, err := f.q.DeletionRequestFence(f.ctx, db.DeletionRequestFenceParams{ID: row.ID, Owner: "tester", Generation: row.LeaseGeneration})
	require.NoError(t, err)
	require.EqualValues(t, 1, gen)
}

// 100 lease acquisitions racing the quiesce cannot starve it: new leases
// are refused the moment it commits. Kills: acquisitions that skip the
// shared lock.
func TestLeaseAcquisitionsCannotStarveQuiescing(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	c := f.community("starve.example")
	req := f.submitAndApprove("starve.example", nil)
	row := f.claim(req.ID, "tester", 3600e9)
	var wg sync.WaitGroup
	var refused atomic.Int64
	for i := 0; i < 100; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			id, err := f.q.ServingLeaseAcquire(f.ctx, db.ServingLeaseAcquireParams{CommunityID: c, Operation: "op", Owner: "r", LeaseSeconds: 60})
			if err != nil {
				refused.Add(1)
				return
			}
			_, _ = f.q.ServingLeaseRelease(f.ctx, id)
		}()
	}
	require.NoError(t, f.q.DeletionRequestBeginQuiescing(f.ctx, db.DeletionRequestBeginQuiescingParams{ID: row.ID, Owner: "tester", Generation: row.LeaseGeneration}))
	wg.Wait()
	_, err := f.q.DeletionRequestFence(f.ctx, db.DeletionRequestFenceParams{ID: row.ID, Owner: "tester", Generation: row.LeaseGeneration})
	require.NoError(t, err, "every admitted lease was released; none was admitted after quiescing")
}

// A community-scoped table added without a fence makes readiness fail and
// blocks the deletion at claim, naming the table. Kills: a readiness check
// that compares against a hand list, or a claim that skips validation.
func TestUnfencedTableFailsReadinessAndBlocksClaim(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.community("drift.example")
	req := f.submitAndApprove("drift.example", nil)
	_, err := f.pool.Exec(f.ctx, `CREATE TABLE late_feature (community_id uuid NOT NULL, note text, PRIMARY KEY (community_id))`)
	require.NoError(t, err)
	err = deletion.CheckReady(f.ctx, f.pool)
	require.Error(t, err)
	require.Contains(t, err.Error(), "late_feature")

	row := f.claim(req.ID, "tester", 3600e9)
	require.NotNil(t, row.BlockedAt, "blocked, not claimed")
	require.Contains(t, *row.BlockedReason, "late_feature")
	require.Nil(t, row.LeaseOwner)
	exec := deletion.NewExecutor(deletion.Options{Pool: f.pool, Config: deletion.DefaultConfig()})
	_, err = exec.Run(f.ctx, req.ID)
	require.ErrorIs(t, err, deletion.ErrNotRunnable)

	_, err = f.pool.Exec(f.ctx, `SELECT attach_community_write_fence('late_feature')`)
	require.NoError(t, err)
	require.NoError(t, deletion.CheckReady(f.ctx, f.pool))
}

// The relay's /ready answers 503 naming an unfenced community-scoped
// table, and 200 once it is fenced. Kills: a readiness probe that skips
// the catalog check.
func TestRelayReadinessNamesAnUnfencedTable(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	relay := relaytest.StartOn(t, f.pool)
	get := func() (int, string) {
		resp, err := http.Get(relay.HTTPURL + "/ready")
		require.NoError(t, err)
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(body)
	}
	status, _ := get()
	require.Equal(t, http.StatusOK, status)
	_, err := f.pool.Exec(f.ctx, `CREATE TABLE unfenced_feature (community_id uuid NOT NULL PRIMARY KEY)`)
	require.NoError(t, err)
	status, body := get()
	require.Equal(t, http.StatusServiceUnavailable, status)
	require.Contains(t, body, "unfenced_feature")
	_, err = f.pool.Exec(f.ctx, `SELECT attach_community_write_fence('unfenced_feature')`)
	require.NoError(t, err)
	status, _ = get()
	require.Equal(t, http.StatusOK, status)
}

// Statements that sweep many communities skip a fenced one instead of
// failing for every community: a listener's removal of a target drops the
// bystander's queued row, the outbox claim claims the bystander's row, and
// the reaper reaps the bystander's old row, while the fenced community's
// rows stay for its deletion. Kills: dropping community_write_allowed from
// the removal, the outbox claim or the reaper (the whole statement then
// fails with 55000).
func TestFleetWideWritersSkipAFencedCommunity(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	doomed := f.community("fleet-doomed.test")
	bystander := f.community("fleet-bystander.test")
	listener := randomBytes(32)
	for _, c := range []uuid.UUID{doomed, bystander} {
		for _, age := range []string{"0", "1 hour"} {
			f.queueMention(listener, randomBytes(32), c, age)
		}
	}
	removedTarget := randomBytes(32)
	for _, c := range []uuid.UUID{doomed, bystander} {
		f.queueMention(listener, removedTarget, c, "0")
	}
	f.fence("fleet-doomed.test")
	dropped, err := f.q.OutboxDeleteUnsentForTargets(f.ctx, db.OutboxDeleteUnsentForTargetsParams{Listener: listener, Targets: [][]byte{removedTarget}})
	require.NoError(t, err)
	require.EqualValues(t, 1, dropped, "only the bystander's queued row")
	claimed, err := f.q.OutboxClaimDue(f.ctx, db.OutboxClaimDueParams{ClaimID: uuid.New(), LeaseMs: 60000, MaxAttempts: 10,
		RetentionMs: 15 * 60 * 1000, Routable: [][]byte{listener}, MaxRows: 10})
	require.NoError(t, err)
	require.Len(t, claimed, 1)
	require.Equal(t, bystander, claimed[0].CommunityID)
	reaped, err := f.q.OutboxReapExpired(f.ctx, db.OutboxReapExpiredParams{RetentionMs: 15 * 60 * 1000})
	require.NoError(t, err)
	require.EqualValues(t, 1, reaped, "only the bystander's old row")
	var left int
	require.NoError(t, f.pool.QueryRow(f.ctx, `SELECT count(*) FROM operator_listener_outbox WHERE community_id = $1`, doomed).Scan(&left))
	require.Equal(t, 3, left)
}

// queueMention stores a message of community and queues its notification
// of target for listener, the row created age ago.
func (f *fixture) queueMention(listener, target []byte, community uuid.UUID, age string) {
	f.t.Helper()
	_, err := f.pool.Exec(f.ctx, `
		WITH e AS (
		    INSERT INTO events (community_id, id, pubkey, created_at, kind, tags, content, sig)
		    VALUES ($3, $4, $5, date_trunc('second', now()), 9, '[]', 'hello', $6)
		    RETURNING id, created_at)
		INSERT INTO operator_listener_outbox (listener_pubkey, target_pubkey, community_id, event_id, event_kind, event_created_at, created_at)
		SELECT $1, $2, $3, e.id, 9, e.created_at, now() - $7::interval FROM e`,
		listener, target, community, randomBytes(32), randomBytes(32), randomBytes(64), age)
	require.NoError(f.t, err)
}

// The serving-lease reaper deletes expired leases of every community,
// fenced ones included, a bounded number per call. Kills: a reaper
// without its bound, or one that skips non-active communities.
func TestServingLeaseReaperIsBoundedAndGlobal(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	live := f.community("reap-live.test")
	fenced := f.community("reap-fenced.test")
	for _, c := range []uuid.UUID{live, live, fenced} {
		_, err := f.q.ServingLeaseAcquire(f.ctx, db.ServingLeaseAcquireParams{CommunityID: c, Operation: "op", Owner: "r", LeaseSeconds: 0.001})
		require.NoError(t, err)
	}
	keep, err := f.q.ServingLeaseAcquire(f.ctx, db.ServingLeaseAcquireParams{CommunityID: live, Operation: "op", Owner: "r", LeaseSeconds: 3600})
	require.NoError(t, err)
	f.fence("reap-fenced.test") // expired leases do not hold the fence
	eventually(t, func() bool {
		var expired int
		return f.pool.QueryRow(f.ctx, `SELECT count(*) FROM community_serving_write_leases WHERE lease_until < now()`).Scan(&expired) == nil && expired == 3
	}, "leases to expire")
	n, err := f.q.ServingLeasesReap(f.ctx, 2)
	require.NoError(t, err)
	require.EqualValues(t, 2, n, "bounded")
	n, err = f.q.ServingLeasesReap(f.ctx, 100)
	require.NoError(t, err)
	require.EqualValues(t, 1, n)
	var left []uuid.UUID
	rows, err := f.pool.Query(f.ctx, `SELECT id FROM community_serving_write_leases`)
	require.NoError(t, err)
	left, err = pgx.CollectRows(rows, pgx.RowTo[uuid.UUID])
	require.NoError(t, err)
	require.Equal(t, []uuid.UUID{keep}, left)
}

// A writer of the doomed community that never finishes (an open psql
// transaction, a relay cut off between its INSERT and COMMIT) must not
// hold up other communities: while the fence waits for the community's
// lock, every session asking for it queues behind the fence, and the
// outbox claim asks for it as soon as it meets one of the community's
// rows, so every community's deliveries stopped for as long as the
// writer stayed open. The fence now gives up after a bound, the claim
// goes on, and the request records why it did not fence.
// Mutation killed: no lock_timeout around quiescing (the fence waits for
// the writer, the bystander's claim waits behind it until its deadline).
func TestFenceGivesUpOnAStuckWriterInsteadOfStallingOtherCommunities(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	const doomedHost = "stuck-doomed.test"
	doomed := f.community(doomedHost)
	bystander := f.community("stuck-bystander.test")
	listener := randomBytes(32)
	f.queueMention(listener, randomBytes(32), doomed, "0")
	f.queueMention(listener, randomBytes(32), bystander, "0")

	stuck, err := f.pool.Begin(f.ctx)
	require.NoError(t, err)
	defer stuck.Rollback(context.Background())
	require.NoError(t, insertUser(f.ctx, stuck, doomed))

	req := f.submitAndApprove(doomedHost, nil)
	exec := deletion.NewExecutor(deletion.Options{Pool: f.pool, ID: "exec-stuck", Config: testConfig()})
	type result struct {
		out deletion.Outcome
		err error
	}
	ran := make(chan result, 1)
	go func() {
		out, err := exec.Run(f.ctx, req.ID)
		ran <- result{out, err}
	}()
	waitForAdvisoryWaiters(t, f, 1)

	// The deadline only turns a hang into a failure.
	ctx, cancel := context.WithTimeout(f.ctx, 30*time.Second)
	defer cancel()
	claimed, err := f.q.OutboxClaimDue(ctx, db.OutboxClaimDueParams{ClaimID: uuid.New(), LeaseMs: 60000, MaxAttempts: 10,
		RetentionMs: 15 * 60 * 1000, Routable: [][]byte{listener}, MaxRows: 10})
	require.NoError(t, err, "the claim for every community waited behind the fence")
	require.Len(t, claimed, 2, "the doomed community was still active")

	var r result
	select {
	case r = <-ran:
	case <-ctx.Done():
		t.Fatal("the fence is still waiting for the stuck writer")
	}
	require.NoError(t, r.err)
	require.Equal(t, deletion.StageApproved, r.out.Stage)
	require.NotNil(t, r.out.LastError)
	require.Contains(t, *r.out.LastError, "held its lock")
	require.Nil(t, r.out.BlockedReason, "a transient failure, retried later")
	row, err := f.q.CommunityByHost(f.ctx, doomedHost)
	require.NoError(t, err)
	require.Equal(t, "active", row.DeletionState, "quiescing never committed")
	require.NoError(t, stuck.Commit(f.ctx), "the stuck writer was admitted before the deletion began")
}
