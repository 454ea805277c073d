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
	f.dueRuns(f.tenant.ID(), aWorkflow, backlog, time.Hour)
	b, bWorkflow := f.otherCommunity()
	f.dueRuns(b.ID(), bWorkflow, bRuns, time.Second)
	_, err := f.pool.Exec(f.ctx, `VACUUM ANALYZE workflow_runs`)
	require.NoError(tb, err)
	return b
}

// otherCommunity creates a community in the fixture's database with a
// channel and a two-step workflow, and returns it and the workflow's id.
func (f *fixture) otherCommunity() (community.Tenant, string) {
	f.t.Helper()
	row, err := db.New(f.pool).CommunityCreate(f.ctx, "wf-b-"+uuid.NewString()[:8]+".example")
	require.NoError(f.t, err)
	c := community.FromRow(row)
	store := func(ev *nostr.Event) {
		out, _, err := f.p.SubmitReply(f.ctx, c, ev.PubKey, ev)
		require.NoError(f.t, err)
		require.Equal(f.t, ingest.Stored, out)
	}
	owner, channel, workflowID := f.key(), uuid.NewString(), uuid.NewString()
	store(f.sign(owner, ingest.KindCreateGroup, "", nostr.Tags{{"h", channel}, {"name", "b"}}))
	store(f.sign(owner, workflow.KindDefinition, twoSteps, nostr.Tags{{"d", workflowID}, {"h", channel}}))
	return c, workflowID
}

