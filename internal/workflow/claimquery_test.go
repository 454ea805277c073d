package workflow_test

import (
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/buzzrelay/buzz/internal/db"
	"github.com/buzzrelay/buzz/internal/dbtest"
	"github.com/buzzrelay/buzz/internal/workflow"
)

// The poll and the by-id claim come from one template and differ only in
// how they find pending runs (the poll per community, the by-id claim by
// primary key) and which runs the expired scan reads, so a condition added
// to the rest of one is in the other. Mutation killed: editing one rendered
// query by hand (or a template branch that adds anything else to one of
// them) fails the comparison.
func TestRunClaimsDifferOnlyInHowTheyFindRuns(t *testing.T) {
	t.Parallel()
	raw, err := os.ReadFile("../../queries/workflow_run_claim.gen.sql")
	require.NoError(t, err)
	parts := strings.Split(string(raw), "-- name: ")
	require.Len(t, parts, 3)
	sqlOf := func(part string) string {
		var lines []string
		for _, line := range strings.Split(part, "\n")[1:] {
			if !strings.HasPrefix(strings.TrimSpace(line), "--") {
				lines = append(lines, line)
			}
		}
		return strings.Join(lines, "\n")
	}
	due, byID := sqlOf(parts[1]), sqlOf(parts[2])
	require.True(t, strings.HasPrefix(parts[1], "WorkflowRunClaimDue "))
	require.True(t, strings.HasPrefix(parts[2], "WorkflowRunClaimByID "))
	// From the expired scan on.
	_, due, ok := strings.Cut(due, "expired AS (")
	require.True(t, ok)
	pendingByID, byID, ok := strings.Cut(byID, "expired AS (")
	require.True(t, ok)
	const byKey = "(SELECT unnest(@communities::uuid[]) AS community_id, unnest(@ids::uuid[]) AS id) h\n" +
		"    JOIN workflow_runs r ON r.community_id = h.community_id AND r.id = h.id\n"
	require.Contains(t, pendingByID, byKey)
	require.Contains(t, due, "FOR UPDATE OF r SKIP LOCKED")
	require.Equal(t, strings.TrimSpace(due), strings.TrimSpace(strings.Replace(byID, byKey, "workflow_runs r\n", 1)))
}

// The poll reads about as many runs as it claims, however many are due (a
// burst of triggers, a worker pool back after an outage): it must not read
// and sort every due run on every tick. It still takes the oldest due runs
// first, runs whose worker died among them. Rows read are counted by
// PostgreSQL for the claim's own transaction (pg_stat_xact_user_tables).
//
// Mutation killed: the candidates as one scan with "pending OR expired"
// (the claim before): it reads all 20,000 due runs.
func TestRunClaimReadsItsRunsNotTheBacklog(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	owner := f.key()
	workflowID := uuid.NewString()
	f.save(owner, f.channel(owner), workflowID, twoSteps)
	const backlog = 20000
	_, err := f.pool.Exec(f.ctx, `
		INSERT INTO workflow_runs (community_id, id, workflow_id, run_at)
		SELECT $1, gen_random_uuid(), $2, now() - interval '1 minute' + i * interval '1 millisecond'
		FROM generate_series(1, $3::int) AS i`, f.tenant.ID(), workflowID, backlog)
	require.NoError(t, err)
	// Three runs whose worker died mid-step, due before any pending run.
	_, err = f.pool.Exec(f.ctx, `
		UPDATE workflow_runs
		SET status = 'running', claim_id = gen_random_uuid(), lease_until = now() - interval '1 second',
		    attempts = 1, run_at = now() - interval '2 minutes'
		WHERE id IN (SELECT id FROM workflow_runs ORDER BY run_at DESC LIMIT 3)`)
	require.NoError(t, err)
	_, err = f.pool.Exec(f.ctx, `ANALYZE workflow_runs`)
	require.NoError(t, err)

	tx, err := f.pool.Begin(f.ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(f.ctx) }()
	before := dbtest.RowsRead(t, tx, "workflow_runs")
	claimed, err := db.New(tx).WorkflowRunClaimDue(f.ctx, db.WorkflowRunClaimDueParams{
		ClaimID: uuid.New(), LeaseMs: time.Minute.Milliseconds(), MaxRows: 10, CommunityShare: 10,
	})
	require.NoError(t, err)
	require.Len(t, claimed, 10)
	resumed := 0
	for _, r := range claimed {
		if r.Attempts == 2 {
			resumed++
		}
	}
	require.Equal(t, 3, resumed, "the runs with expired leases are the oldest due")

	read := dbtest.RowsRead(t, tx, "workflow_runs") - before
	require.Less(t, read, int64(100), "rows the claim read, of a %d-run backlog", backlog)
}

