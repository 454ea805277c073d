package migrate_test

import (
	"context"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/buzzrelay/buzz/internal/dbtest"
	"github.com/buzzrelay/buzz/internal/migrate"
)

// workflowsBeforeMigration is a database migrated to just before the named
// workflow migration, holding one community and channel, for a test that
// stores definitions and workflows there and then runs the migration.
type workflowsBeforeMigration struct {
	t                         *testing.T
	conn                      *pgx.Conn
	version                   int32
	community, channel, owner string
}

func newWorkflowsBeforeMigration(t *testing.T, name, community, channel, host string) *workflowsBeforeMigration {
	m := &workflowsBeforeMigration{t: t, version: migrationVersion(t, name), community: community, channel: channel, owner: strings.Repeat("aa", 32)}
	m.conn = connect(t, dbtest.EmptyURL(t))
	require.NoError(t, migrate.To(context.Background(), m.conn, m.version-1))
	m.exec(`INSERT INTO communities (id, host) VALUES ($1, $2)`, community, host)
	m.exec(`INSERT INTO channels (community_id, id, name, created_by) VALUES ($1, $2, 'c', decode($3, 'hex'))`, community, channel, m.owner)
	return m
}

func (m *workflowsBeforeMigration) exec(sql string, args ...any) {
	m.t.Helper()
	_, err := m.conn.Exec(context.Background(), sql, args...)
	require.NoError(m.t, err)
}

// definition stores a definition event (kind 30620) whose column
// (expires_at or deleted_at) holds at, a timestamptz literal; "" is NULL.
func (m *workflowsBeforeMigration) definition(id, column, at string) {
	m.t.Helper()
	m.exec(`INSERT INTO events (community_id, id, pubkey, created_at, kind, tags, content, sig, channel_id, d_tag, `+column+`)
		VALUES ($1, decode($2, 'hex'), decode($3, 'hex'), now(), 30620, '[]', '', decode($4, 'hex'), $5, $2, nullif($6, '')::timestamptz)`,
		m.community, id, m.owner, strings.Repeat("00", 64), m.channel, at)
}

// workflow stores a workflow pinned to eventID ("" for none).
func (m *workflowsBeforeMigration) workflow(id, eventID string) {
	m.t.Helper()
	m.exec(`INSERT INTO workflows (community_id, id, name, owner_pubkey, channel_id, definition, definition_hash, definition_event_id)
		VALUES ($1, $2, 'w', decode($3, 'hex'), $4, '{}', sha256('{}'), decode(nullif($5, ''), 'hex'))`,
		m.community, id, m.owner, m.channel, eventID)
}

func (m *workflowsBeforeMigration) migrate() {
	m.t.Helper()
	require.NoError(m.t, migrate.To(context.Background(), m.conn, m.version))
}

// The definition-expiration migration fills the column for the rows there
// are: a workflow pinned to a stored expiring definition takes its
// expires_at, one pinned to a stored lasting one stays NULL (fires on), one
// pinned to an event no longer stored (purged after it expired) expires
// now, and one without a pinned event stays NULL. Mutations killed: no
// backfill (the expiring and the purged rows stay NULL and fire for ever);
// the second UPDATE without NOT EXISTS (the lasting row expires).
func TestWorkflowExpirationMigrationBackfillsPinnedDefinitions(t *testing.T) {
	t.Parallel()
	m := newWorkflowsBeforeMigration(t, "workflow_definition_expiration",
		"00000000-0000-4000-8000-000000000068", "00000000-0000-4000-8000-0000000000c8", "wfexp.example")
	expiringEv, lastingEv, purgedEv := strings.Repeat("01", 32), strings.Repeat("02", 32), strings.Repeat("03", 32)
	m.definition(expiringEv, "expires_at", "2030-01-02T03:04:05Z")
	m.definition(lastingEv, "expires_at", "")
	expiring, lasting, purged, unpinned := "00000000-0000-4000-8000-0000000000a1", "00000000-0000-4000-8000-0000000000a2",
		"00000000-0000-4000-8000-0000000000a3", "00000000-0000-4000-8000-0000000000a4"
	m.workflow(expiring, expiringEv)
	m.workflow(lasting, lastingEv)
	m.workflow(purged, purgedEv)
	m.workflow(unpinned, "")

	m.migrate()
	expiresAt := func(id string) *string {
		t.Helper()
		var at *string
		require.NoError(t, m.conn.QueryRow(context.Background(), `SELECT to_char(definition_expires_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS"Z"')
			FROM workflows WHERE id = $1`, id).Scan(&at))
		return at
	}
	require.Equal(t, "2030-01-02T03:04:05Z", *expiresAt(expiring))
	require.Nil(t, expiresAt(lasting), "a lasting definition fires on")
	require.NotNil(t, expiresAt(purged), "a definition no longer stored expires")
	require.Nil(t, expiresAt(unpinned))
}
