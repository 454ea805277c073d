package migrate_test

import (
	"context"
	"io/fs"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/buzzrelay/buzz/internal/dbtest"
	"github.com/buzzrelay/buzz/migrations"
)

// The channel-id lookup index (migration 006): covering, partial, never unique
// (a channel id may exist in two communities), and built concurrently.
func TestChannelIDLookupIndexMigration(t *testing.T) {
	t.Parallel()
	body, err := fs.ReadFile(migrations.FS, "006_channels_id_lookup_index.sql")
	require.NoError(t, err)
	up, _, _ := strings.Cut(string(body), "---- create above / drop below ----")
	sql := withoutComments(up)
	require.Contains(t, sql, "idx_channels_id_live")
	require.Contains(t, sql, "INCLUDE (community_id)")
	require.Contains(t, sql, "WHERE deleted_at IS NULL")
	require.Contains(t, sql, "CONCURRENTLY IF NOT EXISTS")
	require.NotContains(t, strings.ToUpper(sql), "UNIQUE")

	ctx := context.Background()
	conn := connect(t, dbtest.URL(t))
	var def string
	var unique, valid bool
	require.NoError(t, conn.QueryRow(ctx, `
		SELECT pg_get_indexdef(i.indexrelid), i.indisunique, i.indisvalid
		FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid
		WHERE c.relname = 'idx_channels_id_live'`).Scan(&def, &unique, &valid))
	require.Equal(t, "CREATE INDEX idx_channels_id_live ON public.channels USING btree (id) INCLUDE (community_id) WHERE (deleted_at IS NULL)", def)
	require.False(t, unique)
	require.True(t, valid)

	// The tenant-independent lookup it serves uses it instead of scanning the
	// table (on an empty table any plan is as good, so give it some rows).
	_, err = conn.Exec(ctx, `
		INSERT INTO communities (host) VALUES ('index.example');
		INSERT INTO channels (community_id, id, name, created_by)
		SELECT c.id, gen_random_uuid(), 'ch' || n, decode(repeat('ab', 32), 'hex')
		FROM communities c, generate_series(1, 5000) n;`)
	require.NoError(t, err)
	_, err = conn.Exec(ctx, "VACUUM ANALYZE channels")
	require.NoError(t, err)
	rows, err := conn.Query(ctx, `EXPLAIN (COSTS OFF) SELECT id, community_id FROM channels WHERE id = ANY($1::uuid[]) AND deleted_at IS NULL`,
		[]string{"00000000-0000-0000-0000-000000000001", "00000000-0000-0000-0000-000000000002"})
	require.NoError(t, err)
	var plan strings.Builder
	for rows.Next() {
		var line string
		require.NoError(t, rows.Scan(&line))
		plan.WriteString(line + "\n")
	}
	require.NoError(t, rows.Err())
	require.Contains(t, plan.String(), "idx_channels_id_live", plan.String())
	require.NotContains(t, plan.String(), "Seq Scan", plan.String())
}
