package workflow_test

import (
	"os"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/buzzrelay/buzz/internal/db"
	"github.com/buzzrelay/buzz/internal/dbtest"
)

// The poll and the by-id claim come from one template and differ only in
// the by-id line, so a condition added to one is in the other. Mutation
// killed: editing one rendered query by hand (or a template branch that
// adds anything else to one of them) fails the comparison.
func TestRunClaimsDifferOnlyInTheByIDLine(t *testing.T) {
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
	require.Contains(t, due, "FOR UPDATE OF r SKIP LOCKED")
	require.Equal(t, strings.TrimSpace(due), strings.TrimSpace(strings.ReplaceAll(byID, "      AND r.id = ANY(@ids::uuid[])\n", "")))
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
	raw, err := os.ReadFile("../../queries/workflow_approvals.sql")
	require.NoError(t, err)
	_, expire, ok := strings.Cut(string(raw), "-- name: WorkflowApprovalsExpire :many\n")
	require.True(t, ok)
	var statement []string
	for _, line := range strings.Split(expire, "\n") {
		if !strings.HasPrefix(strings.TrimSpace(line), "--") {
			statement = append(statement, line)
		}
	}
	expire, _, _ = strings.Cut(strings.Join(statement, "\n"), ";")
	expire = strings.ReplaceAll(expire, "sqlc.narg('now')", "NULL")
	var plan []map[string]any
	require.NoError(t, tx.QueryRow(f.ctx, "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) "+expire).Scan(&plan))
	top := plan[0]["Plan"].(map[string]any)
	require.EqualValues(t, 1, top["Actual Rows"], "the one pending approval past its expiry")
	buffers := top["Shared Hit Blocks"].(float64) + top["Shared Read Blocks"].(float64)
	require.Less(t, buffers, float64(60), "buffers the expirer touched, of 150,000 approvals (3 pending)")
}
