package migrate_test

import (
	"context"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/buzzrelay/buzz/internal/dbtest"
)

// The README's recount of a channel's active members, run as written under
// psql while a member's join holds the channel: it waits for the join, and
// the count it writes includes that member. Without its lock-first step the
// UPDATE waits for the same row and then writes the count of its older
// snapshot, one short, over the join's own +1.
func TestActiveMembersRecountRunbook(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dbURL, conn, joiner, community, channel := runbookChannel(t, "recount-runbook.example")
	_, err := conn.Exec(ctx, `INSERT INTO channel_members (community_id, channel_id, pubkey, removed_at)
		SELECT $1, $2, sha256(i::text::bytea), CASE WHEN i > 5 THEN now() END FROM generate_series(1, 7) i`, community, channel)
	require.NoError(t, err)
	// A count gone wrong, as a hard delete before migration 049 left it.
	_, err = conn.Exec(ctx, `UPDATE channels SET active_members = 40 WHERE community_id = $1 AND id = $2`, community, channel)
	require.NoError(t, err)

	// A join in flight: its trigger holds the channel's row until it commits.
	join, err := joiner.Begin(ctx)
	require.NoError(t, err)
	defer join.Rollback(ctx)
	_, err = join.Exec(ctx, `INSERT INTO channel_members (community_id, channel_id, pubkey) VALUES ($1, $2, sha256('joining'::bytea))`, community, channel)
	require.NoError(t, err)

	recount := dbtest.SQLBlock(t, "../../README.md", "-- Recount one channel's active members.")
	cmd := exec.Command(dbtest.PsqlPath(t), "-X", "-v", "ON_ERROR_STOP=1", "-v", "community="+community.String(),
		"-v", "channel="+channel.String(), "-f", "-", dbtest.PsqlURL(t, dbURL))
	cmd.Env = append(os.Environ(), "PGAPPNAME=recount-runbook")
	cmd.Stdin = strings.NewReader(recount)
	var out strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &out
	require.NoError(t, cmd.Start())
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()

	// Commit the join only once the recount waits for its lock.
	for waiting := false; !waiting; {
		require.NoError(t, conn.QueryRow(ctx, `SELECT EXISTS (SELECT FROM pg_stat_activity
			WHERE application_name = 'recount-runbook' AND wait_event_type = 'Lock')`).Scan(&waiting))
		select {
		case err := <-done:
			t.Fatalf("the recount finished while the join held the channel: %v\n%s", err, out.String())
		case <-time.After(10 * time.Millisecond):
		}
	}
	require.NoError(t, join.Commit(ctx))
	require.NoError(t, <-done, out.String())
	require.Contains(t, out.String(), "COMMIT")

	counter, rows := activeMembers(t, conn, community, channel)
	require.Equal(t, 6, rows, "five members and the one who joined")
	require.Equal(t, rows, counter, "the recount counts the join it waited for\n%s", out.String())
}

// The README's hand delete of a member, run as written under psql while
// that member's leave holds the channel's row (a relay's change takes the
// row first, then its write lock) and a message into the channel is in
// flight (holding the write lock shared): the delete waits for the
// channel's row, the leave goes through, and the delete then waits for the
// message, which commits before it, as before a removal by the relay; the
// delete then removes the member's row, counted once in all. Without the
// row-lock step the delete locks the member's row, its counting trigger
// waits for the channel, the leave waits for the member's row, and
// PostgreSQL breaks the deadlock by failing one of them; with the write
// lock before the row, the delete would hold it exclusive while waiting
// for the leave's row, and every message into the channel with it.
func TestHandDeleteOfAMemberRunbook(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dbURL, conn, joiner, community, channel := runbookChannel(t, "hand-delete-runbook.example")
	// Five active members; the fifth is about to leave and be deleted.
	_, err := conn.Exec(ctx, `INSERT INTO channel_members (community_id, channel_id, pubkey)
		SELECT $1, $2, sha256(i::text::bytea) FROM generate_series(1, 5) i`, community, channel)
	require.NoError(t, err)
	var member string
	require.NoError(t, conn.QueryRow(ctx, `SELECT encode(sha256('5'::bytea), 'hex')`).Scan(&member))

	// A message in flight: its check holds the channel's write lock shared.
	message, err := connect(t, dbURL).Begin(ctx)
	require.NoError(t, err)
	defer message.Rollback(ctx)
	_, err = message.Exec(ctx, `SELECT pg_advisory_xact_lock_shared(channels_write_lock_key($1, $2))`, community, channel)
	require.NoError(t, err)
	leave, err := joiner.Begin(ctx)
	require.NoError(t, err)
	defer leave.Rollback(ctx)
	_, err = leave.Exec(ctx, `SELECT 1 FROM channels WHERE community_id = $1 AND id = $2 FOR NO KEY UPDATE`, community, channel)
	require.NoError(t, err)

	cmd := handDelete(t, dbURL, community, channel, member)
	var out strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &out
	require.NoError(t, cmd.Start())
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	// waitsFor returns the lock the delete waits for, once it waits for
	// one other than passed.
	waitsFor := func(passed string) string {
		for {
			var event string
			err := conn.QueryRow(ctx, `SELECT wait_event FROM pg_stat_activity
				WHERE application_name = 'hand-delete-runbook' AND wait_event_type = 'Lock'
				  AND wait_event IS DISTINCT FROM $1`, passed).Scan(&event)
			if err == nil {
				return event
			}
			require.ErrorIs(t, err, pgx.ErrNoRows)
			select {
			case err := <-done:
				t.Fatalf("the delete finished while a message and the leave held the channel: %v\n%s", err, out.String())
			case <-time.After(10 * time.Millisecond):
			}
		}
	}
	forRow := waitsFor("")
	require.NotEqual(t, "advisory", forRow, "the delete asks the write lock before the channel's row")
	_, err = leave.Exec(ctx, `UPDATE channel_members SET removed_at = now()
		WHERE community_id = $1 AND channel_id = $2 AND pubkey = decode($3, 'hex')`, community, channel, member)
	// psql's output is read only once it ended (it writes it meanwhile).
	require.NoError(t, err, "the leave goes through while the delete waits for the channel's row")
	require.NoError(t, leave.Commit(ctx))
	require.Equal(t, "advisory", waitsFor(forRow), "then the delete waits for the message in flight")
	require.NoError(t, message.Commit(ctx))
	require.NoError(t, <-done, out.String())
	require.Contains(t, out.String(), member, "the delete names the member it removed")

	counter, rows := activeMembers(t, conn, community, channel)
	require.Equal(t, 4, rows)
	require.Equal(t, rows, counter, "the leave counted once, the delete of the member who left not again\n%s", out.String())
}