// dueRuns inserts n pending runs of the workflow, due since age ago, a
// millisecond apart, oldest first.
func (f *fixture) dueRuns(community uuid.UUID, workflowID string, n int, age time.Duration) {
	f.t.Helper()
	_, err := f.pool.Exec(f.ctx, `
		INSERT INTO workflow_runs (community_id, id, workflow_id, run_at)
		SELECT $1, gen_random_uuid(), $2, $4::timestamptz - $5 * interval '1 microsecond' + i * interval '1 millisecond'
		FROM generate_series(1, $3::int) AS i`, community, workflowID, n, f.clock.Now(), age.Microseconds())
	require.NoError(f.t, err)
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
		runsOf := func(community uuid.UUID) []uuid.UUID {
			rows, err := f.pool.Query(f.ctx, `SELECT id FROM workflow_runs WHERE community_id = $1 LIMIT 20`, community)
			require.NoError(b, err)
			ids, err := pgx.CollectRows(rows, pgx.RowTo[uuid.UUID])
			require.NoError(b, err)
			return ids
		}
		ids := runsOf(other.ID())
		due := db.WorkflowRunClaimDueParams{
			ClaimID: uuid.New(), LeaseMs: time.Minute.Milliseconds(), MaxRows: 10,
			FullCommunities: []uuid.UUID{f.tenant.ID()}, CommunityShare: 5,
		}
		byID := db.WorkflowRunClaimByIDParams{
			ClaimID: due.ClaimID, LeaseMs: due.LeaseMs, MaxRows: int32(len(ids)), Ids: ids,
			FullCommunities: due.FullCommunities, CommunityShare: due.CommunityShare,
		}
		for range ids {
			byID.Communities = append(byID.Communities, other.ID())
		}
		// Runs of A, handed off while A holds fewer than its share (there
		// are none with no backlog).
		byIDA := byID
		byIDA.FullCommunities, byIDA.Ids, byIDA.Communities = nil, runsOf(f.tenant.ID()), nil
		for range byIDA.Ids {
			byIDA.Communities = append(byIDA.Communities, f.tenant.ID())
		}
		inTx := func(fn func(tx pgx.Tx)) {
			tx, err := f.pool.Begin(f.ctx)
			require.NoError(b, err)
			defer func() { require.NoError(b, tx.Rollback(f.ctx)) }()
			fn(tx)
		}
		claimDue := func(tx db.DBTX) ([]uuid.UUID, error) {
			rows, err := db.New(tx).WorkflowRunClaimDue(f.ctx, due)
			out := make([]uuid.UUID, len(rows))
			for i, r := range rows {
				out[i] = r.CommunityID
			}
			return out, err
		}
		claimByID := func(p db.WorkflowRunClaimByIDParams) func(tx db.DBTX) ([]uuid.UUID, error) {
			return func(tx db.DBTX) ([]uuid.UUID, error) {
				rows, err := db.New(tx).WorkflowRunClaimByID(f.ctx, p)
				out := make([]uuid.UUID, len(rows))
				for i, r := range rows {
					out[i] = r.CommunityID
				}
				return out, err
			}
		}
		for _, c := range []struct {
			name      string
			community uuid.UUID // whose runs the claim takes,
			want      int       // this many
			claim     func(tx db.DBTX) ([]uuid.UUID, error)
		}{
			{"due", other.ID(), 5, claimDue},
			{"byid", other.ID(), 5, claimByID(byID)},
			{"byid-backlog", f.tenant.ID(), min(backlog, 5), claimByID(byIDA)},
		} {
			b.Run("claim="+c.name+"/backlog="+itoa(int64(backlog)), func(b *testing.B) {
				inTx(func(tx pgx.Tx) {
					got, err := c.claim(tx)
					require.NoError(b, err)
					require.Len(b, got, c.want, "the community's share")
					for _, community := range got {
						require.Equal(b, c.community, community)
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

// BenchmarkClaimAmongManyCommunities: the poll's claim of ten runs (a share
// of five) where 1,000 or 5,000 communities have one pending run each, or
// 1,000 have 200, due (due) or delayed an hour (delayed), besides community
// B's 20 due runs. The claim finds pending runs per community: a descent
// per community with due runs or with more than one pending run, one per
// 128 communities holding one delayed run (ns/op and ms/claim are one
// claim, rolled back; buffers/claim those of one claim, EXPLAIN ANALYZE).
func BenchmarkClaimAmongManyCommunities(b *testing.B) {
	for _, c := range []struct {
		communities, runs int // runs of each community
		delay             time.Duration
	}{{1000, 1, 0}, {1000, 1, time.Hour}, {5000, 1, time.Hour}, {1000, 200, time.Hour}} {
		delay := c.delay
		name := "due"
		if delay > 0 {
			name = "delayed"
		}
		b.Run(name+"/communities="+itoa(int64(c.communities))+"/runs="+itoa(int64(c.runs)), func(b *testing.B) {
			f := newFixtureWith(b, ingest.Options{}, workflow.Triggers{})
			other := backlogFixture(b, f, 0, 20)
			_, err := f.pool.Exec(f.ctx, `
				WITH c AS (
					INSERT INTO communities (host)
					SELECT 'many-' || i || '.example' FROM generate_series(1, $3::int) AS i
					RETURNING id
				), w AS (
					INSERT INTO workflows (community_id, id, name, owner_pubkey, definition, definition_hash)
					SELECT c.id, gen_random_uuid(), 'W', sha256('o'), '{}', sha256('d') FROM c
					RETURNING community_id, id
				)
				INSERT INTO workflow_runs (community_id, id, workflow_id, run_at)
				SELECT w.community_id, gen_random_uuid(), w.id, $1::timestamptz + $2 * interval '1 microsecond'
				FROM w CROSS JOIN generate_series(1, $4::int)`,
				f.clock.Now().Add(-time.Minute), delay.Microseconds(), c.communities, c.runs)
			require.NoError(b, err)
			_, err = f.pool.Exec(f.ctx, `VACUUM ANALYZE workflow_runs`)
			require.NoError(b, err)
			params := db.WorkflowRunClaimDueParams{
				ClaimID: uuid.New(), LeaseMs: time.Minute.Milliseconds(), MaxRows: 10, CommunityShare: 5,
			}
			claim := func() []db.WorkflowRunClaimDueRow {
				tx, err := f.pool.Begin(f.ctx)
				require.NoError(b, err)
				defer func() { require.NoError(b, tx.Rollback(f.ctx)) }()
				rows, err := db.New(tx).WorkflowRunClaimDue(f.ctx, params)
				require.NoError(b, err)
				return rows
			}
			// Due: one run each of the ten communities due first; delayed:
			// B's share.
			rows := claim()
			if delay > 0 {
				require.Len(b, rows, 5)
				for _, r := range rows {
					require.Equal(b, other.ID(), r.CommunityID)
				}
			} else {
				require.Len(b, rows, 10)
			}
			// The buffers one claim touches (EXPLAIN ANALYZE, BUFFERS, rolled
			// back).
			tx, err := f.pool.Begin(f.ctx)
			require.NoError(b, err)
			q := &capture{Tx: tx}
			_, err = db.New(q).WorkflowRunClaimDue(f.ctx, params)
			require.NoError(b, err)
			_, err = tx.Exec(f.ctx, "ROLLBACK AND CHAIN")
			require.NoError(b, err)
			var plan []map[string]any
			require.NoError(b, tx.QueryRow(f.ctx, "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) "+q.sql, q.args...).Scan(&plan))
			require.NoError(b, tx.Rollback(f.ctx))
			top := plan[0]["Plan"].(map[string]any)
			buffers := top["Shared Hit Blocks"].(float64) + top["Shared Read Blocks"].(float64)
			for b.Loop() {
				claim()
			}
			b.ReportMetric(float64(b.Elapsed().Microseconds())/1000/float64(b.N), "ms/claim")
			b.ReportMetric(buffers, "buffers/claim")
		})
	}
}
