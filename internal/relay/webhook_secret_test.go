package relay_test

import (
	"context"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/buzzrelay/buzz/internal/relaytest"
)

// A webhook secret sent as ?secret= (right, wrong, or to a workflow it does
// not belong to) is never repeated: not in an answer, not in the metrics,
// not in the run the call started, its trace or the events its steps
// stored. Only the workflow row holds it.
func TestWebhookSecretInTheURLIsNotRepeated(t *testing.T) {
	t.Parallel()
	r := relaytest.Start(t)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	require.NoError(t, r.Server.StartWorkflows(ctx))
	owner := r.Dial(t, "")
	owner.Auth(nil)
	ch := createChannel(t, owner, "secret-hooks", false)
	wf, secret := saveWebhookWorkflow(t, owner, ch, "[{id: tell, action: send_message, text: 'got {{trigger.n}}'}]")
	require.NotEmpty(t, secret)

	var seen []string
	call := func(path, body string) int {
		resp, err := http.Post(r.HTTPURL+path, "application/json", strings.NewReader(body))
		require.NoError(t, err)
		defer resp.Body.Close()
		raw, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		seen = append(seen, string(raw))
		for _, values := range resp.Header {
			seen = append(seen, values...)
		}
		return resp.StatusCode
	}
	require.Equal(t, http.StatusAccepted, call("/hooks/"+wf+"?secret="+secret, `{"n":"1"}`))
	require.Equal(t, http.StatusUnauthorized, call("/hooks/"+wf+"?secret=x"+secret, `{}`))
	require.Equal(t, http.StatusUnauthorized, call("/hooks/"+uuid.NewString()+"?secret="+secret, `{}`))
	require.Equal(t, http.StatusBadRequest, call("/hooks/"+wf+"?secret="+secret, `[1]`))
	require.Equal(t, http.StatusBadRequest, call("/hooks/nope?secret="+secret, `{}`))
	require.Equal(t, http.StatusNotFound, call("/nope?secret="+secret, ``))

	require.Eventually(t, func() bool {
		var done int
		require.NoError(t, r.Pool.QueryRow(ctx, `SELECT count(*) FROM workflow_runs WHERE status = 'completed'`).Scan(&done))
		return done == 1
	}, relaytest.Patience, 10*time.Millisecond)

	resp, err := http.Get(r.MetricsURL + "/metrics")
	require.NoError(t, err)
	metrics, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.NoError(t, err)
	seen = append(seen, string(metrics))
	var runs, events, approvals string
	require.NoError(t, r.Pool.QueryRow(ctx, `SELECT coalesce(json_agg(r)::text, '') FROM workflow_runs r`).Scan(&runs))
	require.NoError(t, r.Pool.QueryRow(ctx, `SELECT coalesce(json_agg(e)::text, '') FROM events e WHERE kind <> 30620`).Scan(&events))
	require.NoError(t, r.Pool.QueryRow(ctx, `SELECT coalesce(json_agg(a)::text, '') FROM workflow_approvals a`).Scan(&approvals))
	require.Contains(t, events, "got 1", "the run stored its message")
	seen = append(seen, runs, events, approvals)
	for _, text := range seen {
		require.NotContains(t, text, secret)
	}
}
