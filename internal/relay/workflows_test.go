package relay_test

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/buzzrelay/buzz/internal/config"
	"github.com/buzzrelay/buzz/internal/nostr"
	"github.com/buzzrelay/buzz/internal/relaytest"
)

// Over a real WebSocket: a saved definition answers with its workflow id, a
// message in the channel wakes the relay's worker, which posts the
// relay-signed doorbell into the channel; the manual command answers with
// the run id. Mutation killed: a relay that does not register workflows
// (registerWorkflows removed) stores the 30620 without a reply and never
// posts the doorbell.
func TestWorkflowOverWebSocket(t *testing.T) {
	t.Parallel()
	r := relaytest.Start(t)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	r.Server.StartWorkflows(ctx)
	owner := r.Dial(t, "")
	owner.Auth(nil)
	ch := createChannel(t, owner, "ops", false)

	wf := uuid.NewString()
	ok := owner.Publish(owner.Sign(30620, "name: Ping\ntrigger: {on: message_posted}\nsteps: [{id: ping, action: send_message, text: 'pong {{trigger.text}}'}]",
		nostr.Tags{{"d", wf}, {"h", ch}}, 0))
	require.True(t, ok.OK, ok.Msg)
	require.Equal(t, `response:{"workflow_id":"`+wf+`"}`, ok.Msg)

	ok = owner.Publish(owner.Sign(9, "hello", nostr.Tags{{"h", ch}}, 0))
	require.True(t, ok.OK, ok.Msg)
	var bell *nostr.Event
	require.Eventually(t, func() bool {
		for _, ev := range owner.Req("bells", map[string]any{"kinds": []int{9}, "#h": []string{ch}}) {
			if ev.Content == "pong hello" {
				bell = ev
				return true
			}
		}
		return false
	}, 30*time.Second, 50*time.Millisecond)
	require.NoError(t, bell.Verify())
	require.NotEqual(t, owner.Key.PublicKeyHex(), bell.PubKey, "signed by the relay")
	require.Contains(t, bell.Tags, nostr.Tag{"buzz:workflow", "doorbell-v1"})

	ok = owner.Publish(owner.Sign(46020, "", nostr.Tags{{"d", wf}}, 0))
	require.True(t, ok.OK, ok.Msg)
	require.True(t, strings.HasPrefix(ok.Msg, `response:{"run_id":"`), ok.Msg)
}

// POST /hooks/{id} over real HTTP: the bad-input catalogue (bad UUID, no or
// wrong secret, unknown workflow, malformed JSON, oversize body) answers
// with a status and JSON error and creates nothing; a good call answers 202
// with the run id, the same Idempotency-Key returns the same run, and the
// doorbell carries the fields only in its workflow-cargo tag.
//
// Mutations killed: skipping the secret comparison lets "wrong secret" in;
// ignoring the Idempotency-Key gives a second run id.
func TestWorkflowWebhookEndpoint(t *testing.T) {
	t.Parallel()
	r := relaytest.Start(t, func(c *config.Config) { c.WebhookMaxBytes = 1024 })
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	r.Server.StartWorkflows(ctx)
	owner := r.Dial(t, "")
	owner.Auth(nil)
	ch := createChannel(t, owner, "hooks", false)
	wf := uuid.NewString()
	ok := owner.Publish(owner.Sign(30620, "name: Hook\ntrigger: {on: webhook}\nsteps: [{id: tell, action: send_message, text: 'deploy finished'}]",
		nostr.Tags{{"d", wf}, {"h", ch}}, 0))
	require.True(t, ok.OK, ok.Msg)
	var saved struct {
		WebhookSecret string `json:"webhook_secret"`
	}
	require.NoError(t, json.Unmarshal([]byte(strings.TrimPrefix(ok.Msg, "response:")), &saved))
	require.NotEmpty(t, saved.WebhookSecret)

	post := func(path, secret, key, body string) (int, map[string]string) {
		req, err := http.NewRequest(http.MethodPost, r.HTTPURL+path, strings.NewReader(body))
		require.NoError(t, err)
		if secret != "" {
			req.Header.Set("X-Webhook-Secret", secret)
		}
		if key != "" {
			req.Header.Set("Idempotency-Key", key)
		}
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		defer resp.Body.Close()
		var out map[string]string
		require.NoError(t, json.NewDecoder(resp.Body).Decode(&out))
		return resp.StatusCode, out
	}
	for _, c := range []struct {
		name, path, secret, body string
		status                   int
		msg                      string
	}{
		{"bad UUID", "/hooks/nope", saved.WebhookSecret, "", 400, "invalid workflow UUID"},
		{"no secret", "/hooks/" + wf, "", "", 401, "authentication failed"},
		{"wrong secret", "/hooks/" + wf, "x" + saved.WebhookSecret, "", 401, "authentication failed"},
		{"unknown workflow", "/hooks/" + uuid.NewString(), saved.WebhookSecret, "", 401, "authentication failed"},
		{"malformed JSON", "/hooks/" + wf, saved.WebhookSecret, "{not json", 400, "invalid JSON body: must be a JSON object"},
		{"not an object", "/hooks/" + wf, saved.WebhookSecret, "[1]", 400, "invalid JSON body: must be a JSON object"},
		{"oversize", "/hooks/" + wf, saved.WebhookSecret, `{"a":"` + strings.Repeat("x", 1100) + `"}`, 413, "body larger than 1024 bytes"},
	} {
		status, out := post(c.path, c.secret, "", c.body)
		require.Equal(t, c.status, status, c.name)
		require.Equal(t, c.msg, out["error"], c.name)
	}
	var runs int
	require.NoError(t, r.Pool.QueryRow(ctx, `SELECT count(*) FROM workflow_runs`).Scan(&runs))
	require.Zero(t, runs, "bad calls create nothing")

	status, first := post("/hooks/"+wf+"?secret=ignored", saved.WebhookSecret, "delivery-1", `{"env":"prod","n":3}`)
	require.Equal(t, http.StatusAccepted, status)
	require.Equal(t, "pending", first["status"])
	require.Equal(t, wf, first["workflow_id"])
	status, again := post("/hooks/"+wf, saved.WebhookSecret, "delivery-1", `{"env":"prod","n":3}`)
	require.Equal(t, http.StatusAccepted, status)
	require.Equal(t, first["run_id"], again["run_id"], "same key, same run")

	var bell *nostr.Event
	require.Eventually(t, func() bool {
		for _, ev := range owner.Req("bells", map[string]any{"kinds": []int{9}, "#h": []string{ch}}) {
			if ev.Content == "deploy finished" {
				bell = ev
				return true
			}
		}
		return false
	}, 30*time.Second, 50*time.Millisecond)
	require.Contains(t, bell.Tags, nostr.Tag{"workflow-cause", "webhook", ""})
	require.Contains(t, bell.Tags, nostr.Tag{"workflow-cargo", `{"env":"prod","n":"3"}`})
}
