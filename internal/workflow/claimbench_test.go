package workflow_test

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/buzzrelay/buzz/internal/community"
	"github.com/buzzrelay/buzz/internal/db"
	"github.com/buzzrelay/buzz/internal/ingest"
	"github.com/buzzrelay/buzz/internal/nostr"
	"github.com/buzzrelay/buzz/internal/workflow"
)

// backlogFixture: community A (the fixture's) with backlog due pending runs,
// all older than community B's due runs (bRuns of them). Returns B.
func backlogFixture(tb testing.TB, f *fixture, backlog, bRuns int) community.Tenant {
	tb.Helper()
	owner := f.key()
	aWorkflow := uuid.NewString()
	f.save(owner, f.channel(owner), aWorkflow, twoSteps)
	_, err := f.pool.Exec(f.ctx, `
		INSERT INTO workflow_runs (community_id, id, workflow_id, run_at)
		SELECT $1, gen_random_uuid(), $2, now() - interval '1 hour' + i * interval '1 millisecond'
		FROM generate_series(1, $3::int) AS i`, f.tenant.ID(), aWorkflow, backlog)
	require.NoError(tb, err)

	row, err := db.New(f.pool).CommunityCreate(f.ctx, "wf-b-"+uuid.NewString()[:8]+".example")
	require.NoError(tb, err)
	b := community.FromRow(row)
	storeB := func(ev *nostr.Event) {
		out, _, err := f.p.SubmitReply(f.ctx, b, ev.PubKey, ev)
		require.NoError(tb, err)
		require.Equal(tb, ingest.Stored, out)
	}
	bOwner, bChannel, bWorkflow := f.key(), uuid.NewString(), uuid.NewString()
	storeB(f.sign(bOwner, ingest.KindCreateGroup, "", nostr.Tags{{"h", bChannel}, {"name", "b"}}))
	storeB(f.sign(bOwner, workflow.KindDefinition, twoSteps, nostr.Tags{{"d", bWorkflow}, {"h", bChannel}}))
	_, err = f.pool.Exec(f.ctx, `
		INSERT INTO workflow_runs (community_id, id, workflow_id, run_at)
		SELECT $1, gen_random_uuid(), $2, now() - interval '1 second' + i * interval '1 millisecond'
		FROM generate_series(1, $3::int) AS i`, b.ID(), bWorkflow, bRuns)
	require.NoError(tb, err)
	_, err = f.pool.Exec(f.ctx, `VACUUM ANALYZE workflow_runs`)
	require.NoError(tb, err)
	return b
}

// capture is a db.DBTX that records the statement and arguments of the
// query it runs, for EXPLAIN.
type capture struct {
	pgx.Tx
	sql  string
	args []any
}

func (c *capture) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	c.sql, c.args = sql, args
	return c.Tx.Query(ctx, sql, args...)
}

// BenchmarkClaimBehindOneCommunitysBacklog: a claim while community A,
// holding its share of the worker's slots, has 200,000 due runs older than
// community B's (ns/op and ms/claim are one claim; each is rolled back, so
// every claim sees the same backlog): the poll (due), and the hand-off's
// claim of B's runs by id (byid). The claim must take B's runs at about the
// cost of a claim with no backlog. The plans (EXPLAIN ANALYZE, BUFFERS) are
// printed once.
func BenchmarkClaimBehindOneCommunitysBacklog(b *testing.B) {
	for _, backlog := range []int{0, 200000} {
		f := newFixtureWith(b, ingest.Options{}, workflow.Triggers{})
		other := backlogFixture(b, f, backlog, 20)
		var ids []uuid.UUID
		rows, err := f.pool.Query(f.ctx, `SELECT id FROM workflow_runs WHERE community_id = $1`, other.ID())
		require.NoError(b, err)
		ids, err = pgx.CollectRows(rows, pgx.RowTo[uuid.UUID])
		require.NoError(b, err)
		due := db.WorkflowRunClaimDueParams{
			ClaimID: uuid.New(), LeaseMs: time.Minute.Milliseconds(), MaxRows: 10,
			FullCommunities: []uuid.UUID{f.tenant.ID()}, CommunityShare: 5,
		}
		byID := db.WorkflowRunClaimByIDParams{
			ClaimID: due.ClaimID, LeaseMs: due.LeaseMs, MaxRows: int32(len(ids)), Ids: ids,
			FullCommunities: due.FullCommunities, CommunityShare: due.CommunityShare,
		}
		inTx := func(fn func(tx pgx.Tx)) {
			tx, err := f.pool.Begin(f.ctx)
			require.NoError(b, err)
			defer func() { require.NoError(b, tx.Rollback(f.ctx)) }()
			fn(tx)
		}
		for _, c := range []struct {
			name  string
			claim func(tx db.DBTX) ([]uuid.UUID, error)
		}{
			{"due",
				func(tx db.DBTX) ([]uuid.UUID, error) {
					rows, err := db.New(tx).WorkflowRunClaimDue(f.ctx, due)
					out := make([]uuid.UUID, len(rows))
					for i, r := range rows {
						out[i] = r.CommunityID
					}
					return out, err
				}},
			{"byid",
				func(tx db.DBTX) ([]uuid.UUID, error) {
					rows, err := db.New(tx).WorkflowRunClaimByID(f.ctx, byID)
					out := make([]uuid.UUID, len(rows))
					for i, r := range rows {
						out[i] = r.CommunityID
					}
					return out, err
				}},
		} {
			b.Run("claim="+c.name+"/backlog="+itoa(int64(backlog)), func(b *testing.B) {
				inTx(func(tx pgx.Tx) {
					got, err := c.claim(tx)
					require.NoError(b, err)
					require.Len(b, got, 5, "community B's share")
					for _, community := range got {
						require.Equal(b, other.ID(), community)
					}
				})
				// The plans, custom (this claim's values) then generic (what a
				// prepared statement may settle on), printed whole: a
				// benchmark's log is cut short.
				for _, mode := range []string{"force_custom_plan", "force_generic_plan"} {
					inTx(func(tx pgx.Tx) {
						q := &capture{Tx: tx}
						_, err := c.claim(q)
						require.NoError(b, err)
						_, err = tx.Exec(f.ctx, "ROLLBACK AND CHAIN")
						require.NoError(b, err)
						_, err = tx.Exec(f.ctx, "SET LOCAL plan_cache_mode = "+mode)
						require.NoError(b, err)
						plan, err := tx.Query(f.ctx, "EXPLAIN (ANALYZE, BUFFERS) "+q.sql, q.args...)
						require.NoError(b, err)
						lines, err := pgx.CollectRows(plan, pgx.RowTo[string])
						require.NoError(b, err)
						fmt.Fprintf(os.Stderr, "%s behind %d runs of a community at its share (%s):\n%s\n", c.name, backlog, mode, strings.Join(lines, "\n"))
					})
				}
				for b.Loop() {
					inTx(func(tx pgx.Tx) {
						_, err := c.claim(tx)
						require.NoError(b, err)
					})
				}
				b.ReportMetric(float64(b.Elapsed().Microseconds())/1000/float64(b.N), "ms/claim")
			})
		}
	}
}
