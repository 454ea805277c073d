package migrate_test

import (
	"context"
	"strings"
	"testing"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/buzzrelay/buzz/internal/dbtest"
	"github.com/buzzrelay/buzz/internal/migrate"
)

// The migration shows again the channel moderation events their author's
// kind 5 hid, and only those, and removes the roles lists (39003) clients
// published; a community being deleted is left to its deletion.
// Mutations killed: no UPDATE (the removal stays hidden); an UPDATE
// without the author match (the moderation event another key's kind 5
// named is shown), without the kinds (the hidden chat message is shown),
// or without the channel (the channel-less 9001 is shown); no DELETE (the
// client's 39003 stays); either statement without the fence (the migration
// fails on the fenced community's rows).
func TestModerationUnhiddenMigrationOnADatabaseWithRows(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	version := migrationVersion(t, "moderation_events_unhidden")
	conn := connect(t, dbtest.EmptyURL(t))
	require.NoError(t, migrate.To(ctx, conn, version-1))
	exec := func(sql string, args ...any) {
		t.Helper()
		_, err := conn.Exec(ctx, sql, args...)
		require.NoError(t, err)
	}
	live, deleting := uuid.New(), uuid.New()
	exec(`INSERT INTO communities (id, host) VALUES ($1, 'unhide-live.example'), ($2, 'unhide-deleting.example')`, live, deleting)
	channel := uuid.New()
	admin, other := strings.Repeat("aa", 32), strings.Repeat("bb", 32)
	n := 0
	// insert stores an event of the author, hidden or not, and returns its id.
	insert := func(community uuid.UUID, author string, kind int, inChannel, hidden bool, tags string) string {
		t.Helper()
		n++
		id := strings.Repeat("0", 62) + string("0123456789abcdef"[n/16]) + string("0123456789abcdef"[n%16])
		var ch *uuid.UUID
		if inChannel {
			ch = &channel
		}
		var dTag *string
		if kind >= 30000 && kind < 40000 {
			d := channel.String()
			dTag = &d
		}
		exec(`INSERT INTO events (community_id, id, pubkey, created_at, kind, tags, content, sig, channel_id, d_tag, deleted_at)
			VALUES ($1, decode($2, 'hex'), decode($3, 'hex'), now() - interval '1 hour', $4, $5::jsonb, '', decode(repeat('00', 64), 'hex'),
			        $6, $7, CASE WHEN $8 THEN now() END)`,
			community, id, author, kind, tags, ch, dTag, hidden)
		return id
	}
	deleteByKind5 := func(community uuid.UUID, author string, ids ...string) {
		t.Helper()
		tags := []string{}
		for _, id := range ids {
			tags = append(tags, `["e","`+id+`"]`)
		}
		insert(community, author, 5, true, false, "["+strings.Join(tags, ",")+"]")
	}
	removal := insert(live, admin, 9001, true, true, `[]`)
	grant := insert(live, admin, 9000, true, true, `[]`)
	message := insert(live, admin, 9, true, true, `[]`)
	global := insert(live, admin, 9001, false, true, `[]`)
	deleteByKind5(live, admin, removal, message, global)
	namedByOther := insert(live, admin, 9002, true, true, `[]`)
	deleteByKind5(live, other, namedByOther)
	// grant was hidden by some other means, with no kind 5 of its author naming it.
	_ = grant
	clientRoles := insert(live, other, 39003, true, false, `[["d","x"]]`)
	relayList := insert(live, other, 39000, true, false, `[["d","x"]]`)
	fencedRemoval := insert(deleting, admin, 9001, true, true, `[]`)
	deleteByKind5(deleting, admin, fencedRemoval)
	fencedRoles := insert(deleting, other, 39003, true, false, `[]`)

	// Fenced as its deletion's executor would, without the executor.
	tx, err := conn.Begin(ctx)
	require.NoError(t, err)
	_, err = tx.Exec(ctx, `SET LOCAL session_replication_role = replica`)
	require.NoError(t, err)
	_, err = tx.Exec(ctx, `UPDATE communities SET deletion_state = 'fenced' WHERE id = $1`, deleting)
	require.NoError(t, err)
	require.NoError(t, tx.Commit(ctx))

	require.NoError(t, migrate.To(ctx, conn, version))
	state := func(community uuid.UUID, id string) string {
		t.Helper()
		var hidden []bool
		rows, err := conn.Query(ctx, `SELECT deleted_at IS NOT NULL FROM events WHERE community_id = $1 AND id = decode($2, 'hex')`, community, id)
		require.NoError(t, err)
		for rows.Next() {
			var h bool
			require.NoError(t, rows.Scan(&h))
			hidden = append(hidden, h)
		}
		require.NoError(t, rows.Err())
		switch {
		case len(hidden) == 0:
			return "gone"
		case hidden[0]:
			return "hidden"
		}
		return "shown"
	}
	require.Equal(t, "shown", state(live, removal), "the removal its author's kind 5 hid")
	require.Equal(t, "hidden", state(live, grant), "a moderation event no kind 5 of its author names")
	require.Equal(t, "hidden", state(live, message), "a chat message its author deleted")
	require.Equal(t, "hidden", state(live, global), "a channel-less 9001 is an ordinary event")
	require.Equal(t, "hidden", state(live, namedByOther), "named by another key's kind 5")
	require.Equal(t, "gone", state(live, clientRoles), "a client's roles list")
	require.Equal(t, "shown", state(live, relayList), "a 39000 list")
	require.Equal(t, "hidden", state(deleting, fencedRemoval), "left to the community's deletion")
	require.Equal(t, "shown", state(deleting, fencedRoles), "left to the community's deletion")
}

