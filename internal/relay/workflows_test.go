package relay_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strconv"
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
	require.NoError(t, r.Server.StartWorkflows(ctx))
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
	require.Eventually(t, func() bool {
		resp, err := http.Get(r.MetricsURL + "/metrics")
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return strings.Contains(string(body), `buzz_workflow_runs_total{error_code="",outcome="completed"} 1`) &&
			strings.Contains(string(body), "buzz_workflow_run_seconds_count 1")
	}, 30*time.Second, 50*time.Millisecond, "the ended run is counted")

	ok = owner.Publish(owner.Sign(46020, "", nostr.Tags{{"d", wf}}, 0))
	require.True(t, ok.OK, ok.Msg)
	require.True(t, strings.HasPrefix(ok.Msg, `response:{"run_id":"`), ok.Msg)

	// A workflow's message is relay-signed but no moderation record: any
	// member's workflow can post, so moderators must be able to hide it.
	// Mutation killed: keeping every relay-signed event from 9005 refuses it.
	ok = owner.Publish(owner.Sign(9005, "", nostr.Tags{{"h", ch}, {"e", bell.ID}}, 0))
	require.True(t, ok.OK, ok.Msg)
	require.Empty(t, owner.Req("hidden", map[string]any{"ids": []string{bell.ID}}))
}

// A name tag overrides the YAML's name and is held to its rule: too long
// or blank is invalid, not a database failure answered "try again".
// Mutation killed: prepareDefinition without checkName on the tag.
func TestWorkflowNameTagIsChecked(t *testing.T) {
	t.Parallel()
	r := relaytest.Start(t)
	owner := r.Dial(t, "")
	owner.Auth(nil)
	ch := createChannel(t, owner, "ops", false)
	save := func(name string) relaytest.Reply {
		return owner.Publish(owner.Sign(30620, "name: Ping\ntrigger: {on: message_posted}\nsteps: [{id: ping, action: send_message, text: 'x'}]",
			nostr.Tags{{"d", uuid.NewString()}, {"h", ch}, {"name", name}}, 0))
	}
	got := save(strings.Repeat("n", 256))
	require.False(t, got.OK)
	require.Equal(t, "invalid: invalid definition: name tag: must be at most 255 bytes", got.Msg)
	got = save("   ")
	require.False(t, got.OK)
	require.Equal(t, "invalid: invalid definition: name tag: must not be blank", got.Msg)
	got = save(strings.Repeat("n", 255))
	require.True(t, got.OK, got.Msg)
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
	require.NoError(t, r.Server.StartWorkflows(ctx))
	owner := r.Dial(t, "")
	owner.Auth(nil)
	ch := createChannel(t, owner, "hooks", false)
	wf, secret := saveWebhookWorkflow(t, owner, ch, "[{id: tell, action: send_message, text: 'deploy finished'}]")

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
		{"bad UUID", "/hooks/nope", secret, "", 400, "invalid: the workflow id is not a UUID"},
		{"no secret", "/hooks/" + wf, "", "", 401, "auth-required: authentication failed"},
		{"wrong secret", "/hooks/" + wf, "x" + secret, "", 401, "auth-required: authentication failed"},
		{"unknown workflow", "/hooks/" + uuid.NewString(), secret, "", 401, "auth-required: authentication failed"},
		{"malformed JSON", "/hooks/" + wf, secret, "{not json", 400, "invalid: JSON body: must be a JSON object"},
		{"not an object", "/hooks/" + wf, secret, "[1]", 400, "invalid: JSON body: must be a JSON object"},
		{"oversize", "/hooks/" + wf, secret, `{"a":"` + strings.Repeat("x", 1100) + `"}`, 413, "invalid: body larger than 1024 bytes"},
	} {
		status, out := post(c.path, c.secret, "", c.body)
		require.Equal(t, c.status, status, c.name)
		require.Equal(t, c.msg, out["error"], c.name)
	}
	// A header may carry bytes past 0x7f that are no UTF-8; the key is
	// stored as text. Mutation killed: without the UTF-8 check the call
	// answers 503 "database unavailable".
	status, out := post("/hooks/"+wf, secret, "key-\xff\xfe", `{}`)
	require.Equal(t, http.StatusBadRequest, status)
	require.Equal(t, "invalid: Idempotency-Key must be valid UTF-8", out["error"])
	var runs int
	require.NoError(t, r.Pool.QueryRow(ctx, `SELECT count(*) FROM workflow_runs`).Scan(&runs))
	require.Zero(t, runs, "bad calls create nothing")

	status, first := post("/hooks/"+wf+"?secret=ignored", secret, "delivery-1", `{"env":"prod","n":3}`)
	require.Equal(t, http.StatusAccepted, status)
	require.Equal(t, "pending", first["status"])
	require.Equal(t, wf, first["workflow_id"])
	status, again := post("/hooks/"+wf, secret, "delivery-1", `{"env":"prod","n":3}`)
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

