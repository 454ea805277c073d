package migrate_test

import (
	"bytes"
	"context"
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/buzzrelay/buzz/internal/dbtest"
	"github.com/buzzrelay/buzz/internal/migrate"
	"github.com/buzzrelay/buzz/internal/pgcluster"
)

// schemaOf is the database's schema as pg_dump renders it, so a function
// body, a trigger's WHEN, a constraint or an index definition a down part
// leaves changed shows, not only a missing table.
func schemaOf(t *testing.T, rawURL string) string {
	t.Helper()
	pgDump := "pg_dump"
	if dir, err := pgcluster.FindBinaries(); err == nil {
		pgDump = filepath.Join(dir, "pg_dump")
	}
	var out, stderr bytes.Buffer
	cmd := exec.Command(pgDump, "--schema-only", "--no-owner", "--no-privileges",
		"--restrict-key=buzzschema", "--exclude-table=schema_version", "--dbname", dbtest.PsqlURL(t, rawURL))
	cmd.Stdout, cmd.Stderr = &out, &stderr
	require.NoError(t, cmd.Run(), stderr.String())
	var kept strings.Builder
	for _, line := range strings.SplitAfter(out.String(), "\n") {
		if strings.HasPrefix(line, `\`) || strings.HasPrefix(line, "-- Dumped ") {
			continue
		}
		kept.WriteString(line)
	}
	return kept.String()
}

// Each migration's down part returns the schema to exactly what the
// migration before it left: a rollback that forgets to restore an older
// function body, trigger or index passes the round trip through zero (which
// only sees tables and functions go and come back) but leaves a DBA who
// rolled one migration back on a schema no release ever ran.
func TestEveryDownRestoresThePreviousSchema(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dbURL := dbtest.EmptyURL(t)
	conn := connect(t, dbURL)
	st, err := migrate.CurrentStatus(ctx, conn)
	require.NoError(t, err)

	before := schemaOf(t, dbURL)
	for v := int32(1); v <= st.Latest; v++ {
		require.NoError(t, migrate.To(ctx, conn, v), "up to %d", v)
		after := schemaOf(t, dbURL)
		require.NoError(t, migrate.To(ctx, conn, v-1), "down from %d", v)
		if rolledBack := schemaOf(t, dbURL); rolledBack != before {
			t.Errorf("the down part of migration %d does not restore the schema of %d:\n%s", v, v-1, lineDiff(before, rolledBack))
		}
		require.NoError(t, migrate.To(ctx, conn, v), "up to %d again", v)
		before = after
	}
}

// lineDiff lists the lines only one of two dumps has, each under a
// "-" (before) or "+" (after) mark.
func lineDiff(before, after string) string {
	count := map[string]int{}
	for _, l := range strings.Split(before, "\n") {
		count[l]++
	}
	for _, l := range strings.Split(after, "\n") {
		count[l]--
	}
	var b strings.Builder
	for _, l := range strings.Split(before, "\n") {
		if count[l] > 0 {
			fmt.Fprintf(&b, "- %s\n", l)
			count[l]--
		}
	}
	for _, l := range strings.Split(after, "\n") {
		if count[l] < 0 {
			fmt.Fprintf(&b, "+ %s\n", l)
			count[l]++
		}
	}
	return b.String()
}
