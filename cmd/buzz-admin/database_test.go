package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/buzzrelay/buzz/internal/dbtest"
	"github.com/buzzrelay/buzz/internal/deletion"
	"github.com/buzzrelay/buzz/internal/migrate"
)

// adminOn runs buzz-admin's commands against the database at databaseURL.
func adminOn(ctx context.Context, databaseURL string) func(args ...string) (string, error) {
	env := map[string]string{"BUZZ_DATABASE_URL": databaseURL}
	return func(args ...string) (string, error) {
		var out bytes.Buffer
		err := run(ctx, args, func(k string) string { return env[k] }, &out)
		return out.String(), err
	}
}

// A database migrated only to 027 lacks 028's rule that the requester of
// a community deletion cannot approve it. buzz-admin refuses such a
// schema before any statement of the command, saying what the schema is
// at and what to run, for every command, reads included: a requester's
// own approval, run through the pre-028 function, would stand.
//
// Mutation killed: the schema check left out of checkDatabase (the
// requester approves their own request: the approval succeeds and the
// request moves on to approved).
func TestASchemaBehindTheBuildIsRefusedBeforeAnyStatement(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dbURL := dbtest.EmptyURL(t)
	conn, err := pgx.Connect(ctx, dbURL)
	require.NoError(t, err)
	defer conn.Close(ctx)
	require.NoError(t, migrate.To(ctx, conn, 27))
	// A request waiting for its approval, opened as `deletions submit`
	// opens it (its inventory frozen), by ops.
	inv := deletion.Inventory{Storage: deletion.StorageManifest{Version: deletion.StorageManifestVersion}}
	manifest, err := json.Marshal(inv)
	require.NoError(t, err)
	digest, err := inv.Digest()
	require.NoError(t, err)
	var id string
	require.NoError(t, conn.QueryRow(ctx, `
		WITH c AS (INSERT INTO communities (host) VALUES ('behind.example') RETURNING host),
		     r AS (SELECT (community_deletion_requests_submit(c.host, 'ops', NULL)).id AS id FROM c)
		SELECT (community_deletion_requests_freeze_inventory(r.id, $1, $2)).id::text FROM r`, manifest, digest).Scan(&id))

	admin := adminOn(ctx, dbURL)
	for _, args := range [][]string{
		{"deletions", "approve", id, "--approved-by", "ops"},
		{"deletions", "inspect", id},
		{"communities", "list"},
		{"listeners", "list"},
	} {
		_, err := admin(args...)
		require.ErrorContains(t, err, "database schema is at version 27 but this build needs", args)
		require.ErrorContains(t, err, "run `buzz-relay migrate` first", args)
	}
	var stage string
	require.NoError(t, conn.QueryRow(ctx, `SELECT stage FROM community_deletion_requests WHERE id = $1`, id).Scan(&stage))
	require.Equal(t, "inventoried", stage, "the requester's own approval did not go through")

	// Migrated, the same approval meets 028's rule.
	require.NoError(t, migrate.Up(ctx, conn))
	_, err = admin("deletions", "approve", id, "--approved-by", "ops")
	require.ErrorContains(t, err, "a second person approves")
}

// A URL naming a database that holds no buzz schema at all (a typo, the
// postgres database) is said as such, and the error does not tell the
// operator to migrate it; nothing is created there.
//
// Mutation killed: the version 0 case left to RequireCurrent (its text
// says "run `buzz-relay migrate` first").
func TestADatabaseWithoutTheSchemaIsNamedNotMigrated(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dbURL := dbtest.EmptyURL(t)
	admin := adminOn(ctx, dbURL)
	for _, args := range [][]string{{"communities", "create", "wrong.example"}, {"deletions", "list"}, {"listeners", "list"}} {
		_, err := admin(args...)
		require.ErrorContains(t, err, "no buzz schema", args)
		require.ErrorContains(t, err, "check the database name", args)
		require.NotContains(t, err.Error(), "first", args)
	}
	conn, err := pgx.Connect(ctx, dbURL)
	require.NoError(t, err)
	defer conn.Close(ctx)
	var tables int
	require.NoError(t, conn.QueryRow(ctx, `SELECT count(*) FROM pg_tables WHERE schemaname = 'public'`).Scan(&tables))
	require.Zero(t, tables)
}

