package migrate_test

import (
	"context"
	"encoding/json"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/buzzrelay/buzz/internal/dbtest"
)

// The SQL bodies events_tag_index and events_deletion_coordinates_canonical
// had before migration 020, run as plain queries: the PL/pgSQL versions
// must answer exactly as they did.
const (
	sqlTagIndex = `
		SELECT coalesce(array_agg(DISTINCT (tag->>0) || ':' || (tag->>1)), '{}')
		FROM jsonb_array_elements(j) AS tag
		WHERE jsonb_typeof(tag) = 'array'
		  AND (tag->>0) ~ '^[A-Za-z]$'
		  AND octet_length(tag->>1) <= 1024`
	sqlCoordinatesCanonical = `
		SELECT coalesce(bool_and(coalesce(nostr_coordinate_is_canonical(tag->>1), false)), true)
		FROM jsonb_array_elements(j) AS tag
		WHERE jsonb_typeof(tag) = 'array' AND jsonb_array_length(tag) >= 2 AND tag->>0 = 'a'`
)

// randomTags builds a tag list of n elements from the shapes that decide
// what the functions keep: tag names of one letter in either case or not,
// values missing, null, numeric, nested or over the 1,024-byte bound,
// repeated tags, elements that are not arrays, coordinates spelled well
// and badly.
func randomTags(r *rand.Rand, n int, nonArrays bool) []any {
	names := []any{"t", "p", "e", "a", "T", "Z", "tt", "", "1", "é", nil, 5}
	pk := strings.Repeat("ab", 32)
	values := []any{
		"x", "b", "a", "B", "a:b", "é", "ü", "Z", "10", "", nil, 5, 2.5, true,
		[]any{"nested"}, map[string]any{"k": "v"},
		strings.Repeat("v", 1024), strings.Repeat("w", 1025),
		"30023:" + pk + ":slug", "10002:" + pk + ":", "10002:" + pk, "030023:" + pk + ":d", "30023:" + strings.ToUpper(pk) + ":d",
	}
	tags := make([]any, 0, n)
	for range n {
		k := r.IntN(20)
		if !nonArrays && k < 3 {
			k = 20
		}
		switch {
		case k == 0:
			tags = append(tags, "not a tag")
		case k == 1:
			tags = append(tags, nil)
		case k == 2:
			tags = append(tags, map[string]any{"t": "x"})
		case k == 3 && len(tags) > 0:
			tags = append(tags, tags[r.IntN(len(tags))]) // a repeat
		default:
			tag := []any{names[r.IntN(len(names))]}
			for range r.IntN(4) {
				tag = append(tag, values[r.IntN(len(values))])
			}
			tags = append(tags, tag)
		}
	}
	return tags
}

