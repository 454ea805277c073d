package relay_test

import (
	"context"
	"encoding/json"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/buzzrelay/buzz/internal/clock"
	"github.com/buzzrelay/buzz/internal/config"
	"github.com/buzzrelay/buzz/internal/dberr"
	"github.com/buzzrelay/buzz/internal/logtest"
	"github.com/buzzrelay/buzz/internal/outage"
	"github.com/buzzrelay/buzz/internal/pgcluster"
	"github.com/buzzrelay/buzz/internal/relay"
)

// A server that refuses the relay's login (its role's password rotated
// under it) fails every request alike, and no wait ends it: it is logged
// loud but bounded, the first refusal at once and then at most one line
// per outage.LoginRefusedEvery on the relay's clock, each with how many
// refusals it did not log since the line before. Each request wrote an
// ERROR ("resolve community", the host lookup every request starts with),
// so under load the log took a line per request. The answer stays 503
// "error: database unavailable; try again" without Retry-After. A
// throwaway cluster of its own, so that its password rules touch no other
// test: trust for postgres, scram-sha-256 for the relay's role.
// Mutations killed (one at a time): the outage log leaving a refused login
// to its caller, as before (an ERROR "resolve community" per request);
// loginRefused logging every refusal (a line per request); the interval
// read from the wall clock instead of the relay's (no second line once
// the stopped clock passed it); the count of refusals not logged left out
// of the next line.
func TestARefusedLoginIsLoggedAtMostOncePerInterval(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	cluster, err := pgcluster.StartTemp(ctx, map[string]string{"password_encryption": "'scram-sha-256'"})
	require.NoError(t, err)
	t.Cleanup(func() { _ = cluster.Close() })
	admin, err := pgx.Connect(ctx, cluster.URL("postgres"))
	require.NoError(t, err)
	t.Cleanup(func() { admin.Close(context.Background()) })
	_, err = admin.Exec(ctx, `CREATE ROLE relay LOGIN PASSWORD 'right'`)
	require.NoError(t, err)
	hba := filepath.Join(cluster.DataDir(), "pg_hba.conf")
	require.NoError(t, os.WriteFile(hba, []byte("local all postgres trust\nhost all postgres 127.0.0.1/32 trust\nhost all all 127.0.0.1/32 scram-sha-256\n"), 0o644))
	_, err = admin.Exec(ctx, `SELECT pg_reload_conf()`)
	require.NoError(t, err)
	u, err := url.Parse(cluster.URL("postgres"))
	require.NoError(t, err)
	u.User = url.UserPassword("relay", "right")
	pool, err := pgxpool.New(ctx, u.String())
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	// The reload is asynchronous: wait until the password is checked.
	require.Eventually(t, func() bool {
		u := *u
		u.User = url.UserPassword("relay", "wrong")
		conn, err := pgx.Connect(ctx, u.String())
		if err == nil {
			conn.Close(ctx)
		}
		return err != nil
	}, 10*time.Second, 10*time.Millisecond)
	require.NoError(t, pool.Ping(ctx), "the relay's password is right to begin with")

	clk := &stoppedClock{now: time.Now()}
	logs := &logtest.Buffer{}
	srv := relay.New(config.Default(), pool, slog.New(slog.NewTextHandler(logs, nil)), relay.WithClock(clock.Stub(clk.at)))
	hs := httptest.NewServer(srv.HTTPServer().Handler)
	t.Cleanup(hs.Close)
	t.Cleanup(func() {
		shutdown, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(shutdown)
	})

	// The password is rotated; the relay's connections end (as they do
	// over their lifetime) and every new one is refused.
	_, err = admin.Exec(ctx, `ALTER ROLE relay PASSWORD 'rotated'`)
	require.NoError(t, err)
	pool.Reset()

	get := func() {
		t.Helper()
		resp, err := http.Get(hs.URL + "/")
		require.NoError(t, err)
		defer resp.Body.Close()
		var answer map[string]string
		require.NoError(t, json.NewDecoder(resp.Body).Decode(&answer))
		require.Equal(t, http.StatusServiceUnavailable, resp.StatusCode, "%v", answer)
		require.Equal(t, map[string]string{"error": dberr.UnavailableAnswer}, answer)
		require.Empty(t, resp.Header.Get("Retry-After"), "no wait ends a refused login")
	}
	refusals := func() []string {
		var lines []string
		for line := range strings.SplitSeq(logs.String(), "\n") {
			if strings.Contains(line, "refused the relay's login") {
				lines = append(lines, line)
			}
		}
		return lines
	}

	for range 5 {
		get()
	}
	lines := refusals()
	require.Len(t, lines, 1, logs.String())
	require.Contains(t, lines[0], "level=ERROR", lines[0])
	require.Contains(t, lines[0], "SQLSTATE 28P01", lines[0])
	require.Contains(t, lines[0], "not_logged_since_last_line=0", lines[0])

	clk.advance(outage.LoginRefusedEvery - time.Second)
	get()
	require.Len(t, refusals(), 1, "within the interval: counted, not logged")
	clk.advance(time.Second)
	get()
	lines = refusals()
	require.Len(t, lines, 2, logs.String())
	require.Contains(t, lines[1], "not_logged_since_last_line=5", lines[1])

	logged := logs.String()
	require.NotContains(t, logged, `msg="resolve community"`, logged)
	require.NotContains(t, logged, "database unreachable", "a refused login is no outage")
}
