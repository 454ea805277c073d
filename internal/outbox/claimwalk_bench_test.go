package outbox

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/buzzrelay/buzz/internal/db"
)

// captureTx is a db.DBTX that records the statement and arguments of the
// query it runs, for EXPLAIN.
type captureTx struct {
	pgx.Tx
	sql  string
	args []any
}

func (c *captureTx) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	c.sql, c.args = sql, args
	return c.Tx.Query(ctx, sql, args...)
}

// backlogAcrossCommunities gives listener rows due in communities
// communities, perCommunity each (each with one stored message they
// mention, so the claim finds them readable), and returns the communities.
func backlogAcrossCommunities(tb testing.TB, f *fixture, listener []byte, communities, perCommunity int) []uuid.UUID {
	tb.Helper()
	ids := make([]uuid.UUID, communities)
	for i := range ids {
		c := f.otherCommunity(fmt.Sprintf("walk-%d.example", i))
		ids[i] = c.community
		mention := message(tb, 9)
		c.save(mention, nil, true)
		c.exec(`INSERT INTO operator_listener_outbox
		            (listener_pubkey, target_pubkey, community_id, event_id, event_kind, event_created_at, next_attempt_at)
		        SELECT $1, decode(md5('t' || i) || md5('u' || i), 'hex'), $2, $4, 9, to_timestamp($5),
		               now() - interval '1 minute' + ($6 * $3 + i) * interval '1 millisecond'
		        FROM generate_series(1, $3::int) AS i`,
			listener, c.community, perCommunity, mustHex(tb, mention.ID), mention.CreatedAt, i)
	}
	f.exec(`VACUUM ANALYZE operator_listener_outbox`)
	return ids
}

// BenchmarkClaimAmongManyCommunities: the poll's claim of ten rows for one
// listener whose due rows come from 1,000 communities, 20 each (ns/op and
// ms/claim are one claim, rolled back, so each sees the same backlog). The
// plan (EXPLAIN ANALYZE, BUFFERS) is printed once.
func BenchmarkClaimAmongManyCommunities(b *testing.B) {
	f := newFixture(b)
	listener := mustHex(b, newPubkey(b))
	backlogAcrossCommunities(b, f, listener, 1000, 20)
	benchClaim(b, f, listener, "claim among 1,000 communities", 10)
}

// BenchmarkClaimWithNothingDue: the same claim when every row waits for a
// retry (a listener that was down), in 1,000 communities holding one row
// each (rows1) or 20 each (rows20): the poll that finds nothing, which an
// idle worker runs every BUZZ_OPERATOR_LISTENER_POLL_MS.
func BenchmarkClaimWithNothingDue(b *testing.B) {
	for _, perCommunity := range []int{1, 20} {
		b.Run(fmt.Sprintf("rows%d", perCommunity), func(b *testing.B) {
			f := newFixture(b)
			listener := mustHex(b, newPubkey(b))
			backlogAcrossCommunities(b, f, listener, 1000, perCommunity)
			f.exec(`UPDATE operator_listener_outbox SET next_attempt_at = now() + interval '1 hour', attempts = 3`)
			f.exec(`VACUUM ANALYZE operator_listener_outbox`)
			benchClaim(b, f, listener, fmt.Sprintf("claim with nothing due, 1,000 communities of %d rows", perCommunity), 0)
		})
	}
}

// benchClaim measures the claim of ten rows for listener: ns/op and
// ms/claim are one claim, rolled back, so each sees the same outbox; the
// plan (EXPLAIN ANALYZE, BUFFERS) is printed once, and the least planning
// and execution time of 20 runs reported.
func benchClaim(b *testing.B, f *fixture, listener []byte, what string, want int) {
	ctx := context.Background()
	params := db.OutboxClaimDueParams{
		ClaimID: uuid.New(), LeaseMs: defaultLease.Milliseconds(), MaxAttempts: maxAttempts,
		RetentionMs: retention.Milliseconds(), Routable: [][]byte{listener}, Room: []int32{10}, MaxRows: 10,
	}
	inTx := func(fn func(tx pgx.Tx)) {
		tx, err := f.pool.Begin(ctx)
		require.NoError(b, err)
		defer func() { require.NoError(b, tx.Rollback(ctx)) }()
		fn(tx)
	}
	var planMin, execMin float64
	inTx(func(tx pgx.Tx) {
		q := &captureTx{Tx: tx}
		claimed, err := db.New(q).OutboxClaimDue(ctx, params)
		require.NoError(b, err)
		require.Len(b, claimed, want)
		_, err = tx.Exec(ctx, "ROLLBACK AND CHAIN")
		require.NoError(b, err)
		// The plan once, then the least planning and execution time of 20
		// runs (the box is shared: the least is the claim's own cost).
		var planMs, execMs []float64
		for i := range 20 {
			plan, err := tx.Query(ctx, "EXPLAIN (ANALYZE, BUFFERS) "+q.sql, q.args...)
			require.NoError(b, err)
			lines, err := pgx.CollectRows(plan, pgx.RowTo[string])
			require.NoError(b, err)
			if i == 0 {
				fmt.Fprintf(os.Stderr, "%s:\n%s\n", what, strings.Join(lines, "\n"))
			}
			for _, line := range lines {
				var ms float64
				if _, err := fmt.Sscanf(line, "Planning Time: %f ms", &ms); err == nil {
					planMs = append(planMs, ms)
				}
				if _, err := fmt.Sscanf(line, "Execution Time: %f ms", &ms); err == nil {
					execMs = append(execMs, ms)
				}
			}
			_, err = tx.Exec(ctx, "ROLLBACK AND CHAIN")
			require.NoError(b, err)
		}
		planMin, execMin = slices.Min(planMs), slices.Min(execMs)
	})
	for b.Loop() {
		inTx(func(tx pgx.Tx) {
			_, err := db.New(tx).OutboxClaimDue(ctx, params)
			require.NoError(b, err)
		})
	}
	b.ReportMetric(float64(b.Elapsed().Microseconds())/1000/float64(b.N), "ms/claim")
	b.ReportMetric(planMin, "plan_ms_min")
	b.ReportMetric(execMin, "exec_ms_min")
}
