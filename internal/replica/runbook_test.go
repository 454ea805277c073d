package replica_test

import (
	"context"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/buzzrelay/buzz/internal/dbtest"
	"github.com/buzzrelay/buzz/internal/pgcluster"
	"github.com/buzzrelay/buzz/internal/replica"
)

func runRunbook(t *testing.T, dbURL string) string {
	t.Helper()
	psql, err := exec.LookPath("psql")
	if err != nil {
		dir, derr := pgcluster.FindBinaries()
		require.NoError(t, derr)
		psql = filepath.Join(dir, "psql")
	}
	u, err := url.Parse(dbURL)
	require.NoError(t, err)
	q := u.Query()
	q.Del("timezone")
	u.RawQuery = q.Encode()
	cmd := exec.Command(psql, "-X", "-v", "ON_ERROR_STOP=1", "-f", "../../sql/runbooks/replica.sql", u.String())
	cmd.Env = append(os.Environ(), "PGTZ="+dbtest.TimeZone)
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "%s", out)
	return string(out)
}

// The runbook runs as written on the writer and on a standby and shows the
// same epoch on both, the token, the streaming standby and its replay age.
func TestReplicaRunbook(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	writer := dbtest.URL(t)
	pool := writerPool(t, writer)
	e, err := replica.NewProbe(pool, replica.NewRing(), replica.DefaultFloor, time.Second, time.Now, quiet).Tick(ctx)
	require.NoError(t, err)
	// Created without being preloaded, pg_stat_statements raises an error
	// when read: the runbook must skip it, not stop.
	// Mutation killed: testing only pg_extension aborts the runbook.
	_, err = pool.Exec(ctx, "CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
	require.NoError(t, err)
	reader := dbtest.ReaderURL(t, writer)
	// A transaction left open on the writer is listed by who holds it.
	openTransaction(t, writer, "forgotten-psql")

	out := runRunbook(t, writer)
	require.Contains(t, out, "pg_stat_statements is not installed and preloaded here")
	require.Contains(t, out, e.Epoch.String())
	require.Regexp(t, regexp.MustCompile(fmt.Sprintf(`\|\s*%d\s*\n`, e.Token)), out, "the token")
	require.Contains(t, out, "Readers streaming from this writer")
	// Run on a reader URL that names a promoted standby, the runbook says
	// what that means rather than passing for the writer.
	// Mutation killed: dropping the "Not in recovery" lines.
	require.Contains(t, out, "Not in recovery: a writer. Run on BUZZ_READ_DATABASE_URL")
	require.Regexp(t, regexp.MustCompile(`\|\s*streaming\s*\|`), out, "the shared standby streams from the test cluster")
	require.Regexp(t, regexp.MustCompile(`forgotten-psql.*idle in transaction`), out, "the open transaction, by who holds it")

	out = runRunbook(t, reader)
	require.Contains(t, out, e.Epoch.String(), "the reader follows the writer's epoch")
	require.Contains(t, out, "This reader: replay position and age")
	require.NotContains(t, out, "Not in recovery")
	require.Regexp(t, regexp.MustCompile(`\|\s*f\s*\n`), out, "replay is not paused")
}