// The approval expirer runs on every scheduler tick (each
// BUZZ_WORKFLOW_POLL, on every relay process) across all communities, and
// decided approvals are kept for good: it must read the pending ones, not
// an index of every approval ever made. Buffers are PostgreSQL's count for
// the statement (EXPLAIN ANALYZE, rolled back).
//
// Mutation killed: without migration 030's partial index the statement
// walks workflow_approvals_by_status whole (about 140 buffers here, 22
// with it).
func TestApprovalExpiryReadsPendingApprovalsOnly(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	owner := f.key()
	workflowID := uuid.NewString()
	f.save(owner, f.channel(owner), workflowID, twoSteps)
	_, err := f.pool.Exec(f.ctx, `
		WITH run AS (
			INSERT INTO workflow_runs (community_id, id, workflow_id) VALUES ($1, gen_random_uuid(), $2) RETURNING id
		)
		INSERT INTO workflow_approvals (community_id, token, workflow_id, run_id, step_id, step_index, status, expires_at)
		SELECT $1, sha256(i::text::bytea), $2, run.id, 'approve', 0,
		       CASE WHEN i <= 3 THEN 'pending' WHEN i % 2 = 0 THEN 'granted' ELSE 'denied' END::workflow_approval_status,
		       now() + CASE WHEN i = 1 THEN interval '-1 minute' ELSE interval '1 hour' END
		FROM run, generate_series(1, 150000) AS i`, f.tenant.ID(), workflowID)
	require.NoError(t, err)
	_, err = f.pool.Exec(f.ctx, `ANALYZE workflow_approvals`)
	require.NoError(t, err)

	tx, err := f.pool.Begin(f.ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(f.ctx) }()
	explain := func(name string, args ...any) map[string]any {
		raw, err := os.ReadFile("../../queries/workflow_approvals.sql")
		require.NoError(t, err)
		_, text, ok := strings.Cut(string(raw), "-- name: "+name+" ")
		require.True(t, ok)
		var statement []string
		for _, line := range strings.Split(text, "\n")[1:] {
			if !strings.HasPrefix(strings.TrimSpace(line), "--") {
				statement = append(statement, line)
			}
		}
		text, _, _ = strings.Cut(strings.Join(statement, "\n"), ";")
		text = strings.ReplaceAll(text, "sqlc.narg('now')", "NULL")
		text = strings.ReplaceAll(text, "@max_ms", "$1")
		var plan []map[string]any
		require.NoError(t, tx.QueryRow(f.ctx, "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) "+text, args...).Scan(&plan))
		return plan[0]["Plan"].(map[string]any)
	}
	buffers := func(plan map[string]any) float64 {
		return plan["Shared Hit Blocks"].(float64) + plan["Shared Read Blocks"].(float64)
	}
	top := explain("WorkflowApprovalsExpire")
	require.EqualValues(t, 1, top["Actual Rows"], "the one pending approval past its expiry")
	require.Less(t, buffers(top), float64(60), "buffers the expirer touched, of 150,000 approvals (3 pending)")
	// The clamp of approvals due beyond the maximum timeout, run before it
	// every tick, reads the far end of the same index.
	clamp := explain("WorkflowApprovalsClampExpiry", workflow.MaxApprovalTimeout.Milliseconds())
	require.Less(t, buffers(clamp), float64(20), "buffers the clamp touched, of 150,000 approvals (3 pending, none beyond the maximum)")
}

