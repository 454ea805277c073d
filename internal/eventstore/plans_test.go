package eventstore

import (
	"context"
	"crypto/md5"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/buzzrelay/buzz/internal/db"
	"github.com/buzzrelay/buzz/internal/dbtest"
	"github.com/buzzrelay/buzz/internal/nostr"
)

// planNode is the part of EXPLAIN (FORMAT JSON) these tests read.
type planNode struct {
	NodeType  string     `json:"Node Type"`
	IndexName string     `json:"Index Name"`
	Plans     []planNode `json:"Plans"`
}

func (n planNode) walk(fn func(planNode)) {
	fn(n)
	for _, c := range n.Plans {
		c.walk(fn)
	}
}

// explain returns the plan PostgreSQL picks for sql with args bound, as the
// relay sends it (extended protocol, parameters known at planning).
func explain(t *testing.T, pool *pgxpool.Pool, sql string, args []any) planNode {
	t.Helper()
	var out []byte
	require.NoError(t, pool.QueryRow(context.Background(), "EXPLAIN (FORMAT JSON) "+sql, args...).Scan(&out))
	var plans []struct {
		Plan planNode `json:"Plan"`
	}
	require.NoError(t, json.Unmarshal(out, &plans), string(out))
	require.Len(t, plans, 1)
	return plans[0].Plan
}

// planSummary lists a plan's node types and the indexes it reads.
func planSummary(p planNode) (nodes, indexes []string) {
	p.walk(func(n planNode) {
		nodes = append(nodes, n.NodeType)
		if n.IndexName != "" {
			indexes = append(indexes, n.IndexName)
		}
	})
	return nodes, indexes
}

// burst loads n kind 1/7 events (one p and one t tag, about 200 bytes of
// content, 100 authors) straight into a fresh database, the way a burst of
// publishes lands before autovacuum has analyzed anything. Signatures are
// random bytes: nothing here verifies them.
func burst(t *testing.T, pool *pgxpool.Pool, community uuid.UUID, n int) {
	t.Helper()
	_, err := pool.Exec(context.Background(), `
INSERT INTO events (community_id, id, pubkey, created_at, kind, tags, content, sig)
SELECT $1, decode(md5('id' || i) || md5('id2' || i), 'hex'), decode(md5('pk' || (i % 100)) || md5('pk2' || (i % 100)), 'hex'),
       to_timestamp(1700000000 + i / 4), CASE WHEN i % 5 = 4 THEN 7 ELSE 1 END,
       jsonb_build_array(jsonb_build_array('p', md5('pk' || (i % 7)) || md5('pk2' || (i % 7))), jsonb_build_array('t', 'topic' || (i % 50))),
       'lorem ipsum dolor sit amet common' || (i % 20) || ' rare' || (i % 1000) || ' consectetur adipiscing elit sed do eiusmod tempor incididunt ut labore et dolore magna aliqua',
       decode(repeat(md5('sig' || i), 4), 'hex')
FROM generate_series(1, $2::int) AS i`, community, n)
	require.NoError(t, err)
}

// TestPlansWithoutStatistics: right after a burst into a fresh database,
// before any ANALYZE, the newest-first reads still walk their index
// backward and stop after the limit, instead of collecting every match
// and sorting it (26-50 ms for kinds:[1] limit 100 over 26,000 events,
// against 0.3 ms). Autovacuum is switched off for the table so that no
// statistics can appear while the test runs. Mutations killed: a plan that
// sorts before the limit; a single filter's page wrapped in the merge of
// several (a sort of rows already in order).
func TestPlansWithoutStatistics(t *testing.T) {
	t.Parallel()
	pool := dbtest.Pool(t)
	ctx := context.Background()
	c, err := db.New(pool).CommunityCreate(ctx, "plans.example")
	require.NoError(t, err)
	_, err = pool.Exec(ctx, "ALTER TABLE events SET (autovacuum_enabled = off)")
	require.NoError(t, err)
	burst(t, pool, c.ID, 20_000)

	var analyzed bool
	require.NoError(t, pool.QueryRow(ctx, `SELECT EXISTS (SELECT FROM pg_stats WHERE tablename = 'events')
		OR (SELECT coalesce(last_analyze, last_autoanalyze) IS NOT NULL FROM pg_stat_user_tables WHERE relname = 'events')`).Scan(&analyzed))
	require.False(t, analyzed, "the table must have no statistics for this test to mean anything")

	limit := 100
	for _, tc := range []struct {
		name   string
		filter nostr.Filter
		index  string
	}{
		{"kinds", nostr.Filter{Kinds: []int{1}, Limit: &limit}, "events_by_kind_time"},
	} {
		filters := nostr.Filters{tc.filter}
		sql, args := buildPage(c.ID, Scope{Reader: burstAuthor}, filters, []pageBranch{{filter: 0, limit: limit, remaining: limit}}, nil, DefaultPageRows, DefaultSearchCandidates)
		nodes, indexes := planSummary(explain(t, pool, sql, args))
		require.Contains(t, indexes, tc.index, "%s: nodes %v", tc.name, nodes)
		require.NotContains(t, nodes, "Bitmap Heap Scan", "%s: a bitmap scan reads every match before the limit applies", tc.name)
		// The branch's Limit sits right on the index scan, and one filter's
		// page is that branch alone: no sort anywhere.
		require.Contains(t, strings.Join(nodes, ">"), "Limit>Index Scan", "%s: nodes %v", tc.name, nodes)
		require.NotContains(t, nodes, "Sort", "%s: one branch is already in order", tc.name)
	}
}