// getAuthed sends a NIP-98 signed GET for path on r as key.
func getAuthed(t *testing.T, r *relaytest.Relay, key *nostr.SecretKey, path string) (int, []byte) {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, r.HTTPURL+path, nil)
	require.NoError(t, err)
	if key != nil {
		req.Header.Set("Authorization", authHeader(nip98(t, key, "GET", r.HTTPURL+path, nil, nil)))
	}
	resp, err := bridgeHTTP.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, raw
}

// The run-history API pages newest first with a full-precision cursor:
// while a writer keeps inserting runs, a reader paging through sees every
// run that existed when it started exactly once, ties in created_at
// included. Parameter errors come before auth; a caller who cannot read
// the channel gets 403; approvals never carry a token field.
//
// Mutations killed: a cursor in whole seconds (or created_at alone) skips
// or repeats the rows that share a timestamp; a query that ignores the
// cursor repeats page one; dropping the channel check lets the outsider in.
func TestWorkflowRunHistoryPaging(t *testing.T) {
	t.Parallel()
	r := relaytest.Start(t)
	ctx := context.Background()
	owner := r.Dial(t, "")
	owner.Auth(nil)
	ch := createChannel(t, owner, "private-ops", true)
	wf := uuid.NewString()
	ok := owner.Publish(owner.Sign(30620, "name: H\ntrigger: {on: webhook}\nsteps: [{id: a, action: delay, duration: 1s}]",
		nostr.Tags{{"d", wf}, {"h", ch}}, 0))
	require.True(t, ok.OK, ok.Msg)
	insert := func(createdAt string) uuid.UUID {
		id := uuid.New()
		_, err := r.Pool.Exec(ctx, `INSERT INTO workflow_runs (community_id, id, workflow_id, created_at) VALUES ($1, $2, $3, `+createdAt+`)`,
			r.CommunityID, id, wf)
		require.NoError(t, err)
		return id
	}
	existing := map[uuid.UUID]bool{}
	for i := range 45 {
		// Groups of five share one timestamp, to the microsecond.
		existing[insert(`'2026-01-01T00:00:00Z'::timestamptz + interval '1 microsecond' * `+itoa(i/5))] = true
	}
	stop := make(chan struct{})
	writerDone := make(chan struct{})
	go func() {
		defer close(writerDone)
		for {
			select {
			case <-stop:
				return
			default:
				insert("now()")
			}
		}
	}()
	seen := map[uuid.UUID]int{}
	path := "/workflows/" + wf + "/runs?limit=7"
	for pages := 0; ; pages++ {
		require.Less(t, pages, 100)
		status, raw := getAuthed(t, r, owner.Key, path)
		require.Equal(t, http.StatusOK, status, "%s", raw)
		var page struct {
			Runs []struct {
				ID string `json:"id"`
			} `json:"runs"`
			Next *struct {
				Before   string `json:"before"`
				BeforeID string `json:"before_id"`
			} `json:"next"`
		}
		require.NoError(t, json.Unmarshal(raw, &page))
		for _, run := range page.Runs {
			seen[uuid.MustParse(run.ID)]++
		}
		if page.Next == nil {
			break
		}
		path = "/workflows/" + wf + "/runs?limit=7&before=" + url.QueryEscape(page.Next.Before) + "&before_id=" + page.Next.BeforeID
	}
	close(stop)
	<-writerDone
	for id := range existing {
		require.Equal(t, 1, seen[id], "run %s seen once", id)
	}
	for id, n := range seen {
		require.Equal(t, 1, n, "run %s seen once", id)
	}

	for _, c := range []struct {
		path, msg string
	}{
		{"/workflows/" + wf + "/runs?before=2026-01-01T00:00:00Z", "before and before_id must be supplied together"},
		{"/workflows/" + wf + "/runs?limit=0", "limit must be between 1 and 100"},
		{"/workflows/" + wf + "/runs?limit=101", "limit must be between 1 and 100"},
	} {
		status, raw := getAuthed(t, r, nil, c.path)
		require.Equal(t, http.StatusBadRequest, status)
		require.Contains(t, string(raw), c.msg)
	}
	// Someone who cannot read the private channel gets exactly what an
	// unknown workflow id gets, so the answer does not confirm that it
	// exists. Mutation killed: a 403 for an unreadable workflow.
	outsider := relaytest.NewKey(t)
	unknown := uuid.NewString()
	for _, suffix := range []string{"/runs", "/runs/" + uuid.NewString() + "/approvals"} {
		status, raw := getAuthed(t, r, outsider, "/workflows/"+wf+suffix)
		require.Equal(t, http.StatusNotFound, status, "%s", raw)
		unknownStatus, unknownRaw := getAuthed(t, r, outsider, "/workflows/"+unknown+suffix)
		require.Equal(t, unknownStatus, status)
		require.Equal(t, string(unknownRaw), string(raw))
		require.Contains(t, string(raw), "workflow not found")
	}
	status, _ := getAuthed(t, r, owner.Key, "/workflows/"+uuid.NewString()+"/runs")
	require.Equal(t, http.StatusNotFound, status)

	run := insert("now()")
	_, err := r.Pool.Exec(ctx, `INSERT INTO workflow_approvals (community_id, token, workflow_id, run_id, step_id, step_index, expires_at)
		VALUES ($1, sha256('raw'), $2, $3, 'ask', 0, now() + interval '1 hour')`, r.CommunityID, wf, run)
	require.NoError(t, err)
	status, raw := getAuthed(t, r, owner.Key, "/workflows/"+wf+"/runs/"+run.String()+"/approvals")
	require.Equal(t, http.StatusOK, status, "%s", raw)
	require.NotContains(t, string(raw), `"token"`)
	require.Contains(t, string(raw), `"approval_ref":"`)
	status, _ = getAuthed(t, r, owner.Key, "/workflows/"+wf+"/runs/"+uuid.NewString()+"/approvals")
	require.Equal(t, http.StatusNotFound, status)
}

