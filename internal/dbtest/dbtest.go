// Package dbtest gives tests real PostgreSQL databases: one private cluster per
// test run, one migrated template database per migration set, and one cloned
// database per test that asks for isolation (dropped when the test ends).
//
// `make test` starts the cluster once for every test package (see
// internal/dbtest/withcluster) and passes its admin URL in
// BUZZ_TEST_PG_URL. A package run on its own by `go test` starts its own
// cluster from Main instead. Either way no database test ever skips.
package dbtest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net/url"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/buzzrelay/buzz/internal/migrate"
	"github.com/buzzrelay/buzz/internal/pgcluster"
	"github.com/buzzrelay/buzz/internal/pguuid"
	"github.com/buzzrelay/buzz/internal/redisserver"
)

// AdminURLEnv names the variable holding the test cluster's admin URL.
const AdminURLEnv = "BUZZ_TEST_PG_URL"

// TimeZone is a non-UTC session zone with a half-hour offset: code that
// mixes local and UTC time fails loudly under it.
const TimeZone = "America/St_Johns"

// ClusterSettings are the test cluster's postgresql.conf extras.
var ClusterSettings = map[string]string{"timezone": "'" + TimeZone + "'"}

var adminURL string

// RedisURLEnv names the variable holding the test redis-server's URL.
const RedisURLEnv = "BUZZ_TEST_REDIS_URL"

var (
	redisMu      sync.Mutex
	redisURL     string
	redisPrivate *redisserver.Server // started by this process: stopped when Main returns
)

// Main runs a test package's tests against the shared cluster, starting a
// private one for this process when none was given. Call it from TestMain.
func Main(m *testing.M) {
	os.Exit(Run(m))
}

// Run is Main for a TestMain with clean-up of its own after the tests: it
// returns the exit code instead of exiting.
func Run(m *testing.M) int {
	adminURL = os.Getenv(AdminURLEnv)
	if adminURL == "" {
		cluster, err := pgcluster.StartTemp(context.Background(), ClusterSettings)
		if err != nil {
			fmt.Fprintln(os.Stderr, "dbtest: start private PostgreSQL:", err)
			return 1
		}
		defer cluster.Close()
		adminURL = cluster.URL("postgres")
	}
	defer stopPrivateStandby()
	defer func() {
		if redisPrivate != nil {
			redisPrivate.Close()
		}
	}()
	return m.Run()
}

// RedisURL is the URL of the test run's redis-server: the one the wrapper
// (withcluster) started, else one this test process starts on first use.
// A test that needs Redis fails, never skips, when there is none: the
// multi-relay paths must not go quietly untested.
func RedisURL(t testing.TB) string {
	t.Helper()
	redisMu.Lock()
	defer redisMu.Unlock()
	if redisURL == "" {
		redisURL = os.Getenv(RedisURLEnv)
	}
	if redisURL == "" {
		srv, err := redisserver.Start(context.Background())
		if err != nil {
			t.Fatalf("dbtest: %s is unset and no private redis-server could start: %v", RedisURLEnv, err)
		}
		redisPrivate, redisURL = srv, srv.URL()
	}
	return redisURL
}

// RedisServer starts a redis-server of the test's own, stopped when the
// test ends: for tests that kill it and bring it back.
func RedisServer(t testing.TB) *redisserver.Server {
	t.Helper()
	srv, err := redisserver.Start(context.Background())
	if err != nil {
		t.Fatalf("dbtest: start redis-server: %v", err)
	}
	t.Cleanup(srv.Close)
	return srv
}

// AdminURL is the test cluster's superuser URL (valid inside tests run
// through Main).
func AdminURL() string { return adminURL }

