package migrate_test

import (
	"context"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/buzzrelay/buzz/internal/dbtest"
	"github.com/buzzrelay/buzz/internal/migrate"
)

// The definition-expiration migration fills the column for the rows there
// are: a workflow pinned to a stored expiring definition takes its
// expires_at, one pinned to a stored lasting one stays NULL (fires on), one
// pinned to an event no longer stored (purged after it expired) expires
// now, and one without a pinned event stays NULL. Mutations killed: no
// backfill (the expiring and the purged rows stay NULL and fire for ever);
// the second UPDATE without NOT EXISTS (the lasting row expires).
func TestWorkflowExpirationMigrationBackfillsPinnedDefinitions(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	version := migrationVersion(t, "workflow_definition_expiration")

	conn := connect(t, dbtest.EmptyURL(t))
	require.NoError(t, migrate.To(ctx, conn, version-1))
	exec := func(sql string, args ...any) {
		t.Helper()
		_, err := conn.Exec(ctx, sql, args...)
		require.NoError(t, err)
	}
	const community = "00000000-0000-4000-8000-000000000068"
	const channel = "00000000-0000-4000-8000-0000000000c8"
	owner := strings.Repeat("aa", 32)
	exec(`INSERT INTO communities (id, host) VALUES ($1, 'wfexp.example')`, community)
	exec(`INSERT INTO channels (community_id, id, name, created_by) VALUES ($1, $2, 'c', decode($3, 'hex'))`, community, channel, owner)
	event := func(id, expires string) {
		t.Helper()
		exec(`INSERT INTO events (community_id, id, pubkey, created_at, kind, tags, content, sig, channel_id, d_tag, expires_at)
			VALUES ($1, decode($2, 'hex'), decode($3, 'hex'), now(), 30620, '[]', '', decode($4, 'hex'), $5, $2, nullif($6, '')::timestamptz)`,
			community, id, owner, strings.Repeat("00", 64), channel, expires)
	}
	workflow := func(id, eventID string) {
		t.Helper()
		exec(`INSERT INTO workflows (community_id, id, name, owner_pubkey, channel_id, definition, definition_hash, definition_event_id)
			VALUES ($1, $2, 'w', decode($3, 'hex'), $4, '{}', sha256('{}'), decode(nullif($5, ''), 'hex'))`,
			community, id, owner, channel, eventID)
	}
	expiringEv, lastingEv, purgedEv := strings.Repeat("01", 32), strings.Repeat("02", 32), strings.Repeat("03", 32)
	event(expiringEv, "2030-01-02T03:04:05Z")
	event(lastingEv, "")
	expiring, lasting, purged, unpinned := "00000000-0000-4000-8000-0000000000a1", "00000000-0000-4000-8000-0000000000a2",
		"00000000-0000-4000-8000-0000000000a3", "00000000-0000-4000-8000-0000000000a4"
	workflow(expiring, expiringEv)
	workflow(lasting, lastingEv)
	workflow(purged, purgedEv)
	workflow(unpinned, "")

	require.NoError(t, migrate.To(ctx, conn, version))
	expiresAt := func(id string) *string {
		t.Helper()
		var at *string
		require.NoError(t, conn.QueryRow(ctx, `SELECT to_char(definition_expires_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS"Z"')
			FROM workflows WHERE id = $1`, id).Scan(&at))
		return at
	}
	require.Equal(t, "2030-01-02T03:04:05Z", *expiresAt(expiring))
	require.Nil(t, expiresAt(lasting), "a lasting definition fires on")
	require.NotNil(t, expiresAt(purged), "a definition no longer stored expires")
	require.Nil(t, expiresAt(unpinned))
}