// A community at its share of the worker's slots waits while others have
// runs due, and its backlog does not make the claim of the others' runs
// slower: the poll reads about the runs it takes, not the 20,000 runs of
// the waiting community due before them. The hand-off's claim reads the
// runs handed to it, not every run of the table. Rows read are counted by
// PostgreSQL for the claim's own transaction (pg_stat_xact_user_tables).
//
// Mutations killed: the poll's pending runs found in run_at order across
// communities (the claim before migration 036) reads all 20,000; the
// by-id claim finding runs by id alone (the claim before) walks the whole
// primary key.
func TestRunClaimReadsItsRunsNotAWaitingCommunitysBacklog(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	b := backlogFixture(t, f, 20000, 20)
	a := f.tenant.ID()

	claim := func(name string, fn func(q *db.Queries) (communities []uuid.UUID, err error)) []uuid.UUID {
		tx, err := f.pool.Begin(f.ctx)
		require.NoError(t, err)
		defer func() { _ = tx.Rollback(f.ctx) }()
		before := dbtest.RowsRead(t, tx, "workflow_runs")
		got, err := fn(db.New(tx))
		require.NoError(t, err)
		read := dbtest.RowsRead(t, tx, "workflow_runs") - before
		require.Less(t, read, int64(100), "%s: rows the claim read, of a 20,000-run backlog", name)
		return got
	}
	got := claim("poll", func(q *db.Queries) ([]uuid.UUID, error) {
		rows, err := q.WorkflowRunClaimDue(f.ctx, db.WorkflowRunClaimDueParams{
			ClaimID: uuid.New(), LeaseMs: time.Minute.Milliseconds(), MaxRows: 10,
			FullCommunities: []uuid.UUID{a}, CommunityShare: 5,
		})
		out := make([]uuid.UUID, len(rows))
		for i, r := range rows {
			out[i] = r.CommunityID
		}
		return out, err
	})
	require.Equal(t, []uuid.UUID{b.ID(), b.ID(), b.ID(), b.ID(), b.ID()}, got, "B's share, none of A's")

	// The hand-off's claim reads index entries it does not return when it
	// walks a key (rows read do not show them): its pending scan's buffers
	// are counted instead (EXPLAIN ANALYZE, BUFFERS, rolled back).
	var ids, communities []uuid.UUID
	require.NoError(t, f.pool.QueryRow(f.ctx, `
		SELECT array_agg(id), array_agg(community_id)
		FROM (SELECT id, community_id FROM workflow_runs WHERE community_id = $1 ORDER BY run_at DESC LIMIT 10) r`, a).
		Scan(&ids, &communities))
	tx, err := f.pool.Begin(f.ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(f.ctx) }()
	q := &capture{Tx: tx}
	rows, err := db.New(q).WorkflowRunClaimByID(f.ctx, db.WorkflowRunClaimByIDParams{
		ClaimID: uuid.New(), LeaseMs: time.Minute.Milliseconds(), MaxRows: 10,
		Communities: communities, Ids: ids, CommunityShare: 10,
	})
	require.NoError(t, err)
	got = nil
	for _, r := range rows {
		got = append(got, r.ID)
	}
	require.ElementsMatch(t, ids, got, "the handed-off runs")
	_, err = tx.Exec(f.ctx, "ROLLBACK AND CHAIN")
	require.NoError(t, err)
	var plan []map[string]any
	require.NoError(t, tx.QueryRow(f.ctx, "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) "+q.sql, q.args...).Scan(&plan))
	var pending map[string]any
	for _, node := range plan[0]["Plan"].(map[string]any)["Plans"].([]any) {
		if n := node.(map[string]any); n["Subplan Name"] == "CTE pending" {
			pending = n
		}
	}
	require.NotNil(t, pending)
	buffers := pending["Shared Hit Blocks"].(float64) + pending["Shared Read Blocks"].(float64)
	// About 60 here (10 runs looked up and locked); a walk of the key: 1,600.
	require.Less(t, buffers, float64(200), "buffers the hand-off's pending scan read")
}

