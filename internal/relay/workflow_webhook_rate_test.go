package relay_test

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/buzzrelay/buzz/internal/config"
	"github.com/buzzrelay/buzz/internal/nostr"
	"github.com/buzzrelay/buzz/internal/relaytest"
)

// A webhook call starts a run on its workflow owner's authority, and each
// run is a row kept for BUZZ_WORKFLOW_RUN_RETENTION (30 days) whose steps
// make the relay store events; at the unfinished-run bound a call still
// records a failed run. Any member may create a channel and save a webhook
// workflow there, and nothing but a read slot bounded the calls: a member
// holding a secret made the relay write rows and events as fast as HTTP
// carried the calls, where their own messages take their publish rate. A
// call therefore takes one token of the owner's publish rate, as a message
// or a media upload of theirs does; past it the call is answered 429
// rate-limited with Retry-After, and creates nothing.
//
// Mutations killed: Webhooks without its owner rate check (Allow left nil)
// admits all 12 calls, 12 runs; the check moved before the secret's lets
// the ten calls with a wrong secret spend the owner's tokens.
func TestWebhookCallsTakeTheOwnersPublishRate(t *testing.T) {
	t.Parallel()
	r := relaytest.Start(t, func(c *config.Config) { c.PublishBurst, c.PublishPerMinute = 6, 1 })
	owner := r.Dial(t, "")
	owner.Auth(nil)
	// The channel and the save take a token each.
	ch := createChannel(t, owner, "hooks", false)
	wf, secret := saveWebhookWorkflow(t, owner, ch, "[{id: ask, action: request_approval, message: ok?}]")

	call := func(secret string) (int, string, map[string]string) {
		req, err := http.NewRequest(http.MethodPost, r.HTTPURL+"/hooks/"+wf, strings.NewReader(`{}`))
		require.NoError(t, err)
		req.Header.Set("X-Webhook-Secret", secret)
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		defer resp.Body.Close()
		var out map[string]string
		require.NoError(t, json.NewDecoder(resp.Body).Decode(&out))
		return resp.StatusCode, resp.Header.Get("Retry-After"), out
	}
	// A stranger without the secret spends none of the owner's rate.
	for i := 0; i < 10; i++ {
		status, _, _ := call("wrong")
		require.Equal(t, http.StatusUnauthorized, status)
	}
	accepted := 0
	for i := 0; i < 12; i++ {
		status, retry, out := call(secret)
		if status == http.StatusAccepted {
			accepted++
			continue
		}
		require.Equal(t, http.StatusTooManyRequests, status, "call %d: %v", i, out)
		require.True(t, strings.HasPrefix(out["error"], "rate-limited: "), "call %d: %v", i, out)
		require.Empty(t, out["run_id"], "a refused call names no run")
		require.NotEmpty(t, retry)
	}
	require.Equal(t, 4, accepted, "the four tokens the channel and the save left")
	var runs int
	require.NoError(t, r.Pool.QueryRow(context.Background(), `SELECT count(*) FROM workflow_runs WHERE workflow_id = $1`, wf).Scan(&runs))
	require.Equal(t, 4, runs, "a refused call creates no run")

	// The owner's own messages share the bucket: it is spent.
	ok := owner.Publish(owner.Sign(9, "hello", nostr.Tags{{"h", ch}}, 0))
	require.False(t, ok.OK)
	require.True(t, strings.HasPrefix(ok.Msg, "rate-limited: "), ok.Msg)
}
