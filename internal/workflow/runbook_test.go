package workflow_test

import (
	"net/url"
	"os"
	"os/exec"
	"regexp"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/buzzrelay/buzz/internal/clock"
	"github.com/buzzrelay/buzz/internal/dbtest"
	"github.com/buzzrelay/buzz/internal/ingest"
	"github.com/buzzrelay/buzz/internal/nostr"
	"github.com/buzzrelay/buzz/internal/workflow"
)

// The operator runbook runs as written under psql and shows a failed run
// by its code, an expired lease, a pending approval, claimed schedule
// slots and a workflow whose definition expired among those that fire
// nothing (mutation killed: section 6 without the expiration lists it not).
func TestWorkflowsRunbook(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	owner := f.key()
	ch := f.channel(owner)
	dm := uuid.NewString()
	f.save(owner, ch, dm, "name: DM\ntrigger: {on: message_posted}\nsteps: [{id: a, action: send_dm, to: x, text: hi}]")
	f.store(f.sign(owner, ingest.KindChat, "go", nostr.Tags{{"h", ch}}))
	f.drain(f.engine(time.Minute))
	_, _ = f.approvalRun(owner, ch, "any")
	f.store(f.sign(owner, ingest.KindChat, "again", nostr.Tags{{"h", ch}}))
	claims, err := f.engine(time.Second).ClaimDue(f.ctx, 10)
	require.NoError(t, err)
	require.NotEmpty(t, claims)
	_, err = f.pool.Exec(f.ctx, `UPDATE workflow_runs SET lease_until = now() - interval '1 minute' WHERE status = 'running'`)
	require.NoError(t, err)
	// The schedule was saved three minutes ago, by the wall clock psql's
	// now() reads: three slots are due since.
	tick := uuid.NewString()
	f.clock.now = time.Now().Truncate(time.Minute).Add(-3 * time.Minute)
	f.save(owner, ch, tick, "name: T\ntrigger: {on: schedule, interval: 60s}\nsteps: [{id: a, action: delay, duration: 1s}]")
	f.clock.now = time.Now().Truncate(time.Second)
	_, err = workflow.NewScheduler(f.pool, clock.Stub(f.clock.Now), 3*time.Minute, nil, nil).Tick(f.ctx)
	require.NoError(t, err)

	// A definition whose expiration passed fires nothing: section 6 lists it.
	expired := uuid.NewString()
	f.save(owner, ch, expired, "name: E\ntrigger: {on: message_posted}\nsteps: [{id: a, action: send_message, text: x}]")
	_, err = f.pool.Exec(f.ctx, `UPDATE workflows SET definition_expires_at = now() - interval '1 minute' WHERE id = $1`, expired)
	require.NoError(t, err)

	dbURL := f.pool.Config().ConnString()
	pu, err := url.Parse(dbURL)
	require.NoError(t, err)
	q := pu.Query()
	tz := q.Get("timezone")
	q.Del("timezone")
	pu.RawQuery = q.Encode()
	cmd := exec.Command(dbtest.PsqlPath(t), "-X", "-v", "ON_ERROR_STOP=1", "-f", "../../sql/runbooks/workflows.sql", pu.String())
	cmd.Env = append(os.Environ(), "PGTZ="+tz)
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "%s", out)
	text := string(out)
	require.Regexp(t, regexp.MustCompile(`failed\s*\|\s*action_not_implemented\s*\|\s*\d+\s*\|`), text)
	require.Regexp(t, regexp.MustCompile(`waiting_approval\s*\|\s*-\s*\|\s*1\s*\|`), text)
	// Expired a minute ago, plus however long psql took to start.
	require.Regexp(t, regexp.MustCompile(`\|\s*00:01:\d\d\s*\n`), text, "the expired leases")
	require.Regexp(t, regexp.MustCompile(`\|\s*any\s*\|`), text)
	require.Regexp(t, regexp.MustCompile(tick+`\s*\|\s*60s\s*\|\s*\|\s*3\s*\|\s*3\s*\|`), text)
	require.Regexp(t, regexp.MustCompile(expired+`\s*\|\s*E\s*\|\s*active\s*\|\s*t\s*\|\s*f\s*\|\s*\d{4}-`), text, "the expired workflow")
}
