package migrate_test

import (
	"context"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
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
	m := newWorkflowsBeforeMigration(t, "workflows_of_hidden_definitions_archived",
		"00000000-0000-4000-8000-000000000072", "00000000-0000-4000-8000-0000000000c9", "wfhidden.example")
	hiddenEv, liveEv := strings.Repeat("01", 32), strings.Repeat("02", 32)
	m.definition(hiddenEv, "deleted_at", "now")
	m.definition(liveEv, "deleted_at", "")
	hidden, live, unpinned := "00000000-0000-4000-8000-0000000000b1", "00000000-0000-4000-8000-0000000000b2", "00000000-0000-4000-8000-0000000000b3"
	m.workflow(hidden, hiddenEv)
	m.workflow(live, liveEv)
	m.workflow(unpinned, "")

	m.migrate()
	state := func(id string) string {
		t.Helper()
		var status string
		var enabled bool
		require.NoError(t, m.conn.QueryRow(context.Background(), `SELECT status, enabled FROM workflows WHERE id = $1`, id).Scan(&status, &enabled))
		if !enabled {
			status += ", disabled"
		}
		return status
	}
	require.Equal(t, "archived, disabled", state(hidden))
	require.Equal(t, "active", state(live))
	require.Equal(t, "active", state(unpinned))
}
