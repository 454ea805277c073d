package migrate_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/buzzrelay/buzz/internal/dbtest"
	"github.com/buzzrelay/buzz/internal/migrate"
)

// The migrations that change existing tables (005 widens reactions.emoji,
// 007 adds a generated search column to events, 009 adds the outbox beside
// stored mentions) run on a database that already holds rows: every row
// survives unchanged, and the new column is computed for the old rows.
//
// Mutations killed: a 005 that rewrites or truncates emoji fails "reactions
// survive 005"; a 007 whose column is not STORED-generated (NULL for old
// rows) fails "old rows are searchable"; a 007 that indexes encrypted kinds
// fails "gift wraps are never indexed"; a 009 that backfills the outbox from
// stored mentions (old events would wake listeners) fails "no retroactive
// deliveries"; any migration that drops or rewrites rows fails the final
// comparison.
func TestMigrationsKeepExistingRows(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	conn := connect(t, dbtest.EmptyURL(t))
	exec := func(sql string, args ...any) {
		t.Helper()
		_, err := conn.Exec(ctx, sql, args...)
		require.NoError(t, err)
	}
	count := func(sql string, args ...any) int {
		t.Helper()
		var n int
		require.NoError(t, conn.QueryRow(ctx, sql, args...).Scan(&n))
		return n
	}
	// A digest of every stored event and reaction: what no migration may change.
	digest := func() string {
		t.Helper()
		var d string
		require.NoError(t, conn.QueryRow(ctx, `
			SELECT md5(coalesce((SELECT string_agg(concat_ws('|', community_id, encode(id, 'hex'), encode(pubkey, 'hex'),
			           created_at, kind, tags::text, content, encode(sig, 'hex'), channel_id, deleted_at, d_tag), ',' ORDER BY id)
			        FROM events), '') ||
			       coalesce((SELECT string_agg(concat_ws('|', community_id, encode(event_id, 'hex'), encode(pubkey, 'hex'), emoji, removed_at), ',' ORDER BY event_id, emoji)
			        FROM reactions), ''))`).Scan(&d))
		return d
	}

	require.NoError(t, migrate.To(ctx, conn, 4))
	const community = "00000000-0000-4000-8000-0000000000aa"
	exec(`INSERT INTO communities (id, host) VALUES ($1, 'populated.example')`, community)
	// id n, author 0x22..., created 1 day ago + n seconds; sig is any 64 bytes.
	insertEvent := func(n, kind int, tags, content string, dTag *string) {
		t.Helper()
		exec(`INSERT INTO events (community_id, id, pubkey, created_at, kind, tags, content, sig, d_tag)
			VALUES ($1, decode(lpad(to_hex($2::int), 64, '0'), 'hex'), decode(repeat('22', 32), 'hex'),
			        now() - interval '1 day' + make_interval(secs => $2::int), $3, $4::jsonb, $5, decode(repeat('33', 64), 'hex'), $6)`,
			community, n, kind, tags, content, dTag)
	}
	slot := "essay"
	insertEvent(1, 1, `[]`, "a zebra crossed the road", nil)
	insertEvent(2, 1059, `[["p","`+hex32("44")+`"]]`, "zebra ciphertext", nil)
	insertEvent(3, 30023, `[["d","essay"]]`, "long form about zebras", &slot)
	insertEvent(4, 9, `[["p","`+hex32("55")+`"]]`, "hey you, a mention stored before the outbox existed", nil)
	exec(`INSERT INTO reactions (community_id, event_created_at, event_id, pubkey, emoji)
		SELECT community_id, created_at, id, decode(repeat('66', 32), 'hex'), e.emoji
		FROM events, (VALUES ('+'), (':' || repeat('k', 62) || ':')) AS e(emoji)
		WHERE id = decode(lpad('1', 64, '0'), 'hex')`)
	before := digest()
	require.Equal(t, 4, count(`SELECT count(*) FROM events`))
	require.Equal(t, 2, count(`SELECT count(*) FROM reactions`))

	require.NoError(t, migrate.To(ctx, conn, 5))
	require.Equal(t, before, digest(), "reactions survive 005")
	require.Equal(t, 1, count(`SELECT count(*) FROM reactions WHERE emoji = ':' || repeat('k', 62) || ':'`), "reactions survive 005")

	require.NoError(t, migrate.To(ctx, conn, 7))
	require.Equal(t, before, digest())
	search := func(word string) int {
		t.Helper()
		return count(`SELECT count(*) FROM events WHERE search_tsv @@ plainto_tsquery('simple', $1)`, word)
	}
	require.Equal(t, 1, search("crossed"), "old rows are searchable")
	require.Equal(t, 1, search("zebra"), "gift wraps are never indexed (and 'zebras' is another word in 'simple')")
	require.Zero(t, count(`SELECT count(*) FROM events WHERE kind = 1059 AND search_tsv IS NOT NULL`), "gift wraps are never indexed")
	require.Equal(t, 3, count(`SELECT count(*) FROM events WHERE search_tsv IS NOT NULL`), "old rows are searchable")

	require.NoError(t, migrate.To(ctx, conn, 9))
	require.Equal(t, before, digest())
	require.Zero(t, count(`SELECT count(*) FROM operator_listener_outbox`), "no retroactive deliveries")
	require.Equal(t, 3, count(`SELECT count(*) FROM _operator_global_tables
		WHERE table_name IN ('operator_listener_pubkeys', 'operator_listener_outbox', 'operator_auth_replays')`))

	// Whatever comes later keeps them too.
	require.NoError(t, migrate.Up(ctx, conn))
	require.Equal(t, before, digest())
}

func hex32(b string) string {
	out := ""
	for range 32 {
		out += b
	}
	return out
}