// A community's runs due before another's do not hide the other's from the
// claim: with a claim of ten and a share of five, community A's 20,000 due
// runs, first in line, give five and community B's, behind them, the other
// five, in the same claim (the worker holds none of either yet).
//
// Mutation killed: pending runs read in run_at order across communities up
// to the claim's limit, then cut to each community's share (the claim
// before): the ten read are A's, five are cut, and B gets none this claim.
func TestRunClaimTakesEachCommunitysShareInOneClaim(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	b := backlogFixture(t, f, 20000, 20)
	rows, err := db.New(f.pool).WorkflowRunClaimDue(f.ctx, db.WorkflowRunClaimDueParams{
		ClaimID: uuid.New(), LeaseMs: time.Minute.Milliseconds(), MaxRows: 10, CommunityShare: 5,
	})
	require.NoError(t, err)
	per := map[uuid.UUID]int{}
	for _, r := range rows {
		per[r.CommunityID]++
	}
	require.Equal(t, map[uuid.UUID]int{f.tenant.ID(): 5, b.ID(): 5}, per)
}

// Four claimers, each with its own engine and connection, claim one
// database's due runs of three communities at once, by poll and by
// hand-off, until every run is claimed: no run is claimed twice.
//
// Mutation killed: the poll's per-community scan without FOR UPDATE SKIP
// LOCKED (two claims read the same runs and the second's UPDATE, waiting
// for the first, claims them again).
func TestParallelClaimsNeverClaimARunTwice(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	owner := f.key()
	aWorkflow := uuid.NewString()
	f.save(owner, f.channel(owner), aWorkflow, twoSteps)
	f.dueRuns(f.tenant.ID(), aWorkflow, 300, time.Minute)
	byCommunity := map[uuid.UUID][]uuid.UUID{}
	for range 2 {
		c, wf := f.otherCommunity()
		f.dueRuns(c.ID(), wf, 100, time.Minute)
	}
	rows, err := f.pool.Query(f.ctx, `SELECT community_id, id FROM workflow_runs`)
	require.NoError(t, err)
	total := 0
	for rows.Next() {
		var c, id uuid.UUID
		require.NoError(t, rows.Scan(&c, &id))
		byCommunity[c] = append(byCommunity[c], id)
		total++
	}
	require.NoError(t, rows.Err())
	require.Equal(t, 500, total)

	var mu sync.Mutex
	claimed := map[uuid.UUID]int{}
	var wg sync.WaitGroup
	for i := range 4 {
		e := f.engine(time.Hour)
		wg.Add(1)
		go func() {
			defer wg.Done()
			for n := 0; ; n++ {
				var got []workflow.Claimed
				var err error
				if (i+n)%2 == 0 {
					got, err = e.ClaimDue(f.ctx, 7)
				} else {
					// A hand-off of runs others may be claiming too.
					for c, ids := range byCommunity {
						start := (i*37 + n*11) % len(ids)
						got, err = e.ClaimByID(f.ctx, c, ids[start:min(start+5, len(ids))])
						break
					}
				}
				if !assert.NoError(t, err) {
					return
				}
				mu.Lock()
				for _, c := range got {
					claimed[c.Run.ID]++
				}
				done := len(claimed) == total
				mu.Unlock()
				if done || n > 2000 {
					return
				}
			}
		}()
	}
	wg.Wait()
	require.Len(t, claimed, total, "every run claimed")
	for id, n := range claimed {
		require.Equal(t, 1, n, "run %s claimed %d times", id, n)
	}
	require.Zero(t, f.count(`SELECT count(*) FROM workflow_runs WHERE attempts <> 1`))
}

