package dberr_test

import (
	"bytes"
	"context"
	"errors"
	"net/url"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/buzzrelay/buzz/internal/db"
	"github.com/buzzrelay/buzz/internal/dberr"
	"github.com/buzzrelay/buzz/internal/dbtest"
	"github.com/buzzrelay/buzz/internal/pgcluster"
)

func TestMain(m *testing.M) { dbtest.Main(m) }

// TestConstraintViolationsAreRecognizedByName breaks real constraints of the
// migrated schema, including the rule triggers of migration 011, and checks
// each comes back as a *Violation with its name, kind and fixed client
// text, never the server's message. Mutations killed: a violation without
// a constraint name (the triggers before 011), a raw message reaching the
// client text.
func TestConstraintViolationsAreRecognizedByName(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := dbtest.Pool(t)
	q := db.New(pool)
	home, err := q.CommunityCreate(ctx, "dberr.example")
	require.NoError(t, err)
	owner := bytes.Repeat([]byte{7}, 32)
	channel := uuid.New()
	_, err = q.ChannelCreate(ctx, db.ChannelCreateParams{CommunityID: home.ID, ID: channel, Name: "room", Visibility: db.ChannelVisibilityOpen, CreatedBy: owner})
	require.NoError(t, err)
	role := db.MemberRoleOwner
	added, err := q.ChannelMemberUpsert(ctx, db.ChannelMemberUpsertParams{CommunityID: home.ID, ChannelID: channel, Pubkey: owner, Role: &role, MaxMembers: 10})
	require.NoError(t, err)
	require.EqualValues(t, 1, added)

	for _, tc := range []struct {
		name       string
		run        func() error
		kind       dberr.ViolationKind
		constraint string
		text       string
	}{
		{"unique", func() error { _, err := q.CommunityCreate(ctx, "dberr.example"); return err },
			dberr.Unique, "communities_host_key", "that host is already taken"},
		{"check", func() error {
			_, err := q.ChannelCreate(ctx, db.ChannelCreateParams{CommunityID: home.ID, ID: uuid.New(), Name: "  ", Visibility: db.ChannelVisibilityOpen, CreatedBy: owner})
			return err
		}, dberr.Check, "channels_name_not_blank", "a channel name must not be blank"},
		{"trigger raising check_violation", func() error {
			_, err := q.ChannelMemberRemove(ctx, db.ChannelMemberRemoveParams{CommunityID: home.ID, ChannelID: channel, Pubkey: owner, RemovedBy: owner})
			return err
		}, dberr.Check, "channel_members_keep_an_owner", "a channel must keep an owner: make someone else owner first"},
		{"foreign key", func() error {
			_, err := q.ChannelMemberUpsert(ctx, db.ChannelMemberUpsertParams{CommunityID: home.ID, ChannelID: uuid.New(), Pubkey: owner, MaxMembers: 10})
			return err
		}, dberr.ForeignKey, "channel_members_community_id_channel_id_fkey", "the database refused the write (rule channel_members_community_id_channel_id_fkey)"},
		{"not null", func() error {
			_, err := pool.Exec(ctx, `INSERT INTO communities (host) VALUES (NULL)`)
			return err
		}, dberr.NotNull, "", "the database refused the write (rule )"},
	} {
		err := tc.run()
		require.Error(t, err, tc.name)
		v, ok := dberr.AsViolation(err)
		require.True(t, ok, "%s: want a violation, got %v", tc.name, err)
		require.Equal(t, tc.kind, v.Kind, tc.name)
		require.Equal(t, tc.constraint, v.Constraint, tc.name)
		require.Equal(t, tc.text, v.ClientText, tc.name)
		var asViolation *dberr.Violation
		require.ErrorAs(t, dberr.Interpret(err), &asViolation)
	}
}