// TestPlansWithStatistics: once the table is analyzed, a rare word is
// found through the search index, and one author's events through
// events_by_author_time rather than by walking every kind-1 row.
func TestPlansWithStatistics(t *testing.T) {
	t.Parallel()
	pool := dbtest.Pool(t)
	ctx := context.Background()
	c, err := db.New(pool).CommunityCreate(ctx, "expressions.example")
	require.NoError(t, err)
	burst(t, pool, c.ID, 20_000)
	_, err = pool.Exec(ctx, "ANALYZE events")
	require.NoError(t, err)

	limit := 10
	for _, tc := range []struct {
		name   string
		filter nostr.Filter
		index  string
	}{
		{"rare word", nostr.Filter{Search: "rare42", Limit: &limit}, "events_search_by_community"},
		{"author and kinds", nostr.Filter{Authors: []string{burstAuthor}, Kinds: []int{1}, Limit: &limit}, "events_by_author_time"},
	} {
		sql, args, ok := BuildSelect(c.ID, Scope{}, nostr.Filters{tc.filter}, 500)
		require.True(t, ok)
		nodes, indexes := planSummary(explain(t, pool, sql, args))
		require.Contains(t, indexes, tc.index, "%s: nodes %v", tc.name, nodes)
	}
	// The search statement proper (newest candidates, then ranked).
	sql, args := buildSearchPage(c.ID, Scope{}, &nostr.Filter{Search: "rare42"}, nil, limit, DefaultSearchCandidates)
	nodes, indexes := planSummary(explain(t, pool, sql, args))
	require.Contains(t, indexes, "events_search_by_community", "search page: nodes %v", nodes)
}

// TestSearchReadsNoOtherCommunitysRows: a search (REQ and COUNT) for a word
// that only another community's events hold reads none of their rows.
// Indexed by search_tsv alone, the search found every community's matches
// in the index and read each from the heap to drop it by its community:
// 401 rows here, and its time told a member whether, and how often,
// other communities (their private channels included) wrote the word.
// The word is in 1% of the rows: in many more, the planner may walk the
// community's own rows newest first instead (reading its 20,000 rows, none
// of another's), which this count cannot tell from a leak.
// Mutation killed: events_search (search_tsv alone) in place of
// events_search_by_community (401 rows read).
func TestSearchReadsNoOtherCommunitysRows(t *testing.T) {
	t.Parallel()
	pool := dbtest.Pool(t)
	ctx := context.Background()
	other, err := db.New(pool).CommunityCreate(ctx, "writes-zebra.example")
	require.NoError(t, err)
	burst(t, pool, other.ID, 20_000)
	_, err = pool.Exec(ctx, "UPDATE events SET content = content || ' zebra' WHERE community_id = $1 AND created_at >= to_timestamp(1700000000 + 4900)", other.ID)
	require.NoError(t, err)
	c, err := db.New(pool).CommunityCreate(ctx, "searches.example")
	require.NoError(t, err)
	burst(t, pool, c.ID, 20_000)
	_, err = pool.Exec(ctx, "ANALYZE events")
	require.NoError(t, err)

	filters := nostr.Filters{{Search: "zebra"}}
	sql, args, ok := BuildSelect(c.ID, Scope{Reader: burstAuthor}, filters, 500)
	require.True(t, ok)
	read, plan := eventRowsRead(t, pool, sql, args)
	require.Zero(t, read, "REQ: rows of the other community read:\n%s", plan)
	sql, args, ok = BuildCount(c.ID, Scope{Reader: burstAuthor}, filters)
	require.True(t, ok)
	read, plan = eventRowsRead(t, pool, sql, args)
	require.Zero(t, read, "COUNT: rows of the other community read:\n%s", plan)
}

