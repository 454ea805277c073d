package main

import (
	"context"
	"net/url"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/buzzrelay/buzz/internal/dbtest"
	"github.com/buzzrelay/buzz/internal/nostr"
)

// A relay process whose clock disagrees with the database's (skew between
// hosts, or the database host's clock stepped forward) still delays a run
// and expires an approval by the durations its definition names: both due
// times are on the database's clock, the one the claim and the expiry
// sweep compare them with. The database runs ten minutes ahead here: the
// relay's connections find a now() that adds ten minutes ahead of
// pg_catalog's on their search_path.
//
// Mutation killed: run_at or expires_at computed from the relay's clock.
// The 300 s delay then ended ten minutes before it began, so the run was
// claimed again at once and completed, and the one-hour approval expired
// fifty minutes early.
func TestDelayAndApprovalAreTimedOnTheDatabaseClock(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	bin := buildRelay(t)
	databaseURL := dbtest.URL(t)
	pool := observerPool(t, databaseURL)
	_, err := pool.Exec(ctx, `
		CREATE SCHEMA skew;
		CREATE FUNCTION skew.now() RETURNS timestamptz LANGUAGE plpgsql STABLE AS
		$$BEGIN RETURN pg_catalog.now() + interval '10 minutes'; END$$`)
	require.NoError(t, err)
	u, err := url.Parse(withAppName(t, databaseURL, "skewed"))
	require.NoError(t, err)
	q := u.Query()
	q.Set("search_path", "skew,pg_catalog,public")
	u.RawQuery = q.Encode()

	p := startRelayProcess(t, bin, "skewed", map[string]string{
		"BUZZ_DATABASE_URL":  u.String(),
		"BUZZ_WORKFLOW_POLL": "100ms",
	})
	owner := p.client(t, nil)
	channel := newChannel(t, owner, "later")
	delayed := saveWorkflow(t, owner, channel, "name: Later\ntrigger: {on: message_posted}\nsteps:\n"+
		"  - {id: wait, action: delay, duration: 300s}\n"+
		"  - {id: say, action: send_message, text: 'five minutes on'}\n")
	asked := saveWorkflow(t, owner, channel, "name: Ask\ntrigger: {on: message_posted}\nsteps:\n"+
		"  - {id: ask, action: request_approval, message: 'ok?', timeout: 1h}\n")
	ok := owner.Publish(owner.Sign(9, "go", nostr.Tags{{"h", channel}}, 0))
	require.True(t, ok.OK, ok.Msg)

	var status string
	var dueIn time.Duration
	require.Eventually(t, func() bool {
		return pool.QueryRow(ctx, `
			SELECT status, run_at - skew.now() FROM workflow_runs
			WHERE workflow_id = $1 AND current_step = 1 AND status <> 'running'`, delayed).Scan(&status, &dueIn) == nil
	}, 60*time.Second, 20*time.Millisecond, "the delay step parks the run")
	require.Equal(t, "pending", status, "the run waits out its delay")
	require.Greater(t, dueIn, 290*time.Second, "due 300 s after it parked, on the database's clock")

	var expiresIn time.Duration
	require.Eventually(t, func() bool {
		return pool.QueryRow(ctx, `
			SELECT a.expires_at - skew.now() FROM workflow_approvals a WHERE a.workflow_id = $1`, asked).Scan(&expiresIn) == nil
	}, 60*time.Second, 20*time.Millisecond, "the approval is requested")
	require.Greater(t, expiresIn, 59*time.Minute, "expires an hour after it was asked, on the database's clock")
}
