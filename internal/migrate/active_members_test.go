package migrate_test

import (
	"context"
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/buzzrelay/buzz/internal/dbtest"
	"github.com/buzzrelay/buzz/internal/migrate"
)

// activeMembers returns channel's counter and its active rows counted.
func activeMembers(t *testing.T, conn *pgx.Conn, community, channel uuid.UUID) (counter, rows int) {
	t.Helper()
	require.NoError(t, conn.QueryRow(context.Background(), `
		SELECT active_members, (SELECT count(*) FROM channel_members m
		                        WHERE m.community_id = c.community_id AND m.channel_id = c.id AND m.removed_at IS NULL)
		FROM channels c WHERE community_id = $1 AND id = $2`, community, channel).Scan(&counter, &rows))
	return counter, rows
}

// Every membership change counts on channels.active_members, whichever
// session makes it (here plain SQL, no relay code): a member added,
// removed, removed again, added back; a row inserted already removed and a
// role change count nothing; another channel's members are its own.
// Mutations killed: the trigger not subtracting a removal; counting a row
// inserted removed, or an update between two removal times.
func TestActiveMembersCountsEveryMembershipChange(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	conn := connect(t, dbtest.URL(t))
	community, channel, other := uuid.New(), uuid.New(), uuid.New()
	owner, member, gone := make([]byte, 32), make([]byte, 32), make([]byte, 32)
	owner[0], member[0], gone[0] = 1, 2, 3
	exec := func(sql string, args ...any) {
		t.Helper()
		_, err := conn.Exec(ctx, sql, args...)
		require.NoError(t, err)
	}
	exec(`INSERT INTO communities (id, host) VALUES ($1, 'active-members.example')`, community)
	for _, ch := range []uuid.UUID{channel, other} {
		exec(`INSERT INTO channels (community_id, id, name, created_by) VALUES ($1, $2, 'room', $3)`, community, ch, owner)
	}
	exec(`INSERT INTO channel_members (community_id, channel_id, pubkey, role) VALUES ($1, $2, $3, 'owner')`, community, other, owner)

	member1 := []any{community, channel, member}
	for _, s := range []struct {
		what, sql string
		args      []any
		want      int
	}{
		{"owner added", `INSERT INTO channel_members (community_id, channel_id, pubkey, role) VALUES ($1, $2, $3, 'owner')`, []any{community, channel, owner}, 1},
		{"member added", `INSERT INTO channel_members (community_id, channel_id, pubkey) VALUES ($1, $2, $3)`, member1, 2},
		{"role changed", `UPDATE channel_members SET role = 'admin' WHERE community_id = $1 AND channel_id = $2 AND pubkey = $3`, member1, 2},
		{"member removed", `UPDATE channel_members SET removed_at = now() WHERE community_id = $1 AND channel_id = $2 AND pubkey = $3`, member1, 1},
		{"removed again later", `UPDATE channel_members SET removed_at = now() + interval '1 minute' WHERE community_id = $1 AND channel_id = $2 AND pubkey = $3`, member1, 1},
		{"row inserted removed", `INSERT INTO channel_members (community_id, channel_id, pubkey, removed_at) VALUES ($1, $2, $3, now())`, []any{community, channel, gone}, 1},
		{"member back", `UPDATE channel_members SET removed_at = NULL WHERE community_id = $1 AND channel_id = $2 AND pubkey = $3`, member1, 2},
	} {
		exec(s.sql, s.args...)
		counter, rows := activeMembers(t, conn, community, channel)
		require.Equal(t, s.want, rows, s.what)
		require.Equal(t, s.want, counter, s.what)
	}
	counter, _ := activeMembers(t, conn, community, other)
	require.Equal(t, 1, counter, "the other channel counts its own")
}

// The migration counts the members already there (active ones only, per
// channel), and its down part drops the column so it applies again.
// Mutation killed: the migration without its backfill (every channel
// starts at zero, and a full one takes members past its limit).
func TestActiveMembersMigrationCountsExistingMembers(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	conn := connect(t, dbtest.EmptyURL(t))
	version := migrationVersion(t, "channel_active_members")
	require.NoError(t, migrate.To(ctx, conn, version-1))
	exec := func(sql string, args ...any) {
		t.Helper()
		_, err := conn.Exec(ctx, sql, args...)
		require.NoError(t, err)
	}
	community, big, small, empty := uuid.New(), uuid.New(), uuid.New(), uuid.New()
	owner := make([]byte, 32)
	exec(`INSERT INTO communities (id, host) VALUES ($1, 'active-members-backfill.example')`, community)
	for _, ch := range []uuid.UUID{big, small, empty} {
		exec(`INSERT INTO channels (community_id, id, name, created_by) VALUES ($1, $2, 'room', $3)`, community, ch, owner)
	}
	exec(`INSERT INTO channel_members (community_id, channel_id, pubkey, removed_at)
		SELECT $1, $2, sha256(i::text::bytea), CASE WHEN i % 4 = 0 THEN now() END FROM generate_series(1, 40) i`, community, big)
	exec(`INSERT INTO channel_members (community_id, channel_id, pubkey) VALUES ($1, $2, $3)`, community, small, owner)

	for range 2 { // up, down, up again
		require.NoError(t, migrate.To(ctx, conn, version))
		for ch, want := range map[uuid.UUID]int{big: 30, small: 1, empty: 0} {
			counter, rows := activeMembers(t, conn, community, ch)
			require.Equal(t, want, rows)
			require.Equal(t, want, counter)
		}
		require.NoError(t, migrate.To(ctx, conn, version-1))
		var columns int
		require.NoError(t, conn.QueryRow(ctx, `SELECT count(*) FROM information_schema.columns WHERE table_name = 'channels' AND column_name = 'active_members'`).Scan(&columns))
		require.Zero(t, columns)
	}
}

