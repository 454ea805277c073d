package relay_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/buzzrelay/buzz/internal/config"
	"github.com/buzzrelay/buzz/internal/nostr"
	"github.com/buzzrelay/buzz/internal/relaytest"
)

// With BUZZ_WORKFLOW_MAX_UNFINISHED_RUNS = 1 and no worker running (runs
// stay queued), over a real WebSocket and HTTP: the second message's run,
// the manual command's run and the second webhook call's run are recorded
// failed with capacity_exceeded at once; the command's OK message and the
// webhook's 429 say so; /metrics counts each. Mutation killed: a relay
// that does not pass the setting (or the metrics) to its triggers and
// webhook handler queues every run.
func TestWorkflowCapacityOverTheWire(t *testing.T) {
	t.Parallel()
	r := relaytest.Start(t, func(c *config.Config) { c.WorkflowMaxUnfinishedRuns = 1 })
	ctx := context.Background()
	owner := r.Dial(t, "")
	owner.Auth(nil)
	ch := createChannel(t, owner, "busy", false)

	wf := uuid.NewString()
	ok := owner.Publish(owner.Sign(30620, "name: Busy\ntrigger: {on: message_posted}\nsteps: [{id: say, action: send_message, text: seen}]",
		nostr.Tags{{"d", wf}, {"h", ch}}, 0))
	require.True(t, ok.OK, ok.Msg)
	for _, text := range []string{"one", "two"} {
		ok = owner.Publish(owner.Sign(9, text, nostr.Tags{{"h", ch}}, 0))
		require.True(t, ok.OK, "a message is stored whatever its workflows' queues: %s", ok.Msg)
	}
	ok = owner.Publish(owner.Sign(46020, "", nostr.Tags{{"d", wf}}, 0))
	require.True(t, ok.OK, ok.Msg)
	require.Regexp(t, `^response:\{"run_id":"[0-9a-f-]{36}","status":"failed","error_code":"capacity_exceeded"\}$`, ok.Msg)

	hook, secret := saveWebhookWorkflow(t, owner, ch, "[{id: say, action: send_message, text: hooked}]")
	post := func() (int, map[string]string) {
		req, err := http.NewRequest(http.MethodPost, r.HTTPURL+"/hooks/"+hook, strings.NewReader(`{}`))
		require.NoError(t, err)
		req.Header.Set("X-Webhook-Secret", secret)
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		defer resp.Body.Close()
		var out map[string]string
		require.NoError(t, json.NewDecoder(resp.Body).Decode(&out))
		return resp.StatusCode, out
	}
	status, _ := post()
	require.Equal(t, http.StatusAccepted, status)
	status, refused := post()
	require.Equal(t, http.StatusTooManyRequests, status)
	require.Equal(t, "capacity_exceeded", refused["error_code"])

	var pending, failed int
	require.NoError(t, r.Pool.QueryRow(ctx, `SELECT count(*) FILTER (WHERE status = 'pending'),
		count(*) FILTER (WHERE status = 'failed' AND error_code = 'capacity_exceeded') FROM workflow_runs`).Scan(&pending, &failed))
	require.Equal(t, 2, pending, "one queued run per workflow")
	require.Equal(t, 3, failed)

	resp, err := http.Get(r.MetricsURL + "/metrics")
	require.NoError(t, err)
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	require.Contains(t, string(body), `buzz_workflow_runs_total{error_code="capacity_exceeded",outcome="failed"} 3`)
}
