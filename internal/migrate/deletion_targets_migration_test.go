package migrate_test

import (
	"context"
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
	waitForLockWait(t, url)

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

// waitForLockWait returns once a session of url's database waits for a lock.
func waitForLockWait(t *testing.T, url string) {
	t.Helper()
	conn := connect(t, url)
	require.Eventually(t, func() bool {
		var waiting int
		require.NoError(t, conn.QueryRow(context.Background(), `
			SELECT count(*) FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
			WHERE NOT l.granted AND a.datname = current_database()`).Scan(&waiting))
		return waiting > 0
	}, 30*time.Second, 5*time.Millisecond)
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
// without waiting, and the event committed after it stays served).
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
	waitForLockWait(t, url)
	require.NoError(t, tx.Commit(ctx))
	require.NoError(t, <-migrated)

	var hidden bool
	require.NoError(t, conn.QueryRow(ctx, `SELECT deleted_at IS NOT NULL FROM events
		WHERE community_id = $1 AND id = decode($2, 'hex')`, community, note).Scan(&hidden))
	require.True(t, hidden, "the note its author deleted is not served")
}
