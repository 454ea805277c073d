package migrate_test

import (
	"context"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/buzzrelay/buzz/internal/dbtest"
	"github.com/buzzrelay/buzz/internal/migrate"
)

// The migration archives the workflows left active on a definition hidden
// before the deletion side rows archived them: one pinned to a hidden
// event is archived, one pinned to a live event stays active, as does an
// unpinned one.
// Mutation killed: the UPDATE without e.deleted_at IS NOT NULL (the
// workflow of the live definition is archived too); no migration (the
// hidden one's workflow stays active and fires for good).
func TestWorkflowsOfHiddenDefinitionsMigrationArchivesThem(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	version := migrationVersion(t, "workflows_of_hidden_definitions_archived")

	conn := connect(t, dbtest.EmptyURL(t))
	require.NoError(t, migrate.To(ctx, conn, version-1))
	exec := func(sql string, args ...any) {
		t.Helper()
		_, err := conn.Exec(ctx, sql, args...)
		require.NoError(t, err)
	}
	const community = "00000000-0000-4000-8000-000000000072"
	const channel = "00000000-0000-4000-8000-0000000000c9"
	owner := strings.Repeat("aa", 32)
	exec(`INSERT INTO communities (id, host) VALUES ($1, 'wfhidden.example')`, community)
	exec(`INSERT INTO channels (community_id, id, name, created_by) VALUES ($1, $2, 'c', decode($3, 'hex'))`, community, channel, owner)
	event := func(id string, hidden bool) {
		t.Helper()
		exec(`INSERT INTO events (community_id, id, pubkey, created_at, kind, tags, content, sig, channel_id, d_tag, deleted_at)
			VALUES ($1, decode($2, 'hex'), decode($3, 'hex'), now(), 30620, '[]', '', decode($4, 'hex'), $5, $2, CASE WHEN $6 THEN now() END)`,
			community, id, owner, strings.Repeat("00", 64), channel, hidden)
	}
	workflow := func(id, eventID string) {
		t.Helper()
		exec(`INSERT INTO workflows (community_id, id, name, owner_pubkey, channel_id, definition, definition_hash, definition_event_id)
			VALUES ($1, $2, 'w', decode($3, 'hex'), $4, '{}', sha256('{}'), decode(nullif($5, ''), 'hex'))`,
			community, id, owner, channel, eventID)
	}
	hiddenEv, liveEv := strings.Repeat("01", 32), strings.Repeat("02", 32)
	event(hiddenEv, true)
	event(liveEv, false)
	hidden, live, unpinned := "00000000-0000-4000-8000-0000000000b1", "00000000-0000-4000-8000-0000000000b2", "00000000-0000-4000-8000-0000000000b3"
	workflow(hidden, hiddenEv)
	workflow(live, liveEv)
	workflow(unpinned, "")

	require.NoError(t, migrate.To(ctx, conn, version))
	state := func(id string) string {
		t.Helper()
		var status string
		var enabled bool
		require.NoError(t, conn.QueryRow(ctx, `SELECT status, enabled FROM workflows WHERE id = $1`, id).Scan(&status, &enabled))
		if !enabled {
			status += ", disabled"
		}
		return status
	}
	require.Equal(t, "archived, disabled", state(hidden))
	require.Equal(t, "active", state(live))
	require.Equal(t, "active", state(unpinned))
}
