package migrate_test

import (
	"context"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/buzzrelay/buzz/internal/dbtest"
	"github.com/buzzrelay/buzz/internal/pgcluster"
)

func psqlPath(t *testing.T) string {
	t.Helper()
	if p, err := exec.LookPath("psql"); err == nil {
		return p
	}
	dir, err := pgcluster.FindBinaries()
	require.NoError(t, err)
	p := filepath.Join(dir, "psql")
	_, err = os.Stat(p)
	require.NoError(t, err, "psql is installed with the PostgreSQL server binaries")
	return p
}

// psqlURL is a test database's URL as psql takes it (libpq knows no
// timezone parameter).
func psqlURL(t *testing.T, rawURL string) string {
	t.Helper()
	u, err := url.Parse(rawURL)
	require.NoError(t, err)
	q := u.Query()
	q.Del("timezone")
	u.RawQuery = q.Encode()
	return u.String()
}

// sqlBlockOf is the ```sql block of a markdown file whose first line is
// firstLine: the text an operator copies, so a test of it runs the doc
// itself and the two cannot drift apart.
func sqlBlockOf(t *testing.T, markdownPath, firstLine string) string {
	t.Helper()
	doc, err := os.ReadFile(markdownPath)
	require.NoError(t, err)
	for _, block := range strings.Split(string(doc), "```sql\n")[1:] {
		body, _, closed := strings.Cut(block, "\n```")
		require.True(t, closed, "an unclosed sql block in %s", markdownPath)
		if strings.HasPrefix(body, firstLine+"\n") {
			return body + "\n"
		}
	}
	t.Fatalf("%s has no sql block starting %q", markdownPath, firstLine)
	return ""
}

// The README's recount of a channel's active members, run as written under
// psql while a member's join holds the channel: it waits for the join, and
// the count it writes includes that member. Without its lock-first step the
// UPDATE waits for the same row and then writes the count of its older
// snapshot, one short, over the join's own +1.
func TestActiveMembersRecountRunbook(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dbURL := dbtest.URL(t)
	conn := connect(t, dbURL)
	joiner := connect(t, dbURL)
	community, channel := uuid.New(), uuid.New()
	_, err := conn.Exec(ctx, `INSERT INTO communities (id, host) VALUES ($1, 'recount-runbook.example')`, community)
	require.NoError(t, err)
	_, err = conn.Exec(ctx, `INSERT INTO channels (community_id, id, name, created_by) VALUES ($1, $2, 'room', $3)`, community, channel, make([]byte, 32))
	require.NoError(t, err)
	_, err = conn.Exec(ctx, `INSERT INTO channel_members (community_id, channel_id, pubkey, removed_at)
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

	recount := sqlBlockOf(t, "../../README.md", "-- Recount one channel's active members.")
	cmd := exec.Command(psqlPath(t), "-X", "-v", "ON_ERROR_STOP=1", "-v", "community="+community.String(),
		"-v", "channel="+channel.String(), "-f", "-", psqlURL(t, dbURL))
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