func itoa(n int) string { return strconv.Itoa(n) }

// Each event and schedule trigger over a real WebSocket, one workflow per
// kind in one channel: a reaction with the named emoji (and not another), a
// diff (kind 40008), and a schedule firing from the relay's own scheduler.
// Each run ends with its doorbell in the channel, readable by a member's
// REQ. Mutation killed: a trigger kind whose side row is not registered
// (say, diffs dropped from the trigger sources) leaves its doorbell missing;
// the scheduler not given the configured minimum fires the cron once a
// minute.
func TestEveryTriggerKindOverWebSocket(t *testing.T) {
	t.Parallel()
	r := relaytest.Start(t, func(c *config.Config) {
		c.WorkflowPoll = 100 * time.Millisecond
		c.WorkflowMinScheduleInterval = time.Second // a per-second cron, to see it fire
	})
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	require.NoError(t, r.Server.StartWorkflows(ctx))
	owner := r.Dial(t, "")
	owner.Auth(nil)
	ch := createChannel(t, owner, "triggers", false)
	save := func(yaml string) {
		t.Helper()
		ok := owner.Publish(owner.Sign(30620, yaml, nostr.Tags{{"d", uuid.NewString()}, {"h", ch}}, 0))
		require.True(t, ok.OK, ok.Msg)
	}
	save("name: R\ntrigger: {on: reaction_added, emoji: \"🚀\"}\nsteps: [{id: a, action: send_message, text: 'reacted {{trigger.emoji}}'}]")
	save("name: D\ntrigger: {on: diff_posted}\nsteps: [{id: a, action: send_message, text: 'diff {{trigger.text}}'}]")
	save("name: S\ntrigger: {on: schedule, cron: '* * * * * *'}\nsteps: [{id: a, action: send_message, text: scheduled}]")

	target := owner.Sign(9, "ship it", nostr.Tags{{"h", ch}}, 0)
	require.True(t, owner.Publish(target).OK)
	for _, emoji := range []string{"👀", "🚀"} {
		ok := owner.Publish(owner.Sign(7, emoji, nostr.Tags{{"e", target.ID}, {"h", ch}}, 0))
		require.True(t, ok.OK, ok.Msg)
	}
	ok := owner.Publish(owner.Sign(40008, "+one line", nostr.Tags{{"h", ch}}, 0))
	require.True(t, ok.OK, ok.Msg)

	want := []string{"reacted 🚀", "diff +one line", "scheduled"}
	scheduled := func(contents []string) int {
		return len(slices.DeleteFunc(slices.Clone(contents), func(c string) bool { return c != "scheduled" }))
	}
	var contents []string
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		contents = contents[:0]
		for _, ev := range owner.Req("bells", map[string]any{"kinds": []int{9}, "#h": []string{ch}}) {
			contents = append(contents, ev.Content)
		}
		if !slices.ContainsFunc(want, func(w string) bool { return !slices.Contains(contents, w) }) && scheduled(contents) >= 2 {
			break
		}
	}
	require.Subset(t, contents, want)
	// The scheduler takes the configured minimum too: under the default
	// it would fire this cron once a minute, as one saved before the
	// minimum existed.
	require.GreaterOrEqual(t, scheduled(contents), 2, "the per-second cron fires every second")
	require.NotContains(t, contents, "reacted 👀", "a reaction with another emoji starts nothing")
}

