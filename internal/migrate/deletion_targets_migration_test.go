package migrate_test

import (
	"context"
	"strings"
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/buzzrelay/buzz/internal/dbtest"
	"github.com/buzzrelay/buzz/internal/migrate"
)

// The deletions stored before migration 061 keep the ids they name deleted
// once 062 has run: the author's event with such an id is refused, another
// author's is stored. Only e tags holding a lowercase hex id are read (the
// relay's own reading of a deletion), and a community being deleted is left
// to its deletion. Mutation killed: 062 without its INSERT (the note is
// stored).
func TestDeletionTargetsBackfill(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	version := migrationVersion(t, "deletion_targets_backfill")
	conn := connect(t, dbtest.EmptyURL(t))
	require.NoError(t, migrate.To(ctx, conn, version-2))

	live, deleting := uuid.New(), uuid.New()
	for community, host := range map[uuid.UUID]string{live: "backfill-live.example", deleting: "backfill-deleting.example"} {
		_, err := conn.Exec(ctx, `INSERT INTO communities (id, host) VALUES ($1, $2)`, community, host)
		require.NoError(t, err)
	}
	author, other := strings.Repeat("aa", 32), strings.Repeat("bb", 32)
	insert := func(community uuid.UUID, id, pubkey string, kind int, tags string) int64 {
		t.Helper()
		tag, err := conn.Exec(ctx, `INSERT INTO events (community_id, id, pubkey, created_at, kind, tags, content, sig)
			VALUES ($1, decode($2, 'hex'), decode($3, 'hex'), now(), $4, $5::jsonb, '', decode($6, 'hex'))`,
			community, id, pubkey, kind, tags, strings.Repeat("00", 64))
		require.NoError(t, err)
		return tag.RowsAffected()
	}
	note, upper, back := strings.Repeat("02", 32), strings.Repeat("0A", 32), strings.Repeat("03", 32)
	for _, community := range []uuid.UUID{live, deleting} {
		insert(community, strings.Repeat("01", 32), author, 5,
			`[["e","`+note+`","wss://relay.example"],["e","`+upper+`"],["e","not an id"],["a","30023:`+author+`:x"],["e"],["e","`+back+`"]]`)
		// Came back before 061: stored after its author's deletion named it.
		insert(community, back, author, 1, `[]`)
	}
	insert(live, back, other, 1, `[]`)
	tx, err := conn.Begin(ctx)
	require.NoError(t, err)
	_, err = tx.Exec(ctx, `SET LOCAL session_replication_role = replica`)
	require.NoError(t, err)
	_, err = tx.Exec(ctx, `UPDATE communities SET deletion_state = 'fenced' WHERE id = $1`, deleting)
	require.NoError(t, err)
	require.NoError(t, tx.Commit(ctx))

	require.NoError(t, migrate.To(ctx, conn, version))
	targets, err := conn.Query(ctx, `SELECT community_id, encode(target_id, 'hex'), encode(author, 'hex') FROM event_deletion_targets`)
	require.NoError(t, err)
	rows, err := pgx.CollectRows(targets, pgx.RowToStructByPos[struct {
		Community      uuid.UUID
		Target, Author string
	}])
	require.NoError(t, err)
	require.Len(t, rows, 2, "two targets, of the live community")
	for _, row := range rows {
		require.Equal(t, live, row.Community)
		require.Contains(t, []string{note, back}, row.Target)
		require.Equal(t, author, row.Author)
	}
	hidden := func(community uuid.UUID, pubkey string) bool {
		t.Helper()
		var deleted bool
		require.NoError(t, conn.QueryRow(ctx, `SELECT deleted_at IS NOT NULL FROM events
			WHERE community_id = $1 AND id = decode($2, 'hex') AND pubkey = decode($3, 'hex')`, community, back, pubkey).Scan(&deleted))
		return deleted
	}
	require.True(t, hidden(live, author), "the note that came back is hidden")
	require.False(t, hidden(live, other), "another author's event with the id stays")
	require.False(t, hidden(deleting, author), "a community being deleted is left to its deletion")

	require.Zero(t, insert(live, note, author, 1, `[]`), "the deleted note is refused")
	require.EqualValues(t, 1, insert(live, upper, author, 1, `[]`), "an id the relay does not read as one is not a target")
	require.EqualValues(t, 1, insert(live, note, other, 1, `[]`), "another author's event with the id is stored")
}
