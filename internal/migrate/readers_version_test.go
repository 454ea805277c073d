package migrate_test

import (
	"context"
	"testing"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/buzzrelay/buzz/internal/dbtest"
)

// Every change of who may read a channel counts on its readers_version,
// whichever session makes it (here plain SQL, no relay code): a member
// added, removed, added again; the visibility changed; the channel deleted.
// A role change, which changes no reader, does not count. The relay's
// fan-out compares this version with the reader set it cached
// (access.Cache.ChannelReaders).
// Mutations killed: either trigger of migration 038 missing, or counting
// an update that leaves removed_at alone.
func TestReadersVersionCountsEveryChangeOfWhoMayRead(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	conn := connect(t, dbtest.URL(t))
	community, channel := uuid.New(), uuid.New()
	owner, member := make([]byte, 32), make([]byte, 32)
	owner[0], member[0] = 1, 2
	version := func() int64 {
		t.Helper()
		var v int64
		require.NoError(t, conn.QueryRow(ctx, `SELECT readers_version FROM channels WHERE community_id = $1 AND id = $2`, community, channel).Scan(&v))
		return v
	}
	exec := func(sql string, args ...any) {
		t.Helper()
		_, err := conn.Exec(ctx, sql, args...)
		require.NoError(t, err)
	}
	exec(`INSERT INTO communities (id, host) VALUES ($1, 'readers-version.example')`, community)
	exec(`INSERT INTO channels (community_id, id, name, created_by, visibility) VALUES ($1, $2, 'room', $3, 'private')`, community, channel, owner)
	require.Zero(t, version())

	steps := []struct {
		what, sql string
		args      []any
		counts    bool
	}{
		{"owner added", `INSERT INTO channel_members (community_id, channel_id, pubkey, role) VALUES ($1, $2, $3, 'owner')`, []any{community, channel, owner}, true},
		{"member added", `INSERT INTO channel_members (community_id, channel_id, pubkey) VALUES ($1, $2, $3)`, []any{community, channel, member}, true},
		{"role changed", `UPDATE channel_members SET role = 'admin' WHERE community_id = $1 AND channel_id = $2 AND pubkey = $3`, []any{community, channel, member}, false},
		{"member removed", `UPDATE channel_members SET removed_at = now() WHERE community_id = $1 AND channel_id = $2 AND pubkey = $3`, []any{community, channel, member}, true},
		{"member added again", `UPDATE channel_members SET removed_at = NULL WHERE community_id = $1 AND channel_id = $2 AND pubkey = $3`, []any{community, channel, member}, true},
		{"renamed", `UPDATE channels SET name = 'hall' WHERE community_id = $1 AND id = $2`, []any{community, channel}, false},
		{"opened", `UPDATE channels SET visibility = 'open' WHERE community_id = $1 AND id = $2`, []any{community, channel}, true},
		{"deleted", `UPDATE channels SET deleted_at = now() WHERE community_id = $1 AND id = $2`, []any{community, channel}, true},
	}
	for _, s := range steps {
		before := version()
		exec(s.sql, s.args...)
		if s.counts {
			require.Equal(t, before+1, version(), s.what)
		} else {
			require.Equal(t, before, version(), s.what)
		}
	}
}
