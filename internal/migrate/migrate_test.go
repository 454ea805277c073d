package migrate_test

import (
	"context"
	"io/fs"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/buzzrelay/buzz/internal/dbtest"
	"github.com/buzzrelay/buzz/internal/migrate"
	"github.com/buzzrelay/buzz/migrations"
)

func TestMain(m *testing.M) { dbtest.Main(m) }

// migrationVersion is the number of the one migration named
// <number>_<name>.sql, so a test follows it if it is renumbered.
func migrationVersion(t *testing.T, name string) int32 {
	t.Helper()
	names, err := fs.Glob(migrations.FS, "*_"+name+".sql")
	require.NoError(t, err)
	require.Len(t, names, 1)
	n, err := strconv.Atoi(strings.SplitN(names[0], "_", 2)[0])
	require.NoError(t, err)
	return int32(n)
}

func connect(t *testing.T, url string) *pgx.Conn {
	t.Helper()
	conn, err := pgx.Connect(context.Background(), url)
	require.NoError(t, err)
	t.Cleanup(func() { conn.Close(context.Background()) })
	return conn
}

func userTables(t *testing.T, conn *pgx.Conn) []string {
	t.Helper()
	rows, err := conn.Query(context.Background(), `
		SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
		WHERE n.nspname = 'public' AND c.relkind IN ('r', 'p') AND c.relname <> 'schema_version'
		ORDER BY 1`)
	require.NoError(t, err)
	names, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	return names
}

// The round trip proves every down part undoes its up part: a down that
// forgets an object makes the second up fail with "already exists".
func TestMigrationsRoundTrip(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	conn := connect(t, dbtest.EmptyURL(t))

	st, err := migrate.CurrentStatus(ctx, conn)
	require.NoError(t, err)
	require.Equal(t, int32(0), st.Current)
	require.True(t, st.Behind())
	require.ErrorContains(t, migrate.RequireCurrent(ctx, conn), "run `buzz-relay migrate`")

	require.NoError(t, migrate.Up(ctx, conn))
	require.NoError(t, migrate.RequireCurrent(ctx, conn))
	migrated := userTables(t, conn)
	require.Contains(t, migrated, "communities")
	require.Contains(t, migrated, "events")

	require.NoError(t, migrate.To(ctx, conn, 0))
	require.Empty(t, userTables(t, conn), "down to zero must drop every table")
	var leftovers []string
	rows, err := conn.Query(ctx, `
		SELECT p.proname FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
		WHERE n.nspname = 'public' ORDER BY 1`)
	require.NoError(t, err)
	leftovers, err = pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	require.Empty(t, leftovers, "down to zero must drop every function")

	require.NoError(t, migrate.Up(ctx, conn))
	require.Equal(t, migrated, userTables(t, conn))
}

// Migrations that run outside a transaction (CREATE INDEX CONCURRENTLY) can
// stop half way; re-running them after a crash must succeed.
func TestDisableTxMigrationsAreIdempotent(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	conn := connect(t, dbtest.URL(t))
	disableTx := regexp.MustCompile(`(?m)^---- tern: disable-tx ----$`)
	names, err := fs.Glob(migrations.FS, "*.sql")
	require.NoError(t, err)
	for _, name := range names {
		body, err := fs.ReadFile(migrations.FS, name)
		require.NoError(t, err)
		up, _, _ := strings.Cut(string(body), "---- create above / drop below ----")
		if !disableTx.MatchString(up) {
			require.NotContains(t, strings.ToUpper(withoutComments(up)), "CONCURRENTLY", "%s: CONCURRENTLY needs tern's disable-tx mode", name)
			continue
		}
		// They run without the schema destruction lock (migrate.step).
		require.NotContains(t, strings.ToUpper(withoutComments(up)), "CREATE TABLE", "%s: a new table needs a transactional migration", name)
		// One statement at a time, as tern runs them: several statements
		// in one Exec would form one implicit transaction.
		for _, statement := range splitStatements(up) {
			_, err = conn.Exec(ctx, statement)
			require.NoError(t, err, "%s: re-running the up part of a disable-tx migration must be a no-op:\n%s", name, statement)
		}
	}
}

// A transactional migration's up part bounds its lock waits: without
// lock_timeout, a statement queued behind a long transaction for a lock on
// a hot table queues every writer of the table behind itself for as long.
// Migrations from 047 on follow the rule (the older ones ran before it).
// A disable-tx part is not held to it: lock_timeout would cancel a
// concurrent index build's wait for older transactions, leaving it INVALID.
func TestTransactionalMigrationsBoundTheirLockWaits(t *testing.T) {
	names, err := fs.Glob(migrations.FS, "*.sql")
	require.NoError(t, err)
	disableTx := regexp.MustCompile(`(?m)^---- tern: disable-tx ----$`)
	setsTimeout := regexp.MustCompile(`(?m)^SET LOCAL lock_timeout = '[0-9]+s';$`)
	for _, name := range names {
		number, err := strconv.Atoi(strings.SplitN(name, "_", 2)[0])
		require.NoError(t, err)
		body, err := fs.ReadFile(migrations.FS, name)
		require.NoError(t, err)
		up, _, _ := strings.Cut(string(body), "---- create above / drop below ----")
		if number < 47 || disableTx.MatchString(up) {
			continue
		}
		require.Regexp(t, setsTimeout, up, "%s: a transactional migration sets lock_timeout (SET LOCAL lock_timeout = '5s';)", name)
	}
}