// The migration fences one community at a time: community_write_allowed
// holds a lock per community until its transaction ends, so a single
// transaction over every community fills the shared lock table on a
// database of some ten thousand communities ("out of shared memory").
// A trigger the test adds records how many advisory locks the migrating
// session holds at each row it deletes. Mutation killed: both statements
// over every writable community in one transaction (60 locks at once).
func TestModerationUnhiddenMigrationFencesOneCommunityAtATime(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	version := migrationVersion(t, "moderation_events_unhidden")
	conn := connect(t, dbtest.EmptyURL(t))
	require.NoError(t, migrate.To(ctx, conn, version-1))
	const communities = 60
	_, err := conn.Exec(ctx, `
		INSERT INTO communities (id, host)
		SELECT gen_random_uuid(), 'fence-' || i || '.example' FROM generate_series(1, $1) i`, communities)
	require.NoError(t, err)
	_, err = conn.Exec(ctx, `
		INSERT INTO events (community_id, id, pubkey, created_at, kind, tags, content, sig, d_tag)
		SELECT c.id, sha256(c.id::text::bytea), decode(repeat('bb', 32), 'hex'), now(), 39003, '[["d","x"]]', '',
		       decode(repeat('00', 64), 'hex'), 'x'
		FROM communities c`)
	require.NoError(t, err)
	_, err = conn.Exec(ctx, `
		CREATE TABLE advisory_locks_seen (n int);
		CREATE FUNCTION record_advisory_locks() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN
			INSERT INTO advisory_locks_seen
			SELECT count(*) FROM pg_locks WHERE pid = pg_backend_pid() AND locktype = 'advisory';
			RETURN OLD;
		END $$;
		CREATE TRIGGER record_advisory_locks AFTER DELETE ON events
			FOR EACH ROW EXECUTE FUNCTION record_advisory_locks();`)
	require.NoError(t, err)

	require.NoError(t, migrate.To(ctx, conn, version))
	var deleted, most int
	require.NoError(t, conn.QueryRow(ctx, `SELECT count(*), max(n) FROM advisory_locks_seen`).Scan(&deleted, &most))
	require.Equal(t, communities, deleted, "every client's roles list is removed")
	// A few: the migration runner's own, and this community's.
	require.Less(t, most, 10, "advisory locks held at once while deleting")
}
