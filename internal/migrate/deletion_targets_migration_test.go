package migrate_test

import (
	"context"
	"encoding/hex"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
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

// One author's deletions naming the same ids in different orders, on two
// connections at once, both commit: each takes the author's lock before it
// records its targets, so the second waits for the first whole, instead of
// each holding one recorded id the other waits for.
// Mutation killed: the lock taken after the targets are recorded (the
// second connection's deletion, or the first's, fails with 40P01,
// deadlock detected).
func TestDeletionsOfOneAuthorNamingTheSameIDsDoNotDeadlock(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := dbtest.URL(t)
	first, second := connect(t, url), connect(t, url)
	community := uuid.New()
	_, err := first.Exec(ctx, `INSERT INTO communities (id, host) VALUES ($1, 'deadlock-free.example')`, community)
	require.NoError(t, err)
	author := strings.Repeat("aa", 32)
	x, y := strings.Repeat("0b", 32), strings.Repeat("0c", 32)
	deletion := func(conn pgx.Tx, id string, targets ...string) error {
		tags := `[`
		for i, target := range targets {
			if i > 0 {
				tags += `,`
			}
			tags += `["e","` + target + `"]`
		}
		_, err := conn.Exec(ctx, `INSERT INTO events (community_id, id, pubkey, created_at, kind, tags, content, sig)
			VALUES ($1, decode($2, 'hex'), decode($3, 'hex'), now(), 5, $4::jsonb, '', decode($5, 'hex'))`,
			community, id, author, tags+`]`, strings.Repeat("00", 64))
		return err
	}
	tx1, err := first.Begin(ctx)
	require.NoError(t, err)
	defer tx1.Rollback(ctx)
	require.NoError(t, deletion(tx1, strings.Repeat("01", 32), x))

	tx2, err := second.Begin(ctx)
	require.NoError(t, err)
	defer tx2.Rollback(ctx)
	secondDone := make(chan error, 1)
	go func() { secondDone <- deletion(tx2, strings.Repeat("02", 32), y, x) }()
	// The second deletion waits (for the lock, or without it for x's row).
	waitForLockWait(t, url, secondDone)

	firstErr := deletion(tx1, strings.Repeat("03", 32), y)
	if firstErr == nil {
		firstErr = tx1.Commit(ctx)
	}
	secondErr := <-secondDone
	if secondErr == nil {
		secondErr = tx2.Commit(ctx)
	}
	require.NoError(t, firstErr, "the first connection's deletions")
	require.NoError(t, secondErr, "the second connection's deletion")
}

// waitForLockWait returns once a session of url's database waits for a
// lock; it fails the test if the statement expected to wait ends first
// (ended receives its result).
func waitForLockWait(t *testing.T, url string, ended <-chan error) {
	t.Helper()
	conn := connect(t, url)
	deadline := time.After(30 * time.Second)
	for {
		var waiting int
		require.NoError(t, conn.QueryRow(context.Background(), `
			SELECT count(*) FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
			WHERE NOT l.granted AND a.datname = current_database()`).Scan(&waiting))
		if waiting > 0 {
			return
		}
		select {
		case err := <-ended:
			t.Fatalf("ended without waiting for a lock (error: %v)", err)
		case <-deadline:
			t.Fatal("no session waited for a lock")
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// The backfill on a database with more communities holding deletions than
// the shared lock table has slots for one transaction's share: each
// (community, author) is its own transaction, so the fence's lock per
// community is let go before the next.
// Mutation killed: 062 as one INSERT ... SELECT over every community (out
// of shared memory, max_locks_per_transaction).
func TestDeletionTargetsBackfillOverManyCommunities(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	version := migrationVersion(t, "deletion_targets_backfill")
	conn := connect(t, dbtest.EmptyURL(t))
	require.NoError(t, migrate.To(ctx, conn, version-2))

	var slots int
	require.NoError(t, conn.QueryRow(ctx, `SELECT current_setting('max_locks_per_transaction')::int
		* (current_setting('max_connections')::int + current_setting('max_prepared_transactions')::int)`).Scan(&slots))
	communities := 2 * slots
	// A thousand at a time: each insert takes the fence of its communities.
	for first := 0; first < communities; first += 1000 {
		_, err := conn.Exec(ctx, `
			WITH c AS (INSERT INTO communities (host)
			           SELECT 'many-' || g || '.example' FROM generate_series($1::int, $1::int + 999) g RETURNING id)
			INSERT INTO events (community_id, id, pubkey, created_at, kind, tags, content, sig)
			SELECT c.id, decode(md5(c.id::text) || md5('x' || c.id::text), 'hex'), decode(repeat('aa', 32), 'hex'), now(), 5,
			       jsonb_build_array(jsonb_build_array('e', repeat('02', 32))), '', decode(repeat('00', 64), 'hex')
			FROM c`, first)
		require.NoError(t, err)
	}
	communities = (communities + 999) / 1000 * 1000
	require.NoError(t, migrate.To(ctx, conn, version-1))

	require.NoError(t, migrate.To(ctx, conn, version))
	var targets int
	require.NoError(t, conn.QueryRow(ctx, `SELECT count(*) FROM event_deletion_targets`).Scan(&targets))
	require.Equal(t, communities, targets, "one target per community's deletion")
}

// An event of a deletion's author with an id the deletion names, inserted
// while the backfill runs, is not left stored: the backfill takes the
// author's deletion lock, as a deletion's insert does, so it waits for the
// insert in flight and then hides it (or the insert, coming after, is
// refused by the targets the backfill committed).
// Mutation killed: 062 without the author's lock (it records and hides
// without waiting for the insert: "ended without waiting for a lock").
func TestDeletionTargetsBackfillWaitsForAnInsertInFlight(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	version := migrationVersion(t, "deletion_targets_backfill")
	url := dbtest.EmptyURL(t)
	conn := connect(t, url)
	require.NoError(t, migrate.To(ctx, conn, version-2))

	community := uuid.New()
	_, err := conn.Exec(ctx, `INSERT INTO communities (id, host) VALUES ($1, 'backfill-race.example')`, community)
	require.NoError(t, err)
	author, note := strings.Repeat("aa", 32), strings.Repeat("02", 32)
	insert := func(conn interface {
		Exec(context.Context, string, ...any) (pgconn.CommandTag, error)
	}, id string, kind int, tags string) {
		t.Helper()
		_, err := conn.Exec(ctx, `INSERT INTO events (community_id, id, pubkey, created_at, kind, tags, content, sig)
			VALUES ($1, decode($2, 'hex'), decode($3, 'hex'), now(), $4, $5::jsonb, '', decode($6, 'hex'))`,
			community, id, author, kind, tags, strings.Repeat("00", 64))
		require.NoError(t, err)
	}
	insert(conn, strings.Repeat("01", 32), 5, `[["e","`+note+`"]]`)
	require.NoError(t, migrate.To(ctx, conn, version-1))

	// The note arrives while the backfill runs: its probe found no target.
	writer := connect(t, url)
	tx, err := writer.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(context.Background()) }()
	insert(tx, note, 1, `[]`)

	migrator := connect(t, url)
	migrated := make(chan error, 1)
	go func() { migrated <- migrate.To(ctx, migrator, version) }()
	waitForLockWait(t, url, migrated)
	require.NoError(t, tx.Commit(ctx))
	require.NoError(t, <-migrated)

	var hidden bool
	require.NoError(t, conn.QueryRow(ctx, `SELECT deleted_at IS NOT NULL FROM events
		WHERE community_id = $1 AND id = decode($2, 'hex')`, community, note).Scan(&hidden))
	require.True(t, hidden, "the note its author deleted is not served")
}

// 062 treats the deletions stored before 061 as the relay treats one
// arriving now:
//   - a target in a private channel, named by a deletion bound to that
//     channel, is recorded and hidden like a global one; the author's
//     channel moderation event it names stays visible (as EventsDeleteByIDs
//     leaves it) and its id is recorded all the same;
//   - a reaction is hidden and its reactions row removed, and a profile is
//     hidden in its replaceable slot: the hidden version still holds the
//     slot (an older version is refused, a newer one replaces it) and
//     users forgets it, as when a live deletion hides it;
//   - a deletion named by its author's later deletion, or hidden by a
//     moderator, still counts, as since 061 (a kind 5 is never hidden by a
//     kind 5, nor refused as a deleted id, and a hidden one keeps its
//     recorded targets); the named deletion stays visible;
//   - another author's deletion naming the id hides nothing.
//
// Mutations killed, each in 062: the deletions read only when global
// (channel_id IS NULL) or only when visible (deleted_at IS NULL); the
// UPDATE without its channel moderation clause, without kind <> 5, without
// e.pubkey = deleter, or hiding only global events; the UPDATE made a
// DELETE; the backfill run with session_replication_role = replica (the
// hiding triggers skipped).
func TestDeletionTargetsBackfillCases(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	version := migrationVersion(t, "deletion_targets_backfill")
	conn := connect(t, dbtest.EmptyURL(t))
	require.NoError(t, migrate.To(ctx, conn, version-2))

	community, channel := uuid.New(), uuid.New()
	_, err := conn.Exec(ctx, `INSERT INTO communities (id, host) VALUES ($1, 'backfill-cases.example')`, community)
	require.NoError(t, err)
	author, other := strings.Repeat("aa", 32), strings.Repeat("bb", 32)
	_, err = conn.Exec(ctx, `INSERT INTO channels (community_id, id, name, visibility, created_by)
		VALUES ($1, $2, 'private', 'private', decode($3, 'hex'))`, community, channel, author)
	require.NoError(t, err)
	base := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	// insert stores an event created seconds after base, in channel when
	// it is not nil; it returns the rows stored.
	insert := func(t *testing.T, id, pubkey string, kind, seconds int, channel *uuid.UUID, tags string) int64 {
		t.Helper()
		tag, err := conn.Exec(ctx, `INSERT INTO events (community_id, id, pubkey, created_at, kind, tags, content, sig, channel_id)
			VALUES ($1, decode($2, 'hex'), decode($3, 'hex'), $4, $5, $6::jsonb, '', decode($7, 'hex'), $8)`,
			community, id, pubkey, base.Add(time.Duration(seconds)*time.Second), kind, tags, strings.Repeat("00", 64), channel)
		require.NoError(t, err)
		return tag.RowsAffected()
	}
	naming := func(ids ...string) string {
		tags := make([]string, len(ids))
		for i, id := range ids {
			tags[i] = `["e","` + id + `"]`
		}
		return `[` + strings.Join(tags, ",") + `]`
	}
	id := func(b byte) string { return strings.Repeat(hex.EncodeToString([]byte{b}), 32) }
	var (
		channelNote, channelModeration, channelLater = id(0x10), id(0x11), id(0x12)
		reaction, reacted                            = id(0x20), id(0x21)
		profile, olderProfile, newerProfile          = id(0x30), id(0x31), id(0x32)
		namedDeletion, hiddenDeletion                = id(0x40), id(0x41)
		firstNote, secondNote                        = id(0x42), id(0x43)
		othersTarget                                 = id(0x50)
	)

	// Each deletion first, then its targets coming back (stored before 061).
	insert(t, id(0x01), author, 5, 0, &channel, naming(channelNote, channelModeration, channelLater))
	insert(t, channelNote, author, 9, 1, &channel, `[["h","`+channel.String()+`"]]`)
	insert(t, channelModeration, author, 9000, 1, &channel, `[["h","`+channel.String()+`"],["p","`+other+`"]]`)

	insert(t, reacted, other, 1, 0, nil, `[]`)
	insert(t, id(0x02), author, 5, 0, nil, naming(reaction))
	insert(t, reaction, author, 7, 1, nil, `[["e","`+reacted+`"]]`)
	_, err = conn.Exec(ctx, `INSERT INTO reactions (community_id, event_created_at, event_id, pubkey, emoji, reaction_event_id)
		VALUES ($1, $2, decode($3, 'hex'), decode($4, 'hex'), '+', decode($5, 'hex'))`,
		community, base, reacted, author, reaction)
	require.NoError(t, err)

	insert(t, id(0x03), author, 5, 10, nil, naming(profile))
	insert(t, profile, author, 0, 10, nil, `[]`)
	_, err = conn.Exec(ctx, `INSERT INTO users (community_id, pubkey, display_name, metadata_event_id, metadata_created_at)
		VALUES ($1, decode($2, 'hex'), 'came back', decode($3, 'hex'), $4)`, community, author, profile, base.Add(10*time.Second))
	require.NoError(t, err)

	insert(t, namedDeletion, author, 5, 0, nil, naming(firstNote))
	insert(t, hiddenDeletion, author, 5, 0, nil, naming(secondNote))
	insert(t, id(0x04), author, 5, 1, nil, naming(namedDeletion, hiddenDeletion))
	_, err = conn.Exec(ctx, `UPDATE events SET deleted_at = now() WHERE community_id = $1 AND id = decode($2, 'hex')`, community, hiddenDeletion)
	require.NoError(t, err, "a moderator hides the deletion")
	insert(t, firstNote, author, 1, 2, nil, `[]`)
	insert(t, secondNote, author, 1, 2, nil, `[]`)

	insert(t, othersTarget, author, 1, 0, nil, `[]`)
	insert(t, id(0x05), other, 5, 1, nil, naming(othersTarget))

	require.NoError(t, migrate.To(ctx, conn, version))

	hidden := func(t *testing.T, id string) bool {
		t.Helper()
		var deleted bool
		require.NoError(t, conn.QueryRow(ctx, `SELECT deleted_at IS NOT NULL FROM events
			WHERE community_id = $1 AND id = decode($2, 'hex')`, community, id).Scan(&deleted))
		return deleted
	}
	recorded := func(t *testing.T, id, pubkey string) bool {
		t.Helper()
		var found bool
		require.NoError(t, conn.QueryRow(ctx, `SELECT EXISTS (SELECT FROM event_deletion_targets
			WHERE community_id = $1 AND target_id = decode($2, 'hex') AND author = decode($3, 'hex'))`, community, id, pubkey).Scan(&found))
		return found
	}

	t.Run("private channel", func(t *testing.T) {
		require.True(t, hidden(t, channelNote), "the channel's note that came back is hidden")
		require.False(t, hidden(t, channelModeration), "the author's moderation event stays, as a live deletion leaves it")
		require.True(t, recorded(t, channelModeration, author), "its id is recorded all the same")
		require.Zero(t, insert(t, channelLater, author, 9, 3, &channel, `[["h","`+channel.String()+`"]]`),
			"an id the channel's deletion named, arriving now, is refused")
	})
	t.Run("reaction", func(t *testing.T) {
		require.True(t, hidden(t, reaction))
		var removed bool
		require.NoError(t, conn.QueryRow(ctx, `SELECT removed_at IS NOT NULL FROM reactions
			WHERE community_id = $1 AND reaction_event_id = decode($2, 'hex')`, community, reaction).Scan(&removed))
		require.True(t, removed, "the hidden reaction stops counting")
	})
	t.Run("profile", func(t *testing.T) {
		require.Zero(t, insert(t, olderProfile, author, 0, 5, nil, `[]`), "the hidden version still holds the slot against an older one")
		require.True(t, hidden(t, profile))
		var name *string
		require.NoError(t, conn.QueryRow(ctx, `SELECT display_name FROM users WHERE community_id = $1 AND pubkey = decode($2, 'hex')`,
			community, author).Scan(&name))
		require.Nil(t, name, "users forgets the hidden profile")
		require.Zero(t, insert(t, profile, author, 0, 10, nil, `[]`), "the deleted profile sent again is refused")
		require.EqualValues(t, 1, insert(t, newerProfile, author, 0, 20, nil, `[]`), "a newer version replaces it")
		require.False(t, hidden(t, newerProfile))
	})
	t.Run("deleted deletion", func(t *testing.T) {
		require.True(t, hidden(t, firstNote), "a deletion its author's later deletion named still counts")
		require.True(t, hidden(t, secondNote), "a deletion a moderator hid still counts")
		require.False(t, hidden(t, namedDeletion), "a deletion is not hidden by a deletion")
		require.True(t, recorded(t, secondNote, author))
	})
	t.Run("another author's deletion", func(t *testing.T) {
		require.False(t, hidden(t, othersTarget), "another author's deletion hides nothing")
		require.True(t, recorded(t, othersTarget, other), "recorded under its own author only")
		require.False(t, recorded(t, othersTarget, author))
	})
}