// Migration 020 rewrote both functions of the events row in PL/pgSQL, for
// speed only: on thousands of generated tag lists, short (the loop) and
// long (more than 16 tags, the sorted query), each answers exactly what
// its SQL body answered, order included. Kills: appending without keeping
// the order, appending a repeat, keeping a name that is not one letter or
// a value over 1,024 bytes, and a long list's query that drops DISTINCT.
func TestEventsRowFunctionsAnswerAsTheirSQLBodies(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	conn := connect(t, dbtest.URL(t))
	r := rand.New(rand.NewPCG(20, 20))
	var docs []string
	for i := range 3000 {
		n := r.IntN(8)
		if i%4 == 0 {
			n = r.IntN(60) // past the loop's 16
		}
		doc, err := json.Marshal(randomTags(r, n, i%2 == 0))
		require.NoError(t, err)
		docs = append(docs, string(doc))
	}
	docs = append(docs, `[]`, `[[]]`, `[["t"]]`, `[["t", null]]`)

	// Both coordinate bodies fail on a tag that is not an array (the relay
	// refuses such events before they reach the database): those lists are
	// compared for their tag index only.
	rows, err := conn.Query(ctx, `
		SELECT j::text, events_tag_index(j)::text, (`+sqlTagIndex+`)::text,
		       CASE WHEN NOT jsonb_path_exists(j, 'strict $[*] ? (@.type() != "array")') THEN events_deletion_coordinates_canonical(j) END,
		       CASE WHEN NOT jsonb_path_exists(j, 'strict $[*] ? (@.type() != "array")') THEN (`+sqlCoordinatesCanonical+`) END
		FROM unnest($1::jsonb[]) AS j`, docs)
	require.NoError(t, err)
	type answer struct {
		Doc                 string
		TagIndex, TagSQL    string
		Canonical, CanonSQL *bool
	}
	answers, err := pgx.CollectRows(rows, pgx.RowToStructByPos[answer])
	require.NoError(t, err)
	require.Len(t, answers, len(docs))
	nonEmpty, long, refused := 0, 0, 0
	for _, a := range answers {
		require.Equal(t, a.TagSQL, a.TagIndex, "events_tag_index(%s)", a.Doc)
		require.Equal(t, a.CanonSQL, a.Canonical, "events_deletion_coordinates_canonical(%s)", a.Doc)
		if a.TagIndex != "{}" {
			nonEmpty++
		}
		if strings.Count(a.TagIndex, ",") >= 3 {
			long++
		}
		if a.Canonical != nil && !*a.Canonical {
			refused++
		}
	}
	t.Logf("tag indexes not empty %d, with 4 or more entries %d; coordinates refused %d", nonEmpty, long, refused)
	// The corpus reaches every branch: tags kept, several kept and sorted,
	// coordinates refused.
	require.Greater(t, nonEmpty, 1000)
	require.Greater(t, long, 200)
	require.Greater(t, refused, 100)

	// Tags that are not an array index nothing, and the CHECK refuses the
	// row by its name (the SQL function failed first, unnamed).
	var empty string
	require.NoError(t, conn.QueryRow(ctx, `SELECT events_tag_index('{"t": "x"}')::text`).Scan(&empty))
	require.Equal(t, "{}", empty)
	_, err = conn.Exec(ctx, `INSERT INTO communities (id, host) VALUES ('00000000-0000-4000-8000-000000000020', 'tags.example')`)
	require.NoError(t, err)
	_, err = conn.Exec(ctx, `
		INSERT INTO events (community_id, id, pubkey, created_at, kind, tags, content, sig)
		VALUES ('00000000-0000-4000-8000-000000000020', decode(repeat('01', 32), 'hex'), decode(repeat('02', 32), 'hex'),
		        now(), 1, '{"t": "x"}', '', decode(repeat('03', 64), 'hex'))`)
	require.ErrorContains(t, err, "events_tags_array")
}

// PostgreSQL prepares CHECK constraints, generated columns, index
// expressions and trigger conditions once per statement, and a LANGUAGE
// sql function in one of them is parsed each time (to try inlining it, and
// again to run it when that fails): 50-80 us per INSERT statement for each
// such function on the dev box. None may come back. Kills: migration 020
// left out or undone for either function.
func TestNoSQLFunctionIsPreparedPerStatement(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	conn := connect(t, dbtest.URL(t))
	require.Empty(t, sqlFunctionsPreparedPerStatement(ctx, t, conn))

	// The rule has teeth: a CHECK calling a SQL function is reported.
	_, err := conn.Exec(ctx, `
		CREATE FUNCTION lint_probe_ok(x int) RETURNS boolean LANGUAGE sql IMMUTABLE AS $$ SELECT x > 0 $$;
		CREATE TABLE lint_probe (x int CONSTRAINT lint_probe_x CHECK (lint_probe_ok(x)))`)
	require.NoError(t, err)
	require.Equal(t, []string{"lint_probe_ok(integer) in pg_constraint"}, sqlFunctionsPreparedPerStatement(ctx, t, conn))
}

func sqlFunctionsPreparedPerStatement(ctx context.Context, t *testing.T, conn *pgx.Conn) []string {
	t.Helper()
	rows, err := conn.Query(ctx, `
		SELECT DISTINCT format('%s in %s', d.refobjid::regprocedure, d.classid::regclass)
		FROM pg_depend d
		JOIN pg_proc p ON p.oid = d.refobjid
		JOIN pg_language l ON l.oid = p.prolang
		JOIN pg_namespace n ON n.oid = p.pronamespace
		WHERE d.refclassid = 'pg_proc'::regclass
		  AND d.classid IN ('pg_constraint'::regclass, 'pg_attrdef'::regclass, 'pg_trigger'::regclass, 'pg_class'::regclass)
		  AND l.lanname = 'sql' AND n.nspname = 'public'
		ORDER BY 1`)
	require.NoError(t, err)
	found, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	return found
}