// URL returns the URL of a fresh migrated database for this test, dropped at
// cleanup. The session time zone is TimeZone.
func URL(t testing.TB) string {
	t.Helper()
	if adminURL == "" {
		t.Fatal("dbtest: call dbtest.Main(m) from TestMain")
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	admin, err := pgx.Connect(ctx, adminURL)
	if err != nil {
		t.Fatalf("dbtest: connect to test cluster: %v", err)
	}
	defer admin.Close(ctx)

	template, err := ensureTemplate(ctx, admin)
	if err != nil {
		t.Fatalf("dbtest: template: %v", err)
	}
	name := "buzz_test_" + randomHex(6)
	if _, err := admin.Exec(ctx, fmt.Sprintf("CREATE DATABASE %s TEMPLATE %s STRATEGY FILE_COPY", name, template)); err != nil {
		t.Fatalf("dbtest: clone template: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		admin, err := pgx.Connect(ctx, adminURL)
		if err != nil {
			t.Errorf("dbtest: drop %s: %v", name, err)
			return
		}
		defer admin.Close(ctx)
		if _, err := admin.Exec(ctx, "DROP DATABASE "+name+" WITH (FORCE)"); err != nil {
			t.Errorf("dbtest: drop %s: %v", name, err)
		}
	})
	return databaseURL(name)
}

// Pool returns a pool on a fresh migrated database for this test.
func Pool(t testing.TB) *pgxpool.Pool {
	t.Helper()
	return PoolOn(t, URL(t), 0)
}

// PoolOn returns a pool on the database at url (from URL), configured as
// the relay's pools, of at most maxConns connections (0: pgx's default),
// then by each of configure.
func PoolOn(t testing.TB, url string, maxConns int32, configure ...func(*pgxpool.Config)) *pgxpool.Pool {
	t.Helper()
	cfg, err := pguuid.ParsePoolConfig(url) // as the relay's pools
	if err != nil {
		t.Fatalf("dbtest: pool: %v", err)
	}
	if maxConns > 0 {
		cfg.MaxConns = maxConns
	}
	for _, c := range configure {
		c(cfg)
	}
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatalf("dbtest: pool: %v", err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// EmptyURL returns a fresh database with no migrations applied, for tests of
// the migrations themselves.
func EmptyURL(t testing.TB) string {
	t.Helper()
	ctx := context.Background()
	admin, err := pgx.Connect(ctx, adminURL)
	if err != nil {
		t.Fatalf("dbtest: %v", err)
	}
	defer admin.Close(ctx)
	name := "buzz_empty_" + randomHex(6)
	if _, err := admin.Exec(ctx, "CREATE DATABASE "+name); err != nil {
		t.Fatalf("dbtest: %v", err)
	}
	t.Cleanup(func() {
		admin, err := pgx.Connect(context.Background(), adminURL)
		if err == nil {
			defer admin.Close(context.Background())
			_, err = admin.Exec(context.Background(), "DROP DATABASE "+name+" WITH (FORCE)")
		}
		if err != nil {
			t.Errorf("dbtest: drop %s: %v", name, err)
		}
	})
	return databaseURL(name)
}

// ensureTemplate builds the template for the embedded migrations once per
// cluster. Test packages run as parallel processes, so the build is
// serialized with an advisory lock and published by an atomic rename.
func ensureTemplate(ctx context.Context, admin *pgx.Conn) (string, error) {
	name := "buzz_template_" + migrate.Hash()
	if _, err := admin.Exec(ctx, "SELECT pg_advisory_lock(hashtext($1))", name); err != nil {
		return "", err
	}
	defer admin.Exec(context.Background(), "SELECT pg_advisory_unlock(hashtext($1))", name)

	var exists bool
	if err := admin.QueryRow(ctx, "SELECT EXISTS (SELECT FROM pg_database WHERE datname = $1)", name).Scan(&exists); err != nil {
		return "", err
	}
	if exists {
		return name, nil
	}
	building := name + "_building"
	if _, err := admin.Exec(ctx, "DROP DATABASE IF EXISTS "+building+" WITH (FORCE)"); err != nil {
		return "", err
	}
	if _, err := admin.Exec(ctx, "CREATE DATABASE "+building); err != nil {
		return "", err
	}
	conn, err := pgx.Connect(ctx, databaseURL(building))
	if err != nil {
		return "", err
	}
	err = migrate.Up(ctx, conn)
	conn.Close(ctx)
	if err != nil {
		return "", fmt.Errorf("migrate template: %w", err)
	}
	// Nobody may connect to a template: a connection would make every clone fail.
	for _, stmt := range []string{
		"ALTER DATABASE " + building + " RENAME TO " + name,
		"ALTER DATABASE " + name + " WITH IS_TEMPLATE true ALLOW_CONNECTIONS false",
	} {
		if _, err := admin.Exec(ctx, stmt); err != nil {
			return "", err
		}
	}
	return name, nil
}

func databaseURL(name string) string {
	u, err := url.Parse(adminURL)
	if err != nil {
		panic(err)
	}
	u.Path = "/" + name
	q := u.Query()
	q.Set("timezone", TimeZone)
	u.RawQuery = q.Encode()
	return u.String()
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// RowsRead is how many rows of table the session behind tx read (by
// sequential scans, plus rows fetched through indexes) and has not yet
// reported. PostgreSQL reports a session's counts only between
// transactions, so the difference of two calls in one transaction is what
// that transaction read in between: a test bounds a statement's reads with
// it, where a plan or a wall-clock time would be fragile.
func RowsRead(t testing.TB, tx pgx.Tx, table string) int64 {
	t.Helper()
	var n int64
	err := tx.QueryRow(context.Background(), `
		SELECT coalesce(sum(seq_tup_read + coalesce(idx_tup_fetch, 0)), 0)::bigint
		FROM pg_stat_xact_user_tables WHERE relid = $1::regclass`, table).Scan(&n)
	if err != nil {
		t.Fatalf("rows read of %s: %v", table, err)
	}
	return n
}

// SessionName is the application_name pg_stat_activity shows for a session
// of q (a pool's: any one of its connections).
func SessionName(t testing.TB, q interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}) string {
	t.Helper()
	var name string
	if err := q.QueryRow(context.Background(), "SELECT application_name FROM pg_stat_activity WHERE pid = pg_backend_pid()").Scan(&name); err != nil {
		t.Fatalf("dbtest: session name: %v", err)
	}
	return name
}