// A disable-tx migration runs with lock_timeout and statement_timeout
// lifted (step), so its concurrent index builds are not cancelled and left
// INVALID; a RESET of either before such a build would bring back the
// migrator role's own. Mutation killed: 042 with its RESET lock_timeout
// back before CREATE INDEX CONCURRENTLY.
func TestConcurrentBuildsAreNotPrecededByATimeoutReset(t *testing.T) {
	names, err := fs.Glob(migrations.FS, "*.sql")
	require.NoError(t, err)
	disableTx := regexp.MustCompile(`(?m)^---- tern: disable-tx ----$`)
	reset := regexp.MustCompile(`(?im)^\s*RESET (lock_timeout|statement_timeout|all)\b`)
	concurrently := regexp.MustCompile(`(?i)\bINDEX CONCURRENTLY\b`)
	for _, name := range names {
		body, err := fs.ReadFile(migrations.FS, name)
		require.NoError(t, err)
		up, down, _ := strings.Cut(string(body), "---- create above / drop below ----")
		for _, part := range []string{up, down} {
			if !disableTx.MatchString(part) {
				continue
			}
			part = withoutComments(part)
			if at := reset.FindStringIndex(part); at != nil {
				require.NotRegexp(t, concurrently, part[at[1]:], "%s: RESET before a concurrent build brings back the role's timeouts; SET lock_timeout = 0 instead", name)
			}
		}
	}
}

// splitStatements cuts SQL at top-level semicolons, skipping those inside
// quotes, dollar-quoted bodies and -- comments.
func splitStatements(sql string) []string {
	var out []string
	start := 0
	for i := 0; i < len(sql); i++ {
		switch {
		case strings.HasPrefix(sql[i:], "--"):
			if j := strings.IndexByte(sql[i:], '\n'); j >= 0 {
				i += j
			} else {
				i = len(sql)
			}
		case sql[i] == '\'':
			if j := strings.IndexByte(sql[i+1:], '\''); j >= 0 {
				i += j + 1
			}
		case strings.HasPrefix(sql[i:], "$$"):
			if j := strings.Index(sql[i+2:], "$$"); j >= 0 {
				i += j + 3
			}
		case sql[i] == ';':
			if s := strings.TrimSpace(sql[start : i+1]); withoutComments(s) != ";" {
				out = append(out, s)
			}
			start = i + 1
		}
	}
	if s := strings.TrimSpace(withoutComments(sql[start:])); s != "" {
		out = append(out, sql[start:])
	}
	return out
}

// withoutComments drops -- comment lines, which may mention any keyword.
func withoutComments(sql string) string {
	var b strings.Builder
	for _, line := range strings.Split(sql, "\n") {
		if !strings.HasPrefix(strings.TrimSpace(line), "--") {
			b.WriteString(line + "\n")
		}
	}
	return b.String()
}

// Every table not registered as operator-global is tenant data: it must
// carry community_id NOT NULL leading its primary key, every unique
// constraint or index and every foreign key, so no query can reach another tenant's rows by key. Checked over the
// live catalog, so a new migration cannot slip past it.
func TestTenantKeyRule(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	conn := connect(t, dbtest.URL(t))
	violations, err := tenantKeyViolations(ctx, conn)
	require.NoError(t, err)
	require.Empty(t, violations)

	// The rule has teeth: a table without the tenant key is reported.
	_, err = conn.Exec(ctx, `CREATE TABLE lint_probe (id bigint PRIMARY KEY, note text UNIQUE, community_id uuid, owner uuid REFERENCES communities (id))`)
	require.NoError(t, err)
	violations, err = tenantKeyViolations(ctx, conn)
	require.NoError(t, err)
	require.ElementsMatch(t, []string{
		"lint_probe: community_id is missing or nullable",
		"lint_probe: primary key lint_probe_pkey does not lead with community_id",
		"lint_probe: unique index lint_probe_note_key does not lead with community_id",
		"lint_probe: foreign key lint_probe_owner_fkey does not lead with community_id",
	}, violations)

	_, err = conn.Exec(ctx, `INSERT INTO _operator_global_tables VALUES ('lint_probe', 'test')`)
	require.NoError(t, err)
	violations, err = tenantKeyViolations(ctx, conn)
	require.NoError(t, err)
	require.Empty(t, violations)
}

