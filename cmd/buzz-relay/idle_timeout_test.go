package main

import (
	"context"
	"fmt"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/buzzrelay/buzz/internal/dbtest"
	"github.com/buzzrelay/buzz/internal/pguuid"
)

// serve's sessions end a transaction left idle for the write timeout, at
// least 5 s, unless the operator set the timeout for the relay: in
// BUZZ_DATABASE_URL, as a parameter or in options, or with ALTER DATABASE /
// ALTER ROLE ... SET. The session value is read back with SHOW through a
// real pool, as serve configures it.
// Mutations killed: the 5 s floor dropped (2 s); the URL's parameter or
// options overridden (30 s instead of 7 s, 9 s, ...); the database's, the
// role's in it or the role's own setting overridden (30 s instead of 15,
// 16, 17 s: what a startup parameter did); the pool's earlier connect hook
// dropped (the uuid codec missing).
func TestServeSessionsIdleInTransactionTimeout(t *testing.T) {
	t.Parallel()
	base := dbtest.URL(t)
	for _, tc := range []struct {
		name         string
		query        url.Values
		alter        string // run on the test's own database first; %s is its name (the role's, with role)
		role         bool   // the pool logs in as a role of its own
		writeTimeout time.Duration
		want         string
	}{
		{"the write timeout", nil, "", false, 30 * time.Second, "30s"},
		{"at least 5 s", nil, "", false, 2 * time.Second, "5s"},
		{"other options", url.Values{"options": {"-c statement_timeout=60000"}}, "", false, 30 * time.Second, "30s"},
		{"the URL's parameter", url.Values{"idle_in_transaction_session_timeout": {"7000"}}, "", false, 30 * time.Second, "7s"},
		{"the URL's options", url.Values{"options": {"-c idle_in_transaction_session_timeout=9000"}}, "", false, 30 * time.Second, "9s"},
		{"the URL's options, dashed", url.Values{"options": {"--idle-in-transaction-session-timeout=11000"}}, "", false, 30 * time.Second, "11s"},
		{"the URL's options, in capitals", url.Values{"options": {"-c IDLE_IN_TRANSACTION_SESSION_TIMEOUT=12000"}}, "", false, 30 * time.Second, "12s"},
		{"the URL's options, -c joined", url.Values{"options": {"-c statement_timeout=60000 -cidle_in_transaction_session_timeout=13000"}}, "", false, 30 * time.Second, "13s"},
		{"the name as another option's value", url.Values{"options": {"-c application_name=idle_in_transaction_session_timeout"}}, "", false, 30 * time.Second, "30s"},
		{"the URL's parameter, in capitals", url.Values{"IDLE_IN_TRANSACTION_SESSION_TIMEOUT": {"14000"}}, "", false, 30 * time.Second, "14s"},
		{"the database's setting", nil, "ALTER DATABASE %s SET idle_in_transaction_session_timeout = 15000", false, 30 * time.Second, "15s"},
		{"the role's setting in the database", nil, "ALTER ROLE CURRENT_USER IN DATABASE %s SET idle_in_transaction_session_timeout = 16000", false, 30 * time.Second, "16s"},
		{"another setting of the database", nil, "ALTER DATABASE %s SET statement_timeout = 60000", false, 30 * time.Second, "30s"},
		{"the relay role's setting", nil, "ALTER ROLE %s SET idle_in_transaction_session_timeout = 17000", true, 30 * time.Second, "17s"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			base := base
			var role string
			if tc.alter != "" {
				// A database of its own: the setting applies to every later session.
				base = dbtest.URL(t)
				conn, err := pgx.Connect(context.Background(), base)
				require.NoError(t, err)
				defer conn.Close(context.Background())
				name := pgx.Identifier{conn.Config().Database}.Sanitize()
				if tc.role {
					role = "idle_timeout_" + strings.TrimPrefix(conn.Config().Database, "buzz_")
					name = pgx.Identifier{role}.Sanitize()
					_, err = conn.Exec(context.Background(), "CREATE ROLE "+name+" LOGIN")
					require.NoError(t, err)
					t.Cleanup(func() {
						_, _ = conn.Exec(context.Background(), "DROP ROLE "+name)
					})
				}
				_, err = conn.Exec(context.Background(), fmt.Sprintf(tc.alter, name))
				require.NoError(t, err)
			}
			u, err := url.Parse(base)
			require.NoError(t, err)
			if role != "" {
				u.User = url.User(role)
			}
			q := u.Query()
			for k, v := range tc.query {
				q[k] = v
			}
			// pgx reads a + in the query as itself, not as a space.
			u.RawQuery = strings.ReplaceAll(q.Encode(), "+", "%20")
			cfg, err := pguuid.ParsePoolConfig(u.String())
			require.NoError(t, err)
			armIdleInTransactionTimeout(cfg, tc.writeTimeout)
			pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
			require.NoError(t, err)
			defer pool.Close()
			var got string
			require.NoError(t, pool.QueryRow(context.Background(), "SHOW idle_in_transaction_session_timeout").Scan(&got))
			require.Equal(t, tc.want, got)
			// The pool's own connect hook (the uuid codec) still runs.
			require.NoError(t, pool.AcquireFunc(context.Background(), func(c *pgxpool.Conn) error {
				typ, ok := c.Conn().TypeMap().TypeForOID(pgtype.UUIDOID)
				require.True(t, ok)
				require.Equal(t, "pguuid.codec", fmt.Sprintf("%T", typ.Codec))
				return nil
			}))
		})
	}
}