// burstAuthor is one of burst's authors.
var burstAuthor = hex.EncodeToString(append(md5Bytes("pk7"), md5Bytes("pk27")...))

func md5Bytes(s string) []byte {
	sum := md5.Sum([]byte(s))
	return sum[:]
}

// TestAnalyzeWhenStaleAfterBurst: a burst into a never-analyzed table is
// analyzed by the relay's own check, without waiting for autovacuum's
// launcher (switched off here), and the author shape then reads its index;
// once analyzed, the same table is left alone until it doubles.
// Mutation killed: a check that never fires leaves the table without
// statistics (the Eventually below times out).
func TestAnalyzeWhenStaleAfterBurst(t *testing.T) {
	t.Parallel()
	pool := dbtest.Pool(t)
	ctx := context.Background()
	c, err := db.New(pool).CommunityCreate(ctx, "analyze.example")
	require.NoError(t, err)
	_, err = pool.Exec(ctx, "ALTER TABLE events SET (autovacuum_enabled = off)")
	require.NoError(t, err)
	store := New(pool, 500)
	analyzed, err := store.AnalyzeWhenStale(ctx, 1000)
	require.NoError(t, err)
	require.False(t, analyzed, "an empty table is not analyzed")

	burst(t, pool, c.ID, 20_000)
	// The burst's row counts reach pg_stat_user_tables when its session
	// flushes them (within a second or so).
	require.Eventually(t, func() bool {
		var stale bool
		require.NoError(t, pool.QueryRow(ctx, eventsStatisticsStale, 1000).Scan(&stale))
		return stale
	}, 30*time.Second, 50*time.Millisecond)

	// While an index build holds its lock the keeper does not queue for
	// the table: waiting would deadlock the build, which waits for the
	// keeper's snapshot. It tries again on a later tick.
	// Mutation killed: without the keeper's lock_timeout the call waits for
	// the lock until its deadline.
	building, err := pool.Begin(ctx)
	require.NoError(t, err)
	t.Cleanup(func() { _ = building.Rollback(context.Background()) }) // before the pool closes
	_, err = building.Exec(ctx, "LOCK TABLE events IN SHARE UPDATE EXCLUSIVE MODE")
	require.NoError(t, err)
	busy, cancel := context.WithTimeout(ctx, 10*time.Second)
	analyzed, err = store.AnalyzeWhenStale(busy, 1000)
	cancel()
	require.NoError(t, err)
	require.False(t, analyzed, "left for a later tick while the table's lock is taken")
	require.NoError(t, building.Rollback(ctx))

	require.Eventually(t, func() bool {
		analyzed, err := store.AnalyzeWhenStale(ctx, 1000)
		require.NoError(t, err)
		return analyzed
	}, 30*time.Second, 50*time.Millisecond)
	var stats int
	require.NoError(t, pool.QueryRow(ctx, "SELECT count(*) FROM pg_stats WHERE tablename = 'events'").Scan(&stats))
	require.Positive(t, stats)

	limit := 100
	filters := nostr.Filters{{Authors: []string{burstAuthor}, Kinds: []int{1}, Limit: &limit}}
	sql, args := buildPage(c.ID, Scope{Reader: burstAuthor}, filters, []pageBranch{{filter: 0, limit: limit, remaining: limit}}, nil, DefaultPageRows, DefaultSearchCandidates)
	nodes, indexes := planSummary(explain(t, pool, sql, args))
	require.Contains(t, indexes, "events_by_author_time", "nodes %v", nodes)

	analyzed, err = store.AnalyzeWhenStale(ctx, 1000)
	require.NoError(t, err)
	require.False(t, analyzed, "fresh statistics are left alone")
}

