package outbox

import (
	"context"
	"net/url"
	"os"
	"os/exec"
	"regexp"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/buzzrelay/buzz/internal/dbtest"
)

// The operator runbook runs as written under psql against a database with a
// backlog, and its answers show that backlog.
func TestListenerOutboxRunbook(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dbURL := dbtest.URL(t)
	pool, err := pgxpool.New(ctx, dbURL)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	f := fixtureOn(t, pool)

	listener := newPubkey(t)
	targets := make([]string, 5)
	for i := range targets {
		targets[i] = newPubkey(t)
	}
	f.register(listener, targets...)
	ids := f.enqueue(targets...)
	// The poll claims in id order among rows enqueued together: ids[0] and
	// ids[1] (RETURNING lists them in no particular order).
	claims, err := f.claimer(Routes{listener: "https://l.example"}).claimDue(ctx, 2, nil)
	require.NoError(t, err)
	require.ElementsMatch(t, ids[:2], idsOf(claims))
	expiredClaim, _ := f.row(ids[0])
	f.exec(`UPDATE operator_listener_outbox SET lease_until = now() - interval '1 minute' WHERE id = $1`, ids[0])
	f.exec(`UPDATE operator_listener_outbox SET attempts = 3, next_attempt_at = now() + interval '4 seconds' WHERE id = $1`, ids[2])

	// libpq does not know the test URL's timezone parameter: pass it as PGTZ.
	u, err := url.Parse(dbURL)
	require.NoError(t, err)
	q := u.Query()
	tz := q.Get("timezone")
	q.Del("timezone")
	u.RawQuery = q.Encode()

	cmd := exec.Command(dbtest.PsqlPath(t), "-X", "-v", "ON_ERROR_STOP=1", "-f", "../../sql/runbooks/listener_outbox.sql", u.String())
	cmd.Env = append(os.Environ(), "PGTZ="+tz)
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "%s", out)
	text := string(out)

	// 1. backlog: 3 pending (2 due now), 2 sending.
	require.Regexp(t, regexp.MustCompile(listener+`\s*\|\s*3\s*\|\s*2\s*\|\s*2\s*\|`), text)
	// 2. due rows per listener and community: the 2 pending ones.
	require.Regexp(t, regexp.MustCompile(listener+`\s*\|\s*`+f.community.String()+`\s*\|\s*2\s*\|`), text)
	// 3. the expired lease.
	require.Regexp(t, regexp.MustCompile(ids[0].String()+`\s*\|\s*`+listener+`\s*\|\s*1\s*\|\s*`+expiredClaim.ClaimID.String()), text)
	// 4. the retried row.
	require.Regexp(t, regexp.MustCompile(ids[2].String()+`\s*\|\s*`+listener+`\s*\|\s*pending\s*\|\s*3\s*\|`), text)
	// 5. registrations: 5 targets, none expiring.
	require.Regexp(t, regexp.MustCompile(`(?m)`+listener+`\s*\|\s*5\s*\|.*\|\s*0\s*\|\s*0\s*$`), text)
}