// The poll skips the runs of a community being deleted (its writes are
// fenced) instead of failing for every community: the bystander's runs,
// due after the fenced community's, are claimed.
//
// Mutation killed: the poll's per-community scan without
// community_write_allowed (the claim's UPDATE of the fenced community's
// runs fails the whole statement with 55000).
func TestRunClaimSkipsACommunityBeingDeleted(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	b := backlogFixture(t, f, 30, 20)
	tx, err := f.pool.Begin(f.ctx)
	require.NoError(t, err)
	// Fenced as its deletion's executor would, without the executor.
	_, err = tx.Exec(f.ctx, `SET LOCAL session_replication_role = replica`)
	require.NoError(t, err)
	_, err = tx.Exec(f.ctx, `UPDATE communities SET deletion_state = 'fenced' WHERE id = $1`, f.tenant.ID())
	require.NoError(t, err)
	require.NoError(t, tx.Commit(f.ctx))

	rows, err := db.New(f.pool).WorkflowRunClaimDue(f.ctx, db.WorkflowRunClaimDueParams{
		ClaimID: uuid.New(), LeaseMs: time.Minute.Milliseconds(), MaxRows: 10, CommunityShare: 10,
	})
	require.NoError(t, err)
	require.Len(t, rows, 10)
	for _, r := range rows {
		require.Equal(t, b.ID(), r.CommunityID)
	}
}

// The poll walks the communities with pending runs to find those whose
// oldest run is due. Communities whose runs are all delayed (a delay step,
// a retry) are passed over a window of index entries at a time, not one
// index descent each: with 1,500 such communities (one holding 300 delayed
// runs, across several windows) and 4 due among them, the claim takes
// exactly the due ones' runs and B's share, reading about a buffer per
// community.
// Buffers are PostgreSQL's count for the statement (EXPLAIN ANALYZE,
// BUFFERS, rolled back).
//
// Mutation killed: the walk's step as one descent per community (the
// claim of migration 036, without the window): about 4,800 buffers here.
// The window's end not a stop (the walk then ends at the first 128
// delayed communities in a row): the due communities after them are not
// claimed.
func TestRunClaimPassesOverDelayedCommunitiesInBulk(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	b := backlogFixture(t, f, 0, 20)
	// Communities with ids in a known order: 50, 450, 850 and 1,250 have a
	// due run (more than a window of delayed ones apart), the others one
	// delayed run, and 700 has 300.
	var due []uuid.UUID
	rows, err := f.pool.Query(f.ctx, `
		WITH c AS (
			INSERT INTO communities (id, host)
			SELECT ('00000000-0000-0000-0000-' || lpad(i::text, 12, '0'))::uuid, 'walk-' || i || '.example'
			FROM generate_series(1, 1500) AS i
			RETURNING id
		), w AS (
			INSERT INTO workflows (community_id, id, name, owner_pubkey, definition, definition_hash)
			SELECT c.id, gen_random_uuid(), 'W', sha256('o'), '{}', sha256('d') FROM c
			RETURNING community_id, id
		), r AS (
			INSERT INTO workflow_runs (community_id, id, workflow_id, run_at)
			SELECT w.community_id, gen_random_uuid(), w.id,
			       CASE WHEN right(w.community_id::text, 12)::int % 400 = 50
			            THEN now() - interval '1 minute' ELSE now() + interval '1 hour' END
			FROM w
			CROSS JOIN LATERAL generate_series(1, CASE WHEN right(w.community_id::text, 12)::int = 700 THEN 300 ELSE 1 END)
			RETURNING community_id, run_at
		)
		SELECT community_id FROM r WHERE run_at < now()`)
	require.NoError(t, err)
	for rows.Next() {
		var c uuid.UUID
		require.NoError(t, rows.Scan(&c))
		due = append(due, c)
	}
	require.NoError(t, rows.Err())
	require.Len(t, due, 4)
	_, err = f.pool.Exec(f.ctx, `VACUUM ANALYZE workflow_runs`)
	require.NoError(t, err)

	tx, err := f.pool.Begin(f.ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(f.ctx) }()
	q := &capture{Tx: tx}
	claimed, err := db.New(q).WorkflowRunClaimDue(f.ctx, db.WorkflowRunClaimDueParams{
		ClaimID: uuid.New(), LeaseMs: time.Minute.Milliseconds(), MaxRows: 40, CommunityShare: 5,
	})
	require.NoError(t, err)
	per := map[uuid.UUID]int{}
	for _, r := range claimed {
		per[r.CommunityID]++
	}
	want := map[uuid.UUID]int{b.ID(): 5}
	for _, c := range due {
		want[c] = 1
	}
	require.Equal(t, want, per, "every due community's runs, no delayed one's")

	_, err = tx.Exec(f.ctx, "ROLLBACK AND CHAIN")
	require.NoError(t, err)
	var plan []map[string]any
	require.NoError(t, tx.QueryRow(f.ctx, "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) "+q.sql, q.args...).Scan(&plan))
	top := plan[0]["Plan"].(map[string]any)
	buffers := top["Shared Hit Blocks"].(float64) + top["Shared Read Blocks"].(float64)
	t.Logf("buffers: %v", buffers)
	// About 400 here (up to a heap page per community where the visibility
	// map is not set: 1,500); a descent per community: 4,800.
	require.Less(t, buffers, float64(3000), "buffers the claim read, passing 1,496 delayed communities")
}