// A role that may not ANALYZE events (PostgreSQL only warns and skips the
// table) is told so once, instead of finding the statistics stale and
// "analyzing" them every interval forever.
func TestAnalyzeWhenStaleNeedsARoleThatMayAnalyze(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := dbtest.URL(t)
	admin, err := pgxpool.New(ctx, url)
	require.NoError(t, err)
	t.Cleanup(admin.Close) // after the role's cleanup below, which needs it: roles outlive the test database
	c, err := db.New(admin).CommunityCreate(ctx, "analyze-role.example")
	require.NoError(t, err)
	_, err = admin.Exec(ctx, "ALTER TABLE events SET (autovacuum_enabled = off)")
	require.NoError(t, err)

	role := fmt.Sprintf("analyze_reader_%d", time.Now().UnixNano()%1_000_000_000)
	_, err = admin.Exec(ctx, "CREATE ROLE "+role+" LOGIN")
	require.NoError(t, err)
	t.Cleanup(func() { _, _ = admin.Exec(context.Background(), "DROP OWNED BY "+role+"; DROP ROLE IF EXISTS "+role) })
	_, err = admin.Exec(ctx, "GRANT SELECT ON events TO "+role)
	require.NoError(t, err)
	cfg, err := pgxpool.ParseConfig(url)
	require.NoError(t, err)
	cfg.ConnConfig.User = role
	reader, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	defer reader.Close()

	burst(t, admin, c.ID, 2_000)
	owner := New(admin, 500)
	require.Eventually(t, func() bool {
		// Stale for everyone once the burst's counts are flushed.
		var stale bool
		require.NoError(t, admin.QueryRow(ctx, eventsStatisticsStale, 1000).Scan(&stale))
		return stale
	}, 30*time.Second, 50*time.Millisecond)
	_, err = New(reader, 500).AnalyzeWhenStale(ctx, 1000)
	require.ErrorIs(t, err, ErrCannotAnalyze)
	analyzed, err := owner.AnalyzeWhenStale(ctx, 1000)
	require.NoError(t, err)
	require.True(t, analyzed, "the owner analyzes the stale table")
}

// TestCountReadsAtMostMaxCountRows: a COUNT matching more than MaxCount
// events stops reading rows there, whatever the filters: the rows any
// node reads from the table (those it returns and those its conditions
// removed) stay near MaxCount+1, with another community's rows stored
// before the counted one's. Counted to the end, a COUNT of a whole
// community read every row of it. Mutations killed: BuildCount without its
// LIMIT (20,000 rows read for a count of 20,000); countIn without turning
// sequential scans off (the limit was planned as a scan of the whole table
// that stops there, which read the other community's 20,000 rows first).
func TestCountReadsAtMostMaxCountRows(t *testing.T) {
	t.Parallel()
	pool := dbtest.Pool(t)
	ctx := context.Background()
	other, err := db.New(pool).CommunityCreate(ctx, "other.example")
	require.NoError(t, err)
	burst(t, pool, other.ID, 2*MaxCount)
	c, err := db.New(pool).CommunityCreate(ctx, "count.example")
	require.NoError(t, err)
	burst(t, pool, c.ID, 2*MaxCount)
	_, err = pool.Exec(ctx, "ANALYZE events")
	require.NoError(t, err)

	// The limit stops at MaxCount+1 matching rows; rows of the counted
	// community sharing their pages may be read beside them (a kinds:[1]
	// count rechecks the kind-7 rows of a lossy bitmap's pages: 2,500),
	// never the other community's 20,000 nor the counted one's 20,000 whole.
	const readAtMost = MaxCount + 1 + MaxCount/2
	for _, filters := range []nostr.Filters{
		{{}},
		{{Kinds: []int{1}}},
		{{Search: "lorem"}},
		{{Kinds: []int{1}}, {Kinds: []int{7}}, {Tags: map[string][]string{"t": {"topic1"}}}},
	} {
		sql, args, ok := BuildCount(c.ID, Scope{Reader: burstAuthor}, filters)
		require.True(t, ok)
		read, plan := eventRowsRead(t, pool, sql, args)
		require.Positive(t, read, "%v: no node reads events:\n%s", filters, plan)
		require.LessOrEqual(t, read, float64(readAtMost), "%v: rows read from events", filters)
	}
}

// countedNode is the part of EXPLAIN (ANALYZE, FORMAT JSON) that says how
// many rows each node read from which table: those it returned and those
// its conditions removed.
type countedNode struct {
	RelationName     string        `json:"Relation Name"`
	ActualRows       float64       `json:"Actual Rows"`
	RemovedByFilter  float64       `json:"Rows Removed by Filter"`
	RemovedByRecheck float64       `json:"Rows Removed by Index Recheck"`
	ActualLoops      float64       `json:"Actual Loops"`
	Plans            []countedNode `json:"Plans"`
}

