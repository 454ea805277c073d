package migrate_test

import (
	"context"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/buzzrelay/buzz/internal/dbtest"
	"github.com/buzzrelay/buzz/internal/migrate"
)

// Reactions hidden before migration 025's trigger existed (a moderator's
// 9005 left their rows active) lose their rows in 026, dated with the
// hiding; a visible reaction's row stays.
// Mutation killed: 026's UPDATE removed (the hidden reaction's row stays
// active).
func TestHiddenReactionsMigrationOnADatabaseWithRows(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	conn := connect(t, dbtest.EmptyURL(t))
	exec := func(sql string, args ...any) {
		t.Helper()
		_, err := conn.Exec(ctx, sql, args...)
		require.NoError(t, err)
	}
	require.NoError(t, migrate.To(ctx, conn, 24))
	const community = "00000000-0000-4000-8000-000000000025"
	exec(`INSERT INTO communities (id, host) VALUES ($1, 'reactions.example')`, community)
	reactor, target := strings.Repeat("22", 32), strings.Repeat("44", 32)
	react := func(id string, hidden bool) {
		t.Helper()
		exec(`INSERT INTO events (community_id, id, pubkey, created_at, kind, tags, content, sig, deleted_at)
			VALUES ($1, decode($2, 'hex'), decode($3, 'hex'), '2026-01-01', 7,
			        jsonb_build_array(jsonb_build_array('e', $4::text)), '+', decode(repeat('33', 64), 'hex'),
			        CASE WHEN $5 THEN timestamptz '2026-01-02' END)`, community, id, reactor, target, hidden)
		exec(`INSERT INTO reactions (community_id, event_created_at, event_id, pubkey, emoji, reaction_event_id)
			VALUES ($1, '2025-12-31', decode($2, 'hex'), decode($3, 'hex'), $4, decode($5, 'hex'))`,
			community, target, reactor, id[:2], id)
	}
	hidden, visible := strings.Repeat("01", 32), strings.Repeat("02", 32)
	react(hidden, true)
	react(visible, false)

	require.NoError(t, migrate.To(ctx, conn, 26))
	removedAt := func(id string) *string {
		t.Helper()
		var at *string
		require.NoError(t, conn.QueryRow(ctx, `SELECT to_char(removed_at AT TIME ZONE 'UTC', 'YYYY-MM-DD')
			FROM reactions WHERE reaction_event_id = decode($1, 'hex')`, id).Scan(&at))
		return at
	}
	require.NotNil(t, removedAt(hidden), "the hidden reaction's row is removed")
	require.Equal(t, "2026-01-02", *removedAt(hidden), "dated with the hiding")
	require.Nil(t, removedAt(visible), "a visible reaction's row stays")
}
