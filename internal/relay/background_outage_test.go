package relay_test

import (
	"context"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/buzzrelay/buzz/internal/community"
	"github.com/buzzrelay/buzz/internal/config"
	"github.com/buzzrelay/buzz/internal/db"
	"github.com/buzzrelay/buzz/internal/dbtest"
	"github.com/buzzrelay/buzz/internal/logtest"
	"github.com/buzzrelay/buzz/internal/outbox"
	"github.com/buzzrelay/buzz/internal/relay"
	"github.com/buzzrelay/buzz/internal/relaytest"
)

// startBackgroundLoops starts a relay's workflow scheduler and worker and
// its events statistics check, each ticking every 5 ms, and returns the
// relay and its log; all stop when the test ends.
func startBackgroundLoops(t *testing.T, pool *pgxpool.Pool) (*relay.Server, *logtest.Buffer) {
	t.Helper()
	logs := &logtest.Buffer{}
	cfg := config.Default()
	cfg.WorkflowPoll = 5 * time.Millisecond
	cfg.EventsAnalyzeInterval = 5 * time.Millisecond
	srv := relay.New(cfg, pool, slog.New(slog.NewTextHandler(logs, nil)))
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(func() {
		cancel()
		shutdown, done := context.WithTimeout(context.Background(), 5*time.Second)
		defer done()
		_ = srv.Shutdown(shutdown)
	})
	require.NoError(t, srv.StartWorkflows(ctx))
	go srv.KeepEventStatistics(ctx)
	return srv, logs
}

// While the database is unreachable the workflow scheduler's and worker's
// loops and the events statistics check fail on every tick; the process's
// log says so once when the outage starts and once when it ends, with its
// duration and the failures counted, as for requests, not a line per
// failed tick (about five a second per process before). The database is
// taken away for real and let in again.
// Mutations killed (one at a time): the scheduler's tick, approval expiry
// or history retention, the worker's poll, or the statistics check logging
// its failure without the outage log (its line appears during the
// outage).
func TestBackgroundLoopsLogADatabaseOutageOnce(t *testing.T) {
	t.Parallel()
	databaseURL := dbtest.URL(t)
	pool := dbtest.PoolOn(t, databaseURL, 4)
	srv, logs := startBackgroundLoops(t, pool)
	takeAway, bringBack := databaseOutage(t, databaseURL)

	perTick := []string{
		"workflow schedule tick failed", "workflow approval expiry failed", "workflow history retention failed",
		"workflow run poll failed", "events statistics check",
	}
	loggedPerTick := func() bool {
		logged := logs.String()
		for _, line := range perTick {
			if strings.Contains(logged, `msg="`+line) {
				return true
			}
		}
		return false
	}
	takeAway()
	// Many failed ticks counted, or one logged on its own.
	require.Eventually(t, func() bool {
		_, ticks := srv.OutageFailures()
		return ticks >= 30 || loggedPerTick()
	}, relaytest.Patience, time.Millisecond)
	bringBack()
	require.Eventually(t, func() bool { return strings.Contains(logs.String(), "database reachable again") },
		relaytest.Patience, 10*time.Millisecond)

	logged := logs.String()
	for _, line := range perTick {
		require.NotContains(t, logged, `msg="`+line, logged)
	}
	require.Equal(t, 1, strings.Count(logged, "database unreachable"), logged)
	require.Equal(t, 1, strings.Count(logged, "database reachable again"), logged)
	require.Contains(t, logged, "down_for=", logged)
}

// The line that ends an outage counts the client requests that failed
// apart from the background loops' ticks, which fail about five times a
// second whether or not any client is about: after an outage no client
// saw it says failed_requests=0, after one with three requests exactly 3,
// and the ticks in failed_background_ticks either way. Two real outages,
// the database taken away and let in again.
// Mutations killed (one at a time): a background loop (the scheduler's
// tick, say, or the statistics check) counted as a request
// (failed_requests above 0 after the quiet outage); requests counted as
// ticks (failed_requests=0 after the busy one); the count not reset
// between outages.
func TestOutageEndLineCountsClientRequestsApartFromBackgroundTicks(t *testing.T) {
	t.Parallel()
	databaseURL := dbtest.URL(t)
	pool := dbtest.PoolOn(t, databaseURL, 4)
	srv, logs := startBackgroundLoops(t, pool)
	hs := httptest.NewServer(srv.HTTPServer().Handler)
	t.Cleanup(hs.Close)
	_, err := db.New(pool).CommunityCreate(t.Context(), community.NormalizeHost(hs.Listener.Addr().String()))
	require.NoError(t, err)
	takeAway, bringBack := databaseOutage(t, databaseURL)

	// outage takes the database away, lets clientRequests requests fail
	// and the loops tick a while, brings it back and returns the line that
	// ended it.
	outage := func(ended, clientRequests int) string {
		takeAway()
		for range clientRequests {
			resp, err := http.Get(hs.URL + "/") // its host lookup fails
			require.NoError(t, err)
			resp.Body.Close()
			require.Equal(t, http.StatusServiceUnavailable, resp.StatusCode)
		}
		require.Eventually(t, func() bool {
			_, ticks := srv.OutageFailures()
			return ticks >= 30
		}, relaytest.Patience, time.Millisecond)
		bringBack()
		var lines []string
		require.Eventually(t, func() bool {
			lines = nil
			for line := range strings.SplitSeq(logs.String(), "\n") {
				if strings.Contains(line, `msg="database reachable again"`) {
					lines = append(lines, line)
				}
			}
			return len(lines) == ended
		}, relaytest.Patience, 10*time.Millisecond)
		return lines[ended-1]
	}
	ticked := regexp.MustCompile(`failed_background_ticks=[1-9][0-9]`)

	quiet := outage(1, 0)
	require.Contains(t, quiet, " failed_requests=0 ", quiet)
	require.Regexp(t, ticked, quiet)

	busy := outage(2, 3)
	require.Contains(t, busy, " failed_requests=3 ", busy)
	require.Regexp(t, ticked, busy)
}