func (n countedNode) walk(fn func(countedNode)) {
	fn(n)
	for _, c := range n.Plans {
		c.walk(fn)
	}
}

// TestTagFilterReadsNoOtherCommunitysRows: a COUNT of a tag value that only
// another community's events carry reads none of their rows. Indexed by
// tag_index alone, the bitmap held every community's rows with the value
// and each was read from the heap to be dropped by its community.
// Mutation killed: events_by_tag (tag_index alone) in place of
// events_by_tag_in_community (the other community's 400 rows read).
func TestTagFilterReadsNoOtherCommunitysRows(t *testing.T) {
	t.Parallel()
	pool := dbtest.Pool(t)
	ctx := context.Background()
	other, err := db.New(pool).CommunityCreate(ctx, "tags-zebra.example")
	require.NoError(t, err)
	burst(t, pool, other.ID, 20_000)
	_, err = pool.Exec(ctx, `UPDATE events SET tags = tags || '[["t","zebra"]]'::jsonb WHERE community_id = $1 AND tag_index && ARRAY['t:topic0']`, other.ID)
	require.NoError(t, err)
	c, err := db.New(pool).CommunityCreate(ctx, "counts-tags.example")
	require.NoError(t, err)
	burst(t, pool, c.ID, 20_000)
	_, err = pool.Exec(ctx, "ANALYZE events")
	require.NoError(t, err)

	sql, args, ok := BuildCount(c.ID, Scope{Reader: burstAuthor}, nostr.Filters{{Tags: map[string][]string{"t": {"zebra"}}}})
	require.True(t, ok)
	read, plan := eventRowsRead(t, pool, sql, args)
	require.Zero(t, read, "COUNT: rows of the other community read:\n%s", plan)
}

// eventRowsRead runs sql under EXPLAIN ANALYZE as a COUNT runs (sequential
// scans off) and returns the most rows any node read from events (kept,
// filtered out or rechecked away, times its loops), and the plan.
func eventRowsRead(t *testing.T, pool *pgxpool.Pool, sql string, args []any) (float64, []byte) {
	t.Helper()
	var out []byte
	require.NoError(t, countIn(context.Background(), pool, "EXPLAIN (ANALYZE, FORMAT JSON) "+sql, args, &out))
	var plans []struct {
		Plan countedNode `json:"Plan"`
	}
	require.NoError(t, json.Unmarshal(out, &plans), string(out))
	var read float64
	plans[0].Plan.walk(func(n countedNode) {
		if n.RelationName == "events" {
			read = max(read, (n.ActualRows+n.RemovedByFilter+n.RemovedByRecheck)*max(n.ActualLoops, 1))
		}
	})
	return read, out
}

// TestGINPendingListsStayShort: inserts into the search and tag indexes
// wait in each index's pending list, which every read of the index scans
// whole and the insert that outgrows it merges whole (holding its group's
// events meanwhile); migration 065 keeps both lists to 256 kB, a burst
// included. Autovacuum is off for the table, so only the inserts merge.
// Mutation killed: 065's ALTER INDEX left out (a burst leaves hundreds of
// pending pages in the server default's 4 MB).
func TestGINPendingListsStayShort(t *testing.T) {
	t.Parallel()
	pool := dbtest.Pool(t)
	ctx := context.Background()
	c, err := db.New(pool).CommunityCreate(ctx, "pending.example")
	require.NoError(t, err)
	_, err = pool.Exec(ctx, "ALTER TABLE events SET (autovacuum_enabled = off)")
	require.NoError(t, err)
	_, err = pool.Exec(ctx, "CREATE EXTENSION IF NOT EXISTS pgstattuple")
	require.NoError(t, err)
	burst(t, pool, c.ID, 5_000)

	const pendingListLimit, pageSize = 256 << 10, 8192
	for _, index := range []string{"events_search_by_community", "events_by_tag_in_community"} {
		var pages int64
		require.NoError(t, pool.QueryRow(ctx, "SELECT pending_pages FROM pgstatginindex($1::regclass)", index).Scan(&pages))
		t.Logf("%s: %d pending pages", index, pages)
		require.LessOrEqual(t, pages*pageSize, int64(pendingListLimit+pageSize), "%s: pending pages after a burst", index)
	}
}