// TestConditionsAreRecognizedBySQLState provokes each condition in a real
// server and checks the sentinel Interpret maps it to.
func TestConditionsAreRecognizedBySQLState(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := dbtest.Pool(t)
	q := db.New(pool)

	_, err := q.CommunityByHost(ctx, "nobody.example")
	require.ErrorIs(t, dberr.Interpret(err), dberr.ErrNotFound)
	require.True(t, dberr.IsNotFound(err))

	require.ErrorIs(t, dberr.Interpret(onOneConn(t, pool, func(c *pgx.Conn) error {
		_, err := c.Exec(ctx, `CREATE TEMP SEQUENCE s`)
		require.NoError(t, err)
		_, err = c.Exec(ctx, `SELECT currval('s')`) // 55000: no nextval yet in this session
		require.NotErrorIs(t, dberr.Interpret(err), dberr.ErrCommunityWriteFenced, "only the fence's 55000 is the fence")
		return err
	})), dberr.ErrNotInPrerequisiteState)

	// The write fence's 55000 names its rule (a community that is not
	// there: the fence's trigger runs before the foreign key is checked).
	_, err = pool.Exec(ctx, `INSERT INTO media_usage (community_id) VALUES (gen_random_uuid())`)
	require.ErrorIs(t, dberr.Interpret(err), dberr.ErrCommunityWriteFenced)
	require.NotErrorIs(t, dberr.Interpret(err), dberr.ErrNotInPrerequisiteState)

	require.ErrorIs(t, dberr.Interpret(onOneConn(t, pool, func(c *pgx.Conn) error {
		tx, err := c.BeginTx(ctx, pgx.TxOptions{AccessMode: pgx.ReadOnly})
		require.NoError(t, err)
		defer func() { _ = tx.Rollback(ctx) }()
		_, err = tx.Exec(ctx, `CREATE TEMP TABLE t (x int)`) // 25006: read-only transaction
		return err
	})), dberr.ErrInvalidTransactionState)

	require.ErrorIs(t, dberr.Interpret(onOneConn(t, pool, func(c *pgx.Conn) error {
		_, err := c.Exec(ctx, `SET statement_timeout = '10ms'`)
		require.NoError(t, err)
		_, err = c.Exec(ctx, `SELECT pg_sleep(10)`) // 57014
		_, resetErr := c.Exec(ctx, `RESET statement_timeout`)
		require.NoError(t, resetErr)
		return err
	})), dberr.ErrQueryCanceled)

	// 40001: two serializable transactions each read what the other writes.
	_, err = pool.Exec(ctx, `CREATE TABLE skew (id int PRIMARY KEY, on_call bool NOT NULL); INSERT INTO skew VALUES (1, true), (2, true)`)
	require.NoError(t, err)
	serializable := pgx.TxOptions{IsoLevel: pgx.Serializable}
	a, err := pool.BeginTx(ctx, serializable)
	require.NoError(t, err)
	defer func() { _ = a.Rollback(ctx) }()
	b, err := pool.BeginTx(ctx, serializable)
	require.NoError(t, err)
	defer func() { _ = b.Rollback(ctx) }()
	for _, tx := range []pgx.Tx{a, b} {
		var n int
		require.NoError(t, tx.QueryRow(ctx, `SELECT count(*) FROM skew WHERE on_call`).Scan(&n))
	}
	_, err = a.Exec(ctx, `UPDATE skew SET on_call = false WHERE id = 1`)
	require.NoError(t, err)
	_, err = b.Exec(ctx, `UPDATE skew SET on_call = false WHERE id = 2`)
	require.NoError(t, err)
	require.NoError(t, a.Commit(ctx))
	require.ErrorIs(t, dberr.Interpret(b.Commit(ctx)), dberr.ErrSerialization)

	other := errors.New("not a database error")
	require.Equal(t, other, dberr.Interpret(other))
	require.NoError(t, dberr.Interpret(nil))
}

func onOneConn(t *testing.T, pool *pgxpool.Pool, fn func(*pgx.Conn) error) error {
	t.Helper()
	conn, err := pool.Acquire(context.Background())
	require.NoError(t, err)
	defer conn.Release()
	return fn(conn.Conn())
}

// IsTransient holds for failures another attempt of the transaction may
// not meet (the session ended under it, the connection is gone, a
// serialization race lost) and for nothing the statement itself caused.
func TestTransientFailuresAreTellable(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := dbtest.Pool(t)

	conn, err := pool.Acquire(ctx)
	require.NoError(t, err)
	defer conn.Release()
	tx, err := conn.Begin(ctx)
	require.NoError(t, err)
	var pid int
	require.NoError(t, tx.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&pid))
	_, err = pool.Exec(ctx, `SELECT pg_terminate_backend($1)`, pid)
	require.NoError(t, err)
	terminated := tx.Commit(ctx) // 57P01, or the broken connection itself
	require.Error(t, terminated)
	require.True(t, dberr.IsTransient(terminated), "%v", terminated)
	_, closed := conn.Exec(ctx, `SELECT 1`) // the connection is gone now
	require.True(t, dberr.IsTransient(closed), "%v", closed)
	require.True(t, dberr.IsUnreachable(terminated), "%v", terminated)
	require.True(t, dberr.IsUnreachable(closed), "%v", closed)

	_, err = pool.Exec(ctx, `CREATE TABLE once (id int PRIMARY KEY); INSERT INTO once VALUES (1)`)
	require.NoError(t, err)
	_, duplicate := pool.Exec(ctx, `INSERT INTO once VALUES (1)`)
	var pgErr *pgconn.PgError
	require.ErrorAs(t, duplicate, &pgErr)
	require.Equal(t, "23505", pgErr.Code)
	require.False(t, dberr.IsTransient(duplicate), "%v", duplicate)
	timedOut := onOneConn(t, pool, func(c *pgx.Conn) error {
		_, err := c.Exec(ctx, `SET statement_timeout = '10ms'`)
		require.NoError(t, err)
		_, err = c.Exec(ctx, `SELECT pg_sleep(10)`)
		_, resetErr := c.Exec(ctx, `RESET statement_timeout`)
		require.NoError(t, resetErr)
		return err
	})
	require.ErrorIs(t, dberr.Interpret(timedOut), dberr.ErrQueryCanceled)
	require.False(t, dberr.IsTransient(timedOut), "%v", timedOut)
	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	_, err = pool.Exec(cancelled, `SELECT 1`)
	require.False(t, dberr.IsTransient(err), "%v", err)
	require.True(t, dberr.IsTransient(&pgconn.PgError{Code: "40001"}))
	require.True(t, dberr.IsTransient(&pgconn.PgError{Code: "08006"}))
	require.True(t, dberr.IsTransient(&pgconn.PgError{Code: "53300"}), "too many connections")
	require.True(t, dberr.IsTransient(&pgconn.PgError{Code: "57P05"}), "idle session timeout")
	// A protocol violation (a message the server could not take) is the
	// client's own doing, sent again on every attempt.
	require.False(t, dberr.IsTransient(&pgconn.PgError{Code: "08P01"}))
	require.False(t, dberr.IsTransient(nil))
	// A lost conflict or an idle session ended is this request's own
	// trouble, not the database being out of reach.
	require.False(t, dberr.IsUnreachable(&pgconn.PgError{Code: "40001"}))
	require.False(t, dberr.IsUnreachable(&pgconn.PgError{Code: "57P05"}))
	require.True(t, dberr.IsUnreachable(&pgconn.PgError{Code: "57P03"}), "cannot connect now")
	require.True(t, dberr.IsUnreachable(&pgconn.PgError{Code: "53300"}), "too many connections")
	require.False(t, dberr.IsUnreachable(duplicate))
	require.False(t, dberr.IsUnreachable(timedOut))
	require.False(t, dberr.IsUnreachable(nil))
}

