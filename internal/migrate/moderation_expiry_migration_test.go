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

// A channel's removal sent with an expiration through a relay of the
// previous version, whose insert is in flight while 069 runs, does not
// keep its expiration: the constraint is added first, so the migration
// waits for the insert, and its UPDATE, coming after, sees the row and
// clears it; a later insert is refused by the constraint. VALIDATE then
// finds no row left to report.
// Mutation killed: the UPDATE before ADD CONSTRAINT (as 069 was first
// written): the UPDATE's snapshot misses the insert in flight, the
// constraint waits for it to commit and, NOT VALID, lets it stay with its
// expiration, for the purge to delete.
func TestModerationExpiryMigrationClearsAnInsertInFlight(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	version := migrationVersion(t, "moderation_events_never_expire")
	url := dbtest.EmptyURL(t)
	conn := connect(t, url)
	require.NoError(t, migrate.To(ctx, conn, version-1))
	const community, channel = "00000000-0000-4000-8000-000000000070", "00000000-0000-4000-8000-000000000170"
	_, err := conn.Exec(ctx, `INSERT INTO communities (id, host) VALUES ($1, 'moderation-expiry-race.example')`, community)
	require.NoError(t, err)
	_, err = conn.Exec(ctx, `INSERT INTO channels (community_id, id, name, visibility, created_by) VALUES ($1, $2, 'room', 'private', decode($3, 'hex'))`,
		community, channel, strings.Repeat("aa", 32))
	require.NoError(t, err)

	writer := connect(t, url)
	tx, err := writer.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(context.Background()) }()
	removal := strings.Repeat("01", 32)
	_, err = tx.Exec(ctx, `INSERT INTO events (community_id, id, pubkey, created_at, kind, tags, content, sig, channel_id, expires_at)
		VALUES ($1, decode($2, 'hex'), decode($3, 'hex'), now(), 9001, '[]', '', decode($4, 'hex'), $5, now() + interval '1 hour')`,
		community, removal, strings.Repeat("aa", 32), strings.Repeat("00", 64), channel)
	require.NoError(t, err)

	migrator := connect(t, url)
	migrated := make(chan error, 1)
	go func() { migrated <- migrate.To(ctx, migrator, version) }()
	waitForLockWait(t, url, migrated)
	require.NoError(t, tx.Commit(ctx))
	require.NoError(t, <-migrated)

	var expiring bool
	require.NoError(t, conn.QueryRow(ctx, `SELECT expires_at IS NOT NULL FROM events WHERE id = decode($1, 'hex')`, removal).Scan(&expiring))
	require.False(t, expiring, "the removal in flight keeps its expiration")
	_, err = conn.Exec(ctx, `ALTER TABLE events VALIDATE CONSTRAINT events_moderation_never_expires`)
	require.NoError(t, err)
}
