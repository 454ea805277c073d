package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"strings"
	"testing"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/buzzrelay/buzz/internal/dbtest"
)

func TestMain(m *testing.M) {
	code := dbtest.Run(m)
	if binaryDir != "" {
		_ = os.RemoveAll(binaryDir) // the binary the process tests built
	}
	os.Exit(code)
}

func TestCommunitiesCommands(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := dbtest.URL(t)
	env := func(k string) string {
		if k == "BUZZ_DATABASE_URL" {
			return url
		}
		return ""
	}
	runJSON := func(v any, args ...string) error {
		var out bytes.Buffer
		if err := run(ctx, args, env, &out); err != nil {
			return err
		}
		return json.Unmarshal(out.Bytes(), v)
	}

	var created communityJSON
	require.NoError(t, runJSON(&created, "communities", "create", " Team.Example:443 "))
	require.Equal(t, "team.example", created.Host, "hosts are stored normalized")
	require.Equal(t, "active", created.DeletionState)
	require.Nil(t, created.ArchivedAt)

	require.ErrorContains(t, runJSON(&created, "communities", "create", "team.example"), "already taken")

	var archived communityJSON
	require.NoError(t, runJSON(&archived, "communities", "archive", "TEAM.example"))
	require.Equal(t, created.ID, archived.ID)
	require.NotNil(t, archived.ArchivedAt)

	var list []communityJSON
	require.NoError(t, runJSON(&list, "communities", "list"))
	require.Len(t, list, 1)
	require.NotNil(t, list[0].ArchivedAt)

	var unarchived communityJSON
	require.NoError(t, runJSON(&unarchived, "communities", "unarchive", "team.example"))
	require.Nil(t, unarchived.ArchivedAt)

	require.ErrorContains(t, runJSON(&archived, "communities", "archive", "missing.example"), "no community has host")
	// A host no request can carry is refused before anything is stored
	// (it would stay reserved, unreachable, for good).
	// Mutation killed: the CheckHost call removed from create.
	for _, bad := range []string{"https://other.example/", "bad host!", "other.example:99999"} {
		var u usageError
		require.ErrorAs(t, run(ctx, []string{"communities", "create", bad}, env, &bytes.Buffer{}), &u, "%q", bad)
		require.Contains(t, u.reason, "want", "%q: the reason says what a host looks like", bad)
	}
	require.NoError(t, runJSON(&list, "communities", "list"))
	require.Len(t, list, 1, "no community was created for a bad host")
	require.ErrorAs(t, run(ctx, []string{"communities", "create"}, env, &bytes.Buffer{}), &usageError{})
	// A mistyped verb is a usage error (exit 2), not a database error (exit 1).
	require.ErrorAs(t, run(ctx, []string{"communities", "lsit"}, func(string) string { return "" }, &bytes.Buffer{}), &usageError{})
	require.ErrorContains(t, run(ctx, []string{"communities", "list"}, func(string) string { return "" }, &bytes.Buffer{}), "BUZZ_DATABASE_URL")
}

// A wrong flag or argument is a usage error (exit status 2) that names
// what is wrong, found before any connection is tried: the environment
// here names no database.
// Mutation killed: the checks moved back after the connection (the error
// becomes "BUZZ_DATABASE_URL is not set", exit 1).
func TestWrongFlagsAreUsageErrorsSaidBeforeConnecting(t *testing.T) {
	noDatabase := func(string) string { return "" }
	for args, reason := range map[string]string{
		"deletions list --limit 0":                                    "--limit must be from 1 to 1000",
		"deletions list --limit 1001":                                 "--limit must be from 1 to 1000",
		"deletions submit --host a.example":                           "--requested-by is required",
		"deletions approve not-a-uuid --approved-by x":                `"not-a-uuid" is not a request id`,
		"deletions approve " + uuid.NewString():                       "--approved-by is required",
		"deletions unblock " + uuid.NewString() + " --reason r":       "--unblocked-by is required",
		"deletions unblock " + uuid.NewString() + " --unblocked-by x": "--reason is required",
		"deletions list --limit x":                                    `invalid value "x" for flag -limit: parse error`,
		"deletions list --limt 5":                                     "flag provided but not defined: -limt",
	} {
		var u usageError
		require.ErrorAs(t, run(t.Context(), strings.Fields(args), noDatabase, &bytes.Buffer{}), &u, args)
		require.Equal(t, reason, u.reason, args)
	}
}

// Asking for help is not a mistake: the usage goes to stdout and the exit
// status is 0, whether asked of buzz-admin or of a deletions verb; a
// command line that cannot run still exits 2 with the usage on stderr.
//
// Mutations killed: help answered as a usage error (exit 2, usage on
// stderr); a verb's -h wrapped as a usage error like a wrong flag.
func TestHelpIsAnsweredOnStdoutWithStatusZero(t *testing.T) {
	noDatabase := func(string) string { return "" }
	for _, args := range []string{"--help", "-h", "help", "deletions list -h", "deletions submit --help"} {
		var stdout, stderr bytes.Buffer
		status := exitStatus(run(t.Context(), strings.Fields(args), noDatabase, &bytes.Buffer{}), &stdout, &stderr)
		require.Equal(t, 0, status, args)
		require.Contains(t, stdout.String(), "usage: buzz-admin", args)
		require.Contains(t, stdout.String(), "BUZZ_ADMIN_CONNECT_TIMEOUT", args)
		require.Contains(t, stdout.String(), "(default 10s;", args)
		require.Empty(t, stderr.String(), args)
	}
	var stdout, stderr bytes.Buffer
	require.Equal(t, 2, exitStatus(run(t.Context(), []string{"communities"}, noDatabase, &bytes.Buffer{}), &stdout, &stderr))
	require.Empty(t, stdout.String())
	require.Contains(t, stderr.String(), "usage: buzz-admin")
}

// buzz-admin's sessions, its one connection and the deletion commands'
// pool alike, are named buzz-admin in pg_stat_activity.
// Mutation killed: pgsession.Name dropped from connect, then from
// connectPool (that session's name is "").
func TestAdminSessionsAreNamed(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := dbtest.URL(t)
	getenv := func(k string) string {
		if k == "BUZZ_DATABASE_URL" {
			return url
		}
		return ""
	}
	conn, err := connect(ctx, getenv)
	require.NoError(t, err)
	defer conn.Close(ctx)
	require.Equal(t, "buzz-admin", dbtest.SessionName(t, conn), "connect")
	pool, err := connectPool(ctx, getenv)
	require.NoError(t, err)
	defer pool.Close()
	require.Equal(t, "buzz-admin", dbtest.SessionName(t, pool), "connectPool")
}