func tenantKeyViolations(ctx context.Context, conn *pgx.Conn) ([]string, error) {
	rows, err := conn.Query(ctx, `
		WITH tenant_tables AS (
			SELECT c.oid, c.relname
			FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
			WHERE n.nspname = 'public' AND c.relkind IN ('r', 'p') AND NOT c.relispartition
			  AND c.relname NOT IN (SELECT table_name FROM _operator_global_tables)
		), community_col AS (
			SELECT a.attrelid, a.attnum, a.attnotnull
			FROM pg_attribute a
			WHERE a.attname = 'community_id' AND NOT a.attisdropped
		)
		SELECT format('%s: community_id is missing or nullable', t.relname)
		FROM tenant_tables t LEFT JOIN community_col cc ON cc.attrelid = t.oid
		WHERE cc.attnotnull IS NOT TRUE
		UNION ALL
		SELECT format('%s: table has no primary key', t.relname)
		FROM tenant_tables t
		WHERE NOT EXISTS (SELECT FROM pg_constraint k WHERE k.conrelid = t.oid AND k.contype = 'p')
		UNION ALL
		SELECT format('%s: %s %s does not lead with community_id', t.relname,
		              CASE WHEN i.indisprimary THEN 'primary key' ELSE 'unique index' END, ic.relname)
		FROM tenant_tables t
		JOIN pg_index i ON i.indrelid = t.oid AND i.indisunique
		JOIN pg_class ic ON ic.oid = i.indexrelid
		LEFT JOIN community_col cc ON cc.attrelid = t.oid
		WHERE cc.attnum IS NULL OR i.indkey[0] <> cc.attnum
		UNION ALL
		SELECT format('%s: foreign key %s does not lead with community_id', t.relname, k.conname)
		FROM tenant_tables t
		JOIN pg_constraint k ON k.conrelid = t.oid AND k.contype = 'f'
		LEFT JOIN community_col cc ON cc.attrelid = t.oid
		WHERE cc.attnum IS NULL OR k.conkey[1] <> cc.attnum
		ORDER BY 1`)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, pgx.RowTo[string])
}

// A foreign key whose referencing columns lead no index makes every delete
// or key update of a referenced row scan the whole referencing table (the
// check runs once per row): a purge of a community's workflow runs was
// quadratic in its schedule claims.
func TestEveryForeignKeyIsIndexed(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	conn := connect(t, dbtest.URL(t))
	missing, err := unindexedForeignKeys(ctx, conn)
	require.NoError(t, err)
	require.Empty(t, missing)

	// The check has teeth: a reference to channels without an index of its own.
	_, err = conn.Exec(ctx, `CREATE TABLE fk_probe (community_id uuid NOT NULL, id bigint, channel_id uuid,
		PRIMARY KEY (community_id, id), FOREIGN KEY (community_id, channel_id) REFERENCES channels (community_id, id))`)
	require.NoError(t, err)
	missing, err = unindexedForeignKeys(ctx, conn)
	require.NoError(t, err)
	require.Equal(t, []string{"fk_probe: fk_probe_community_id_channel_id_fkey"}, missing)

	// A partial index that leaves out more than NULL keys does not serve it;
	// one that leaves out only NULL channels does.
	_, err = conn.Exec(ctx, `CREATE INDEX fk_probe_some ON fk_probe (community_id, channel_id) WHERE id > 0`)
	require.NoError(t, err)
	missing, err = unindexedForeignKeys(ctx, conn)
	require.NoError(t, err)
	require.Equal(t, []string{"fk_probe: fk_probe_community_id_channel_id_fkey"}, missing)
	_, err = conn.Exec(ctx, `CREATE INDEX fk_probe_channel ON fk_probe (community_id, channel_id) WHERE channel_id IS NOT NULL`)
	require.NoError(t, err)
	missing, err = unindexedForeignKeys(ctx, conn)
	require.NoError(t, err)
	require.Empty(t, missing)
}

// unindexedForeignKeys names each foreign key that no valid index can serve:
// one whose first columns are the key's columns in any order, or a unique
// one whose columns are all among the key's (at most one row to check).
// A partial index counts only when it leaves out nothing but NULLs of a
// key column, which the check's equality never looks up.
func unindexedForeignKeys(ctx context.Context, conn *pgx.Conn) ([]string, error) {
	rows, err := conn.Query(ctx, `
		SELECT format('%s: %s', k.conrelid::regclass, k.conname)
		FROM pg_constraint k
		JOIN pg_namespace n ON n.oid = k.connamespace
		WHERE k.contype = 'f' AND n.nspname = 'public'
		  AND NOT EXISTS (
			SELECT FROM pg_index i
			WHERE i.indrelid = k.conrelid AND i.indisvalid
			  AND (i.indpred IS NULL OR pg_get_expr(i.indpred, i.indrelid) IN (
				SELECT format('(%I IS NOT NULL)', a.attname) FROM pg_attribute a
				WHERE a.attrelid = k.conrelid AND a.attnum = ANY(k.conkey)))
			  AND (((i.indkey::int2[])[0:cardinality(k.conkey) - 1] @> k.conkey
			        AND (i.indkey::int2[])[0:cardinality(k.conkey) - 1] <@ k.conkey)
			       OR (i.indisunique AND (i.indkey::int2[])[0:i.indnkeyatts - 1] <@ k.conkey)))
		ORDER BY 1`)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, pgx.RowTo[string])
}