// saveWebhookWorkflow saves, as owner, a workflow of channel ch that a
// webhook call starts and that runs steps (a YAML list), and returns its id
// and its webhook secret, from the save's answer.
func saveWebhookWorkflow(t *testing.T, owner *relaytest.Client, ch, steps string) (id, secret string) {
	t.Helper()
	id = uuid.NewString()
	ok := owner.Publish(owner.Sign(30620, "name: Hook\ntrigger: {on: webhook}\nsteps: "+steps, nostr.Tags{{"d", id}, {"h", ch}}, 0))
	require.True(t, ok.OK, ok.Msg)
	return id, webhookSecret(t, ok.Msg)
}

// webhookSecret is the secret in the answer to a webhook workflow's save
// (`response:{"webhook_secret":...}`).
func webhookSecret(t *testing.T, saveAnswer string) string {
	t.Helper()
	var saved struct {
		WebhookSecret string `json:"webhook_secret"`
	}
	require.NoError(t, json.Unmarshal([]byte(strings.TrimPrefix(saveAnswer, "response:")), &saved))
	require.NotEmpty(t, saved.WebhookSecret)
	return saved.WebhookSecret
}

// workflowRuns counts the runs of one workflow of r's community.
func workflowRuns(t *testing.T, r *relaytest.Relay, workflowID string) int {
	t.Helper()
	var n int
	require.NoError(t, r.Pool.QueryRow(t.Context(), `SELECT count(*) FROM workflow_runs WHERE community_id = $1 AND workflow_id = $2`,
		r.CommunityID, workflowID).Scan(&n))
	return n
}
