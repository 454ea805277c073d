package relay_test

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/buzzrelay/buzz/internal/dbtest"
	"github.com/buzzrelay/buzz/internal/relaytest"
)

// contentRows is a pgx tracer that remembers the most rows one statement
// reading events' content returned, and how many such statements ran.
type contentRows struct {
	mu         sync.Mutex
	most       int64
	statements int
}

type contentSQL struct{}

func (c *contentRows) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	return context.WithValue(ctx, contentSQL{}, strings.Contains(d.SQL, "content"))
}

func (c *contentRows) TraceQueryEnd(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryEndData) {
	if readsContent, _ := ctx.Value(contentSQL{}).(bool); readsContent {
		c.mu.Lock()
		defer c.mu.Unlock()
		c.most, c.statements = max(c.most, d.CommandTag.RowsAffected()), c.statements+1
	}
}

// A catch-up after a lost subscription holds a batch of the gap's events
// at a time, not the whole gap: up to 10,000 events of up to 256 KB each,
// read at once, in every relay process at once when Redis returns (or in
// the one Redis disconnected for lagging behind a flood of large events),
// was gigabytes. Counted as the rows of content one statement returns
// (what the process holds at once), not as the heap, which garbage
// collection's pacing moves.
// Mutation killed: reading the gap in one statement (all 300 events'
// content in one answer).
func TestCatchUpHoldsABatchOfTheGapAtATime(t *testing.T) {
	t.Parallel()
	counter := &contentRows{}
	r := relaytest.StartOn(t, dbtest.PoolOn(t, dbtest.URL(t), 0, func(c *pgxpool.Config) { c.ConnConfig.Tracer = counter }))
	subscriber := r.Dial(t, r.Host)
	subscriber.Auth(nil)
	// A live subscription makes the community one to catch up on; it
	// matches none of the gap's events, so only the catch-up holds them.
	subscriber.Send("REQ", "live", map[string]any{"kinds": []int{7}, "limit": 0})
	subscriber.Expect("EOSE")

	const events, size = 300, 1_000
	// Stored straight into the database, as other processes would.
	_, err := r.Pool.Exec(t.Context(), `INSERT INTO events (community_id, id, pubkey, created_at, kind, tags, content, sig)
		SELECT $1, sha256(int8send(i) || $2::bytea), '\x`+strings.Repeat("ab", 32)+`', now() - i * interval '1 ms',
		       1, '[]', repeat('x', $3), '\x`+strings.Repeat("cd", 64)+`'
		FROM generate_series(1, $4::int) i`, r.CommunityID, r.CommunityID[:], size, events)
	require.NoError(t, err)

	counter.mu.Lock()
	counter.most, counter.statements = 0, 0
	counter.mu.Unlock()
	now := time.Now()
	replayed, err := r.Server.CatchUp(t.Context(), now.Add(-time.Minute), now)
	require.NoError(t, err)
	require.Equal(t, events, replayed, "every event of the gap is handed on")
	counter.mu.Lock()
	defer counter.mu.Unlock()
	t.Logf("%d statements read the gap's events, at most %d at once", counter.statements, counter.most)
	require.LessOrEqual(t, counter.most, int64(16), "the catch-up read more than a batch of the gap's events at once")
	require.GreaterOrEqual(t, counter.statements, events/16, "the gap is read a batch at a time")
	subscriber.ExpectSilence(100*time.Millisecond, "the subscription matched none of them")
}
