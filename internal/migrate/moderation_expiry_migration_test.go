package migrate_test

import (
	"context"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/buzzrelay/buzz/internal/dbtest"
	"github.com/buzzrelay/buzz/internal/migrate"
)

// The migration that stops a channel's moderation events from expiring
// clears the expiration of those stored with one, and of nothing else: a
// member's message in the channel and a kind 9001 outside any channel
// keep theirs. Mutation killed: an UPDATE without the channel or the kinds
// (the message's or the unbound event's expiration is cleared too), or
// none (the removal keeps its expiration and the purge would take it).
func TestModerationExpiryMigrationClearsModerationEventsOnly(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	version := migrationVersion(t, "moderation_events_never_expire")

	conn := connect(t, dbtest.EmptyURL(t))
	require.NoError(t, migrate.To(ctx, conn, version-1))
	const community, channel = "00000000-0000-4000-8000-000000000069", "00000000-0000-4000-8000-000000000169"
	_, err := conn.Exec(ctx, `INSERT INTO communities (id, host) VALUES ($1, 'moderation-expiry.example')`, community)
	require.NoError(t, err)
	_, err = conn.Exec(ctx, `INSERT INTO channels (community_id, id, name, visibility, created_by) VALUES ($1, $2, 'room', 'private', decode($3, 'hex'))`,
		community, channel, strings.Repeat("aa", 32))
	require.NoError(t, err)
	insert := func(id string, kind int, channel *string) {
		t.Helper()
		_, err := conn.Exec(ctx, `INSERT INTO events (community_id, id, pubkey, created_at, kind, tags, content, sig, channel_id, expires_at)
			VALUES ($1, decode($2, 'hex'), decode($3, 'hex'), now(), $4, '[]', '', decode($5, 'hex'), $6::uuid, now() + interval '1 hour')`,
			community, id, strings.Repeat("aa", 32), kind, strings.Repeat("00", 64), channel)
		require.NoError(t, err)
	}
	ch := channel
	removal, message, unbound := strings.Repeat("01", 32), strings.Repeat("02", 32), strings.Repeat("03", 32)
	insert(removal, 9001, &ch)
	insert(message, 9, &ch)
	insert(unbound, 9001, nil)

	require.NoError(t, migrate.To(ctx, conn, version))
	expiring := func(id string) bool {
		var has bool
		require.NoError(t, conn.QueryRow(ctx, `SELECT expires_at IS NOT NULL FROM events WHERE id = decode($1, 'hex')`, id).Scan(&has))
		return has
	}
	require.False(t, expiring(removal), "the removal keeps its expiration")
	require.True(t, expiring(message), "the member's message lost its expiration")
	require.True(t, expiring(unbound), "an event outside any channel lost its expiration")
}
