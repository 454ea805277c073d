package relay_test

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/buzzrelay/buzz/internal/config"
	"github.com/buzzrelay/buzz/internal/dbtest"
	"github.com/buzzrelay/buzz/internal/logtest"
	"github.com/buzzrelay/buzz/internal/relay"
	"github.com/buzzrelay/buzz/internal/relaytest"
)

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
	require.Eventually(t, func() bool { return srv.OutageFailures() >= 30 || loggedPerTick() },
		relaytest.Patience, time.Millisecond)
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