// On a streaming standby, or through a URL whose sessions are read-only,
// every command that writes is refused before it starts with an error
// naming the cause and the fix, while the reads still answer there (an
// operator may point the read commands at a reader on purpose).
//
// Mutations killed: the writes check left out (the server's "cannot
// execute INSERT in a read-only transaction" instead); the reads checked
// as writes (list refused on the standby).
func TestWritesAreRefusedOnAStandbyOrReadOnlySessionReadsAnswer(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	writer := dbtest.URL(t)
	_, err := adminOn(ctx, writer)("communities", "create", "seen-on-standby.example")
	require.NoError(t, err)
	u, err := url.Parse(writer)
	require.NoError(t, err)
	query := u.Query()
	query.Set("options", "-c default_transaction_read_only=on")
	u.RawQuery = strings.ReplaceAll(query.Encode(), "+", "%20") // libpq reads no + as a space
	readOnly := u.String()
	for _, c := range []struct{ name, url, says string }{
		{"standby", dbtest.ReaderURL(t, writer), "names a standby (in recovery), and this command writes: point it at the primary"},
		{"read-only session", readOnly, "opens read-only sessions"},
	} {
		t.Run(c.name, func(t *testing.T) {
			admin := adminOn(ctx, c.url)
			for _, args := range [][]string{
				{"communities", "create", "on-" + strings.ReplaceAll(c.name, " ", "-") + ".example"},
				{"communities", "archive", "seen-on-standby.example"},
				{"listeners", "add", strings.Repeat("a", 64), strings.Repeat("b", 64)},
				{"deletions", "submit", "--host", "seen-on-standby.example", "--requested-by", "ops", "--without-media"},
				{"deletions", "drain"},
			} {
				_, err := admin(args...)
				require.ErrorContains(t, err, c.says, args)
			}
			out, err := admin("communities", "list")
			require.NoError(t, err)
			var list []communityJSON
			require.NoError(t, json.Unmarshal([]byte(out), &list))
			require.Len(t, list, 1)
			require.Equal(t, "seen-on-standby.example", list[0].Host)
			require.Nil(t, list[0].ArchivedAt)
			_, err = admin("deletions", "list")
			require.NoError(t, err)
		})
	}
}

// A schema a later release migrated is refused, and the error tells the
// operator to use that release's buzz-admin: the relays that migrated it
// are already running, so "deploy the newer relay" would send them to
// redeploy what is deployed.
//
// Mutation killed: the ahead case left to RequireCurrent (its text says
// "deploy the newer relay").
func TestASchemaAheadOfTheBuildNamesTheNewerBuzzAdmin(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dbURL := dbtest.URL(t)
	conn, err := pgx.Connect(ctx, dbURL)
	require.NoError(t, err)
	defer conn.Close(ctx)
	var ahead int32
	require.NoError(t, conn.QueryRow(ctx, `UPDATE schema_version SET version = version + 1 RETURNING version`).Scan(&ahead))
	admin := adminOn(ctx, dbURL)
	for _, args := range [][]string{{"communities", "create", "ahead.example"}, {"communities", "list"}, {"deletions", "list"}, {"listeners", "list"}} {
		_, err := admin(args...)
		require.ErrorContains(t, err, fmt.Sprintf("database schema is at version %d, newer than this buzz-admin knows (%d): use the buzz-admin of the release that migrated it", ahead, ahead-1), args)
		require.NotContains(t, err.Error(), "deploy the newer relay", args)
	}
	var communities int
	require.NoError(t, conn.QueryRow(ctx, `SELECT count(*) FROM communities`).Scan(&communities))
	require.Zero(t, communities)
}

// statementCounter counts the statements of a connection that contain a
// text.
type statementCounter struct {
	text string
	n    atomic.Int32
}

func (c *statementCounter) TraceQueryStart(ctx context.Context, _ *pgx.Conn, data pgx.TraceQueryStartData) context.Context {
	if strings.Contains(data.SQL, c.text) {
		c.n.Add(1)
	}
	return ctx
}

func (c *statementCounter) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// The checks before a command read the schema version once, however many
// things they conclude from it.
// Mutation killed: the version read again to ask RequireCurrent (two
// reads).
func TestTheSchemaVersionIsReadOnce(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	cfg, err := pgx.ParseConfig(dbtest.URL(t))
	require.NoError(t, err)
	reads := &statementCounter{text: "SELECT version FROM " + migrate.VersionTable}
	cfg.Tracer = reads
	conn, err := pgx.ConnectConfig(ctx, cfg)
	require.NoError(t, err)
	defer conn.Close(ctx)
	require.NoError(t, checkDatabase(ctx, conn, true))
	require.Equal(t, int32(1), reads.n.Load())
}
