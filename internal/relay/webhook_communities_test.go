package relay_test

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/buzzrelay/buzz/internal/nostr"
	"github.com/buzzrelay/buzz/internal/relaytest"
)

// One signed workflow definition saved in two communities (same event,
// same workflow id, same channel id) is two workflows, each with its own
// secret: a webhook call reaches the workflow of the community its Host
// names, with that community's secret only, and starts a run there alone.
func TestWebhookReachesOnlyTheWorkflowOfItsHost(t *testing.T) {
	t.Parallel()
	r := relaytest.Start(t)
	bID := r.AddCommunity(t, "b.example")
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	require.NoError(t, r.Server.StartWorkflows(ctx))
	key := relaytest.NewKey(t)
	inA, inB := r.Dial(t, ""), r.Dial(t, "b.example")
	inA.Auth(key)
	inB.Auth(key)
	ch := createChannel(t, inA, "hooks", false)
	require.True(t, inB.Publish(inB.Sign(9007, "", nostr.Tags{{"h", ch}, {"name", "hooks"}}, 0)).OK)
	wf, secretA := saveWebhookWorkflow(t, inA, ch, "[{id: tell, action: send_message, text: 'got {{trigger.n}}'}]")
	def := inA.Req("def", map[string]any{"kinds": []int{30620}, "#d": []string{wf}})
	require.Len(t, def, 1)
	saved := inB.Publish(def[0])
	require.True(t, saved.OK, saved.Msg)
	secretB := webhookSecret(t, saved.Msg)
	require.NotEqual(t, secretA, secretB)

	call := func(host, secret string) int {
		req, err := http.NewRequest(http.MethodPost, r.HTTPURL+"/hooks/"+wf, strings.NewReader(`{"n":"1"}`))
		require.NoError(t, err)
		if host != "" {
			req.Host = host
		}
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("X-Webhook-Secret", secret)
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		resp.Body.Close()
		return resp.StatusCode
	}
	require.Equal(t, http.StatusUnauthorized, call("b.example", secretA), "A's secret at B's host")
	require.Equal(t, http.StatusUnauthorized, call("", secretB), "B's secret at A's host")
	require.Equal(t, http.StatusAccepted, call("b.example", secretB))

	runs := func() (inA, inB int) {
		require.NoError(t, r.Pool.QueryRow(ctx, `SELECT count(*) FILTER (WHERE community_id = $1), count(*) FILTER (WHERE community_id = $2) FROM workflow_runs`, r.CommunityID, bID).Scan(&inA, &inB))
		return inA, inB
	}
	require.Eventually(t, func() bool {
		var done int
		require.NoError(t, r.Pool.QueryRow(ctx, `SELECT count(*) FROM workflow_runs WHERE status = 'completed'`).Scan(&done))
		return done == 1
	}, relaytest.Patience, 10*time.Millisecond)
	a, b := runs()
	require.Equal(t, 0, a, "B's call started a run in A")
	require.Equal(t, 1, b)
	require.Empty(t, inA.Req("told", map[string]any{"kinds": []int{9}, "#h": []string{ch}}), "B's run posted in A's channel")
	require.Len(t, inB.Req("told", map[string]any{"kinds": []int{9}, "#h": []string{ch}}), 1)
}