// The operator-listener outbox worker polls every 2 s after a failed poll;
// while the database is unreachable each poll failed with an ERROR line of
// its own, one per pod every 2 s for the whole outage, under the outage's
// one line. Its failed polls are counted into the outage as the other
// background loops' ticks are: the log says the outage began (with the
// poll as its first failure) and ended, and no poll's line in between.
// The database is taken away for real and let in again.
// Mutation killed: the poll's failure logged without the outage log (its
// ERROR line appears, and no tick is counted).
func TestOutboxPollLogsADatabaseOutageOnce(t *testing.T) {
	t.Parallel()
	databaseURL := dbtest.URL(t)
	pool := dbtest.PoolOn(t, databaseURL, 4)
	hs, logs, srv := relayLoggingTo(t, pool)
	startOperatorListenerPolls(t, pool, hs, srv)
	takeAway, bringBack := databaseOutage(t, databaseURL)

	takeAway()
	// Nothing else of this relay ticks: two ticks are two failed polls
	// (claimErrorSleep apart), or a poll logged on its own.
	require.Eventually(t, func() bool {
		_, ticks := srv.OutageFailures()
		return ticks >= 2 || strings.Contains(logs.String(), "outbox poll failed")
	}, relaytest.Patience, 10*time.Millisecond)
	require.NotContains(t, logs.String(), "outbox poll failed", logs.String())
	bringBack()
	require.Eventually(t, func() bool { return strings.Contains(logs.String(), "database reachable again") },
		relaytest.Patience, 10*time.Millisecond)

	logged := logs.String()
	require.NotContains(t, logged, "outbox poll failed", logged)
	require.Equal(t, 1, strings.Count(logged, "database unreachable"), logged)
	require.Contains(t, logged, `first_failure="operator-listener outbox poll"`, logged)
	require.Regexp(t, regexp.MustCompile(`failed_requests=0 failed_background_ticks=([2-9]|[1-9][0-9]+)\b`), logged)
}

// startOperatorListenerPolls starts srv's operator-listener outbox poll for
// the community hs serves, with one listener nobody reaches, until the test
// ends.
func startOperatorListenerPolls(t *testing.T, pool *pgxpool.Pool, hs *httptest.Server, srv *relay.Server) {
	t.Helper()
	home, err := db.New(pool).CommunityByHost(t.Context(), community.NormalizeHost(hs.Listener.Addr().String()))
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	require.NoError(t, srv.StartOperatorListeners(ctx, outbox.Config{
		Listeners: outbox.Routes{relaytest.NewKey(t).PublicKeyHex(): "https://listener.invalid/wake"},
		Timeout:   5 * time.Second,
		IdlePoll:  100 * time.Millisecond,
	}, home.ID))
}

// A failed poll that is no outage (the claim's statement refused by a
// database that answers: here its table is gone, as when the code and the
// schema do not match) is the relay's own fault, not the database's reach:
// the outage log leaves it to the worker, which logs it as an ERROR, and
// no outage begins. Wiring the worker into the outage log must not make
// such a failure quiet.
// Mutation killed: the outage log taking any error as the database
// unreachable (no poll line; "database unreachable" logged instead).
func TestOutboxPollFailureThatIsNoOutageIsStillLogged(t *testing.T) {
	t.Parallel()
	pool := dbtest.PoolOn(t, dbtest.URL(t), 4)
	hs, logs, srv := relayLoggingTo(t, pool)
	_, err := pool.Exec(t.Context(), "ALTER TABLE operator_listener_outbox RENAME TO operator_listener_outbox_gone")
	require.NoError(t, err)
	startOperatorListenerPolls(t, pool, hs, srv)

	require.Eventually(t, func() bool { return strings.Contains(logs.String(), `msg="operator-listener outbox poll failed"`) },
		relaytest.Patience, 10*time.Millisecond, logs.String())
	logged := logs.String()
	require.Contains(t, logged, "SQLSTATE 42P01", logged)
	require.NotContains(t, logged, "database unreachable", logged)
	_, ticks := srv.OutageFailures()
	require.Zero(t, ticks)
}