// A server that refuses the relay's login is reached, and refuses: a wrong
// password (28P01) or a role without LOGIN (28000) is a configuration
// error no wait ends, never an outage, whose log says the database is
// unreachable once and whose ping never ends it. A throwaway cluster of
// its own, so that its password rules touch no other test: trust until
// the password is set, then scram-sha-256 from loopback.
// Mutation killed: IsUnreachable taking every ConnectError for an outage,
// as it did (the wrong password is unreachable).
func TestARefusedLoginIsNotAnOutage(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	cluster, err := pgcluster.StartTemp(ctx, map[string]string{"password_encryption": "'scram-sha-256'"})
	require.NoError(t, err)
	t.Cleanup(func() { _ = cluster.Close() })
	admin, err := pgx.Connect(ctx, cluster.URL("postgres"))
	require.NoError(t, err)
	defer admin.Close(ctx)
	_, err = admin.Exec(ctx, `CREATE ROLE relay LOGIN PASSWORD 'right'; CREATE ROLE nologin PASSWORD 'right'`)
	require.NoError(t, err)
	hba := filepath.Join(cluster.DataDir(), "pg_hba.conf")
	require.NoError(t, os.WriteFile(hba, []byte("local all postgres trust\nhost all postgres 127.0.0.1/32 trust\nhost all all 127.0.0.1/32 scram-sha-256\n"), 0o644))
	_, err = admin.Exec(ctx, `SELECT pg_reload_conf()`)
	require.NoError(t, err)

	urlFor := func(user, password string) string {
		u, err := url.Parse(cluster.URL("postgres"))
		require.NoError(t, err)
		u.User = url.UserPassword(user, password)
		return u.String()
	}
	// The reload is asynchronous: wait until the right password is needed.
	require.Eventually(t, func() bool {
		conn, err := pgx.Connect(ctx, urlFor("relay", "wrong"))
		if err == nil {
			conn.Close(ctx)
		}
		return err != nil
	}, 10*time.Second, 10*time.Millisecond)
	right, err := pgxpool.New(ctx, urlFor("relay", "right"))
	require.NoError(t, err)
	defer right.Close()
	require.NoError(t, right.Ping(ctx))

	for user, code := range map[string]string{"relay": "28P01", "nologin": "28000"} {
		pool, err := pgxpool.New(ctx, urlFor(user, map[string]string{"relay": "wrong", "nologin": "right"}[user]))
		require.NoError(t, err)
		_, refused := pool.Exec(ctx, `SELECT 1`)
		pool.Close()
		var pgErr *pgconn.PgError
		require.ErrorAs(t, refused, &pgErr, user)
		require.Equal(t, code, pgErr.Code, user)
		require.True(t, dberr.IsLoginRefused(refused), "%v", refused)
		require.False(t, dberr.IsUnreachable(refused), "%v", refused)
		require.False(t, dberr.IsTransient(refused), "%v", refused)
	}

	// The cluster stopped is still an outage.
	require.NoError(t, cluster.Stop())
	_, down := right.Exec(ctx, `SELECT 1`)
	require.True(t, dberr.IsUnreachable(down), "%v", down)
	require.False(t, dberr.IsLoginRefused(down), "%v", down)
}