// A community being deleted (its deletion fenced every write to its rows)
// may still have channels with members when the migration runs: the
// backfill leaves them at zero instead of failing on the fence, which
// stopped the whole migration (55000). Such a community never writes
// again: its deletion only goes on to purge them.
// Mutation killed: the backfill without community_write_allowed (the
// migration fails on the fenced community's channel).
func TestActiveMembersMigrationSkipsACommunityBeingDeleted(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	conn := connect(t, dbtest.EmptyURL(t))
	version := migrationVersion(t, "channel_active_members")
	require.NoError(t, migrate.To(ctx, conn, version-1))
	exec := func(sql string, args ...any) {
		t.Helper()
		_, err := conn.Exec(ctx, sql, args...)
		require.NoError(t, err)
	}
	live, deleting := uuid.New(), uuid.New()
	channels := map[uuid.UUID]uuid.UUID{live: uuid.New(), deleting: uuid.New()}
	owner := make([]byte, 32)
	for community, host := range map[uuid.UUID]string{live: "active-members-live.example", deleting: "active-members-deleting.example"} {
		exec(`INSERT INTO communities (id, host) VALUES ($1, $2)`, community, host)
		exec(`INSERT INTO channels (community_id, id, name, created_by) VALUES ($1, $2, 'room', $3)`, community, channels[community], owner)
		exec(`INSERT INTO channel_members (community_id, channel_id, pubkey)
			SELECT $1, $2, sha256(i::text::bytea) FROM generate_series(1, 3) i`, community, channels[community])
	}
	// Fenced as its deletion's executor would, without the executor.
	tx, err := conn.Begin(ctx)
	require.NoError(t, err)
	_, err = tx.Exec(ctx, `SET LOCAL session_replication_role = replica`)
	require.NoError(t, err)
	_, err = tx.Exec(ctx, `UPDATE communities SET deletion_state = 'fenced' WHERE id = $1`, deleting)
	require.NoError(t, err)
	require.NoError(t, tx.Commit(ctx))

	require.NoError(t, migrate.To(ctx, conn, version))
	counter, rows := activeMembers(t, conn, live, channels[live])
	require.Equal(t, 3, rows)
	require.Equal(t, 3, counter)
	counter, _ = activeMembers(t, conn, deleting, channels[deleting])
	require.Zero(t, counter, "left to the deletion")
}

// A hard DELETE of member rows (an operator's psql session; the relay only
// soft-removes) counts too: each channel loses its deleted active members,
// in one statement across channels, and its readers_version moves so a
// relay's cached readers are read again. Deleting rows already removed
// changes neither.
// Mutations killed: migration 049's trigger missing (counter and version
// stay), counting removed rows, or not moving readers_version.
func TestHardDeletedMembersAreCounted(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	conn := connect(t, dbtest.URL(t))
	community, first, second := uuid.New(), uuid.New(), uuid.New()
	exec := func(sql string, args ...any) {
		t.Helper()
		_, err := conn.Exec(ctx, sql, args...)
		require.NoError(t, err)
	}
	readersVersion := func(channel uuid.UUID) (v int64) {
		t.Helper()
		require.NoError(t, conn.QueryRow(ctx, `SELECT readers_version FROM channels WHERE community_id = $1 AND id = $2`, community, channel).Scan(&v))
		return v
	}
	exec(`INSERT INTO communities (id, host) VALUES ($1, 'hard-deleted-members.example')`, community)
	for _, ch := range []uuid.UUID{first, second} {
		exec(`INSERT INTO channels (community_id, id, name, created_by) VALUES ($1, $2, 'room', $3)`, community, ch, make([]byte, 32))
		// Members 1-5 active, 6-7 removed, in each channel.
		exec(`INSERT INTO channel_members (community_id, channel_id, pubkey, removed_at)
			SELECT $1, $2, sha256(i::text::bytea), CASE WHEN i > 5 THEN now() END FROM generate_series(1, 7) i`, community, ch)
	}
	firstVersion, secondVersion := readersVersion(first), readersVersion(second)

	// Two active and one removed member of first, one active of second.
	exec(`DELETE FROM channel_members WHERE community_id = $1 AND (
		(channel_id = $2 AND pubkey IN (sha256('1'::bytea), sha256('2'::bytea), sha256('6'::bytea))) OR
		(channel_id = $3 AND pubkey = sha256('3'::bytea)))`, community, first, second)
	for ch, want := range map[uuid.UUID]int{first: 3, second: 4} {
		counter, rows := activeMembers(t, conn, community, ch)
		require.Equal(t, want, rows)
		require.Equal(t, want, counter)
	}
	require.Greater(t, readersVersion(first), firstVersion)
	require.Greater(t, readersVersion(second), secondVersion)

	firstVersion = readersVersion(first)
	exec(`DELETE FROM channel_members WHERE community_id = $1 AND channel_id = $2 AND removed_at IS NOT NULL`, community, first)
	counter, _ := activeMembers(t, conn, community, first)
	require.Equal(t, 3, counter, "removed rows were not counted")
	require.Equal(t, firstVersion, readersVersion(first), "no reader left")
}