// handDelete is psql running the README's hand-delete of member, under the
// application name hand-delete-runbook.
func handDelete(t *testing.T, dbURL string, community, channel uuid.UUID, member string) *exec.Cmd {
	t.Helper()
	cmd := exec.Command(dbtest.PsqlPath(t), "-X", "-v", "ON_ERROR_STOP=1", "-v", "community="+community.String(),
		"-v", "channel="+channel.String(), "-v", "member="+member, "-f", "-", dbtest.PsqlURL(t, dbURL))
	cmd.Env = append(os.Environ(), "PGAPPNAME=hand-delete-runbook")
	cmd.Stdin = strings.NewReader(dbtest.SQLBlock(t, "../../README.md", "-- Delete a channel member by hand."))
	return cmd
}

// The hand-delete removes an active member first, as the relay does, so
// the channel's last active owner is refused and stays; once another
// member is owner, the delete goes through and counts once. Mutation
// killed: the runbook deleting without removing first (the last owner's
// row is deleted and the channel has no owner left, which no removal
// through the relay could do).
func TestHandDeleteRefusesTheChannelsLastOwner(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dbURL, conn, _, community, channel := runbookChannel(t, "hand-delete-owner.example")
	_, err := conn.Exec(ctx, `INSERT INTO channel_members (community_id, channel_id, pubkey, role)
		VALUES ($1, $2, sha256('owner'::bytea), 'owner'), ($1, $2, sha256('member'::bytea), 'member')`, community, channel)
	require.NoError(t, err)
	var owner string
	require.NoError(t, conn.QueryRow(ctx, `SELECT encode(sha256('owner'::bytea), 'hex')`).Scan(&owner))

	out, err := handDelete(t, dbURL, community, channel, owner).CombinedOutput()
	require.Error(t, err, "the last owner's delete is refused\n%s", out)
	require.Contains(t, string(out), "would have no owner")
	counter, rows := activeMembers(t, conn, community, channel)
	require.Equal(t, []int{2, 2}, []int{counter, rows}, "nothing was removed")

	_, err = conn.Exec(ctx, `UPDATE channel_members SET role = 'owner'
		WHERE community_id = $1 AND channel_id = $2 AND pubkey = sha256('member'::bytea)`, community, channel)
	require.NoError(t, err)
	out, err = handDelete(t, dbURL, community, channel, owner).CombinedOutput()
	require.NoError(t, err, "%s", out)
	require.Contains(t, string(out), owner, "the delete names the member it removed")
	counter, rows = activeMembers(t, conn, community, channel)
	require.Equal(t, []int{1, 1}, []int{counter, rows}, "the owner removed and deleted counts once")
}

// runbookChannel is a test database with one community at host and one
// channel in it, and two connections to it: the runbook's checker and a
// member's change in flight.
func runbookChannel(t *testing.T, host string) (dbURL string, conn, joiner *pgx.Conn, community, channel uuid.UUID) {
	t.Helper()
	ctx := context.Background()
	dbURL = dbtest.URL(t)
	conn, joiner = connect(t, dbURL), connect(t, dbURL)
	community, channel = uuid.New(), uuid.New()
	_, err := conn.Exec(ctx, `INSERT INTO communities (id, host) VALUES ($1, $2)`, community, host)
	require.NoError(t, err)
	_, err = conn.Exec(ctx, `INSERT INTO channels (community_id, id, name, created_by) VALUES ($1, $2, 'room', $3)`, community, channel, make([]byte, 32))
	require.NoError(t, err)
	return dbURL, conn, joiner, community, channel
}
