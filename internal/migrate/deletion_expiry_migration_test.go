package migrate_test

import (
	"context"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/buzzrelay/buzz/internal/dbtest"
	"github.com/buzzrelay/buzz/internal/migrate"
)

// The migration that stops deletions from expiring clears the expiration of
// the deletions stored with one, and of nothing else. Mutation killed: an
// UPDATE without the kind (the note's expiration is cleared too), or none
// (the deletion keeps its expiration and the purge would take it).
func TestDeletionExpiryMigrationClearsDeletionsOnly(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	version := migrationVersion(t, "deletions_never_expire")

	conn := connect(t, dbtest.EmptyURL(t))
	require.NoError(t, migrate.To(ctx, conn, version-1))
	const community = "00000000-0000-4000-8000-000000000044"
	_, err := conn.Exec(ctx, `INSERT INTO communities (id, host) VALUES ($1, 'expiry.example')`, community)
	require.NoError(t, err)
	insert := func(id string, kind int, tags string) {
		t.Helper()
		_, err := conn.Exec(ctx, `INSERT INTO events (community_id, id, pubkey, created_at, kind, tags, content, sig, expires_at)
			VALUES ($1, decode($2, 'hex'), decode($3, 'hex'), now(), $4, $5::jsonb, '', decode($6, 'hex'), now() + interval '1 hour')`,
			community, id, strings.Repeat("aa", 32), kind, tags, strings.Repeat("00", 64))
		require.NoError(t, err)
	}
	deletion, note := strings.Repeat("01", 32), strings.Repeat("02", 32)
	insert(note, 1, `[]`)
	insert(deletion, 5, `[["e","`+note+`"]]`)

	require.NoError(t, migrate.To(ctx, conn, version))
	expiring := func(id string) bool {
		var has bool
		require.NoError(t, conn.QueryRow(ctx, `SELECT expires_at IS NOT NULL FROM events WHERE id = decode($1, 'hex')`, id).Scan(&has))
		return has
	}
	require.False(t, expiring(deletion), "the deletion keeps its expiration")
	require.True(t, expiring(note), "the note lost its expiration")
}