// The scheduler reads the scheduled workflows on every tick (every
// BUZZ_WORKFLOW_POLL, on every relay process), for every community. Any
// member may save 20 workflows in each channel and create channels, so the
// workflows of every other trigger (messages, reactions, webhooks) must
// cost the tick nothing: without an index of the scheduled ones it read
// every active workflow's whole definition (the trigger sits inside the
// jsonb, which is detoasted to reach it), every second, on every process.
//
// Mutation killed: without migration 052's partial index the statement
// scans the table and reads all 20,001 workflows to return one.
func TestScheduleTickReadsScheduledWorkflowsOnly(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	owner := f.key()
	ch := f.channel(owner)
	message := uuid.NewString()
	f.save(owner, ch, message, twoSteps)
	scheduled := uuid.NewString()
	f.save(owner, ch, scheduled, "name: Tick\ntrigger: {on: schedule, interval: 1h}\nsteps: [{id: a, action: delay, duration: 1s}]")
	const others = 20000
	_, err := f.pool.Exec(f.ctx, `
		INSERT INTO workflows (community_id, id, name, owner_pubkey, channel_id, definition, definition_hash, definition_event_id)
		SELECT community_id, gen_random_uuid(), name, owner_pubkey, channel_id, definition, definition_hash, definition_event_id
		FROM workflows, generate_series(1, $2::int)
		WHERE id = $1`, message, others)
	require.NoError(t, err)
	_, err = f.pool.Exec(f.ctx, `ANALYZE workflows`)
	require.NoError(t, err)

	tx, err := f.pool.Begin(f.ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(f.ctx) }()
	before := dbtest.RowsRead(t, tx, "workflows")
	rows, err := db.New(tx).WorkflowsScheduled(f.ctx, nil)
	require.NoError(t, err)
	require.Len(t, rows, 1)
	require.Equal(t, scheduled, rows[0].ID.String())
	read := dbtest.RowsRead(t, tx, "workflows") - before
	require.Less(t, read, int64(100), "rows the tick read, beside %d message-triggered workflows", others)
}
