package workflow_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/buzzrelay/buzz/internal/clock"
	"github.com/buzzrelay/buzz/internal/db"
	"github.com/buzzrelay/buzz/internal/ingest"
	"github.com/buzzrelay/buzz/internal/nostr"
	"github.com/buzzrelay/buzz/internal/workflow"
	"github.com/buzzrelay/buzz/internal/workflow/safehttp"
)

// hookServer is an HTTPS server on loopback that counts calls, with an
// engine whose webhook client may reach it.
func (f *fixture) hookServer(status int) (*httptest.Server, *atomic.Int32, *workflow.Engine) {
	return f.hookServerAnswering(status, func(body []byte) []byte { return append([]byte("got "), body...) })
}

// hookServerAnswering is hookServer with the answer's body made from the
// request's.
func (f *fixture) hookServerAnswering(status int, answer func(body []byte) []byte) (*httptest.Server, *atomic.Int32, *workflow.Engine) {
	var calls atomic.Int32
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		body, _ := io.ReadAll(r.Body)
		w.WriteHeader(status)
		_, _ = w.Write(answer(body))
	}))
	f.t.Cleanup(srv.Close)
	return srv, &calls, f.engineCalling(srv)
}

// engineCalling is an engine whose webhook client may reach the TLS
// server srv on loopback (and trusts its certificate).
func (f *fixture) engineCalling(srv *httptest.Server) *workflow.Engine {
	client := safehttp.New(safehttp.Options{
		AllowedNets: []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8"), netip.MustParsePrefix("::1/128")},
		RootCAs:     srv.Client().Transport.(*http.Transport).TLSClientConfig.RootCAs,
	})
	return workflow.NewEngine(f.pool, f.p, workflow.EngineOptions{Lease: time.Minute, Clock: clock.Stub(f.clock.Now), Webhooks: client})
}

// call_webhook sends the rendered request once and its output feeds the
// next step; a non-2xx answer fails the run with webhook_failed and a
// diagnostic that is not the code. Saving it needs the owner or admin
// role. Mutation killed: skipping the role check at save fails the
// refusal; not recording the output fails the second step's text.
func TestCallWebhookStep(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	owner, member := f.key(), f.key()
	ch := f.channel(owner, member)
	srv, calls, e := f.hookServer(200)
	def := "name: Hook\ntrigger: {on: message_posted}\nsteps:\n" +
		"  - {id: hook, action: call_webhook, url: '" + srv.URL + "/x', body: '{{trigger.text}}'}\n" +
		"  - {id: say, action: send_message, text: 'answer {{steps.hook.output.status}} {{steps.hook.output.body}}'}\n"
	f.rejected(f.sign(member, workflow.KindDefinition, def, nostr.Tags{{"d", uuid.NewString()}, {"h", ch}}),
		"restricted: call_webhook needs the owner or admin role in the channel")
	id := uuid.NewString()
	f.save(owner, ch, id, def)
	f.store(f.sign(owner, ingest.KindChat, "ping", nostr.Tags{{"h", ch}}))
	f.drain(e)
	run := f.runIDs(id)[0]
	require.Equal(t, db.WorkflowRunStatusCompleted, f.run(run).Status)
	require.Equal(t, int32(1), calls.Load())
	require.Equal(t, []string{"answer 200 got ping"}, contents(f.doorbells(run)))

	failing, _, e2 := f.hookServer(500)
	id2 := uuid.NewString()
	f.save(owner, ch, id2, "name: Bad\ntrigger: {on: message_posted}\nsteps: [{id: hook, action: call_webhook, url: '"+failing.URL+"'}]")
	f.store(f.sign(owner, ingest.KindChat, "again", nostr.Tags{{"h", ch}}))
	f.drain(e2)
	bad := f.run(f.runIDs(id2)[0])
	require.Equal(t, db.WorkflowRunStatusFailed, bad.Status)
	require.Equal(t, "webhook_failed", *bad.ErrorCode)
	require.Contains(t, *bad.ErrorMessage, "HTTP 500")
}

// A worker that marked a call started and stopped before recording the
// outcome may have sent it: the run that resumes fails with
// webhook_failed and never calls again. Mutation killed: ignoring the
// started mark (retrying the call) makes the server see a call.
func TestCallWebhookIsNotRepeatedAfterACrash(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	owner := f.key()
	ch := f.channel(owner)
	srv, calls, e := f.hookServer(200)
	id := uuid.NewString()
	f.save(owner, ch, id, "name: Hook\ntrigger: {on: message_posted}\nsteps: [{id: hook, action: call_webhook, url: '"+srv.URL+"'}]")
	f.store(f.sign(owner, ingest.KindChat, "ping", nostr.Tags{{"h", ch}}))
	run := f.runIDs(id)[0]
	// What a worker leaves behind when it dies between marking the call
	// and recording its outcome.
	claims, err := e.ClaimDue(f.ctx, 1)
	require.NoError(t, err)
	_, err = f.pool.Exec(f.ctx, `UPDATE workflow_runs SET execution_trace = '[{"step_id":"hook","index":0,"status":"started"}]' WHERE id = $1`, run)
	require.NoError(t, err)
	_ = claims
	f.clock.Advance(2 * time.Minute)
	f.drain(e)
	final := f.run(run)
	require.Equal(t, db.WorkflowRunStatusFailed, final.Status)
	require.Equal(t, "webhook_failed", *final.ErrorCode)
	require.Zero(t, calls.Load(), "never repeated")
}

// A 2xx answer whose body holds NUL or invalid UTF-8 (which jsonb cannot
// hold) is recorded with U+FFFD in their place, and the run goes on.
//
// Mutation killed: storing the body as received fails the recording; the
// run then ends with database_error instead of completing (and before
// the recording failure was handled, stayed running until its lease
// expired).
func TestCallWebhookAnswerWithNULIsRecorded(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	owner := f.key()
	ch := f.channel(owner)
	srv, calls, e := f.hookServerAnswering(200, func([]byte) []byte { return []byte("ok\x00 \xff done") })
	id := uuid.NewString()
	f.save(owner, ch, id, "name: Hook\ntrigger: {on: message_posted}\nsteps:\n"+
		"  - {id: hook, action: call_webhook, url: '"+srv.URL+"'}\n"+
		"  - {id: say, action: send_message, text: 'answer {{steps.hook.output.body}}'}\n")
	f.store(f.sign(owner, ingest.KindChat, "ping", nostr.Tags{{"h", ch}}))
	f.drain(e)
	run := f.runIDs(id)[0]
	require.Equal(t, db.WorkflowRunStatusCompleted, f.run(run).Status)
	require.Equal(t, int32(1), calls.Load())
	require.Equal(t, []string{"answer ok\uFFFD \uFFFD done"}, contents(f.doorbells(run)))
}

// A call whose outcome cannot be recorded (here a trigger refuses the
// update) ends its run at once with database_error and a diagnostic that
// says the call was made, instead of leaving it running until its lease
// expires and then reporting a stopped worker.
//
// Mutation killed: returning on the recording error without ending the
// run (as before) leaves the run running.
func TestCallWebhookUnrecordableOutcomeEndsTheRun(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	owner := f.key()
	ch := f.channel(owner)
	srv, calls, e := f.hookServer(200)
	id := uuid.NewString()
	f.save(owner, ch, id, "name: Hook\ntrigger: {on: message_posted}\nsteps:\n"+
		"  - {id: hook, action: call_webhook, url: '"+srv.URL+"'}\n"+
		"  - {id: say, action: send_message, text: done}\n")
	_, err := f.pool.Exec(f.ctx, `
		CREATE FUNCTION test_refuse_output() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN RAISE EXCEPTION 'refused by test'; END $$;
		CREATE TRIGGER test_refuse_output BEFORE UPDATE ON workflow_runs FOR EACH ROW
		WHEN (NEW.execution_trace::text LIKE '%"output"%') EXECUTE FUNCTION test_refuse_output();`)
	require.NoError(t, err)
	f.store(f.sign(owner, ingest.KindChat, "ping", nostr.Tags{{"h", ch}}))
	f.drain(e)
	run := f.run(f.runIDs(id)[0])
	require.Equal(t, int32(1), calls.Load())
	require.Equal(t, db.WorkflowRunStatusFailed, run.Status)
	require.Equal(t, "database_error", *run.ErrorCode)
	require.Equal(t, "step hook: the call was made but its outcome could not be recorded; before that: step hook: the server answered HTTP 200", *run.ErrorMessage)
}

// A failed call whose failure cannot be recorded ends the run with
// database_error, and the diagnostic keeps the call's failure (what the
// server answered), which is what an operator looks for. The step's trace
// entry says the same.
//
// Mutation killed: the recording failure's diagnostic alone (as before):
// the server's 503 is lost.
func TestUnrecordableFailureKeepsTheFailureItEnded(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	owner := f.key()
	ch := f.channel(owner)
	srv, calls, e := f.hookServer(503)
	id := uuid.NewString()
	f.save(owner, ch, id, "name: Hook\ntrigger: {on: message_posted}\nsteps: [{id: hook, action: call_webhook, url: '"+srv.URL+"'}]")
	_, err := f.pool.Exec(f.ctx, `
		CREATE FUNCTION test_refuse_webhook_failed() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN RAISE EXCEPTION 'refused by test'; END $$;
		CREATE TRIGGER test_refuse_webhook_failed BEFORE UPDATE ON workflow_runs FOR EACH ROW
		WHEN (NEW.error_code = 'webhook_failed') EXECUTE FUNCTION test_refuse_webhook_failed();`)
	require.NoError(t, err)
	f.store(f.sign(owner, ingest.KindChat, "ping", nostr.Tags{{"h", ch}}))
	f.drain(e)
	run := f.runIDs(id)[0]
	require.Equal(t, int32(1), calls.Load())
	want := "step hook: the call was made but its outcome could not be recorded; before that: step hook: the server answered HTTP 503"
	f.failedWith(run, workflow.CodeDatabaseError, want)
	var traced string
	require.NoError(t, f.pool.QueryRow(f.ctx, `SELECT execution_trace -> -1 ->> 'error' FROM workflow_runs WHERE id = $1`, run).Scan(&traced))
	require.Equal(t, want, traced)
}

// A webhook answer longer than MaxTraceBodyBytes is kept in the trace cut
// to that size on a character boundary, marked body_truncated.
//
// Mutation killed: storing the whole answer keeps all 100,000 bytes and
// no mark.
func TestCallWebhookAnswerIsCutInTheTrace(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	owner := f.key()
	ch := f.channel(owner)
	long := "a" + strings.Repeat("é", 50_000) // 100,001 bytes; a cut at 64 KiB splits an é
	srv, _, e := f.hookServerAnswering(200, func([]byte) []byte { return []byte(long) })
	id := uuid.NewString()
	f.save(owner, ch, id, "name: Hook\ntrigger: {on: message_posted}\nsteps: [{id: hook, action: call_webhook, url: '"+srv.URL+"'}]")
	f.store(f.sign(owner, ingest.KindChat, "ping", nostr.Tags{{"h", ch}}))
	f.drain(e)
	run := f.runIDs(id)[0]
	require.Equal(t, db.WorkflowRunStatusCompleted, f.run(run).Status)
	var body string
	var truncated *bool
	require.NoError(t, f.pool.QueryRow(f.ctx, `SELECT s -> 'output' ->> 'body', (s -> 'output' ->> 'body_truncated')::boolean
		FROM workflow_runs, jsonb_array_elements(execution_trace) s
		WHERE id = $1 AND s ->> 'step_id' = 'hook' AND s ->> 'status' = 'completed'`, run).Scan(&body, &truncated))
	require.Equal(t, workflow.MaxTraceBodyBytes-1, len(body), "cut before the é that straddles the bound")
	require.True(t, utf8.ValidString(body))
	require.Equal(t, long[:len(body)], body)
	require.NotNil(t, truncated)
	require.True(t, *truncated)
}

// A workflow whose call_webhook step calls its own webhook trigger (here
// the relay's hook endpoint served over TLS on loopback) starts a chain of
// runs; each call carries its depth, and the hook refuses the call past
// workflow.MaxWebhookDepth with 508, which fails that run's step. Without
// the bound the chain never ends. Mutation killed: Serve ignoring the
// depth (the chain outlives the test's 20 rounds); the engine not sending
// it (likewise).
func TestCallWebhookToItsOwnHookStopsAtTheDepthBound(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	owner := f.key()
	ch := f.channel(owner)
	hooks := &workflow.Webhooks{Pool: f.pool, Clock: clock.Stub(f.clock.Now)}
	srv := f.serveHooks(hooks)
	e := f.engineCalling(srv)

	id := uuid.NewString()
	secret := f.saveHook(owner, ch, id, "name: Loop\ntrigger: {on: webhook}\nsteps: [{id: a, action: send_message, text: first}]")
	f.clock.Advance(time.Second) // the re-save replaces the definition
	f.save(owner, ch, id, "name: Loop\ntrigger: {on: webhook}\nsteps: [{id: again, action: call_webhook, url: '"+
		srv.URL+"/hooks/"+id+"?secret="+secret+"', body: '{}'}]")

	resp, err := srv.Client().Post(srv.URL+"/hooks/"+id+"?secret="+secret, "application/json", strings.NewReader("{}"))
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusAccepted, resp.StatusCode)
	for round := 0; ; round++ {
		require.Less(t, round, 20, "the chain of runs does not end")
		claims, err := e.ClaimDue(f.ctx, 10)
		require.NoError(t, err)
		if len(claims) == 0 {
			break
		}
		for _, c := range claims {
			e.Execute(f.ctx, c)
		}
	}
	runs := f.runIDs(id)
	require.Len(t, runs, workflow.MaxWebhookDepth+1, "the first run and one per call within the bound")
	// The runs share a created_at (the test's clock stands still): tell
	// them apart by the depth each was started at.
	byDepth := map[int]db.WorkflowRunGetRow{}
	for _, run := range runs {
		r := f.run(run)
		var tc workflow.TriggerContext
		require.NoError(t, json.Unmarshal(r.TriggerContext, &tc))
		byDepth[tc.Depth] = r
	}
	for depth := range workflow.MaxWebhookDepth {
		require.Equal(t, db.WorkflowRunStatusCompleted, byDepth[depth].Status, "depth %d: %s", depth, deref(byDepth[depth].ErrorMessage))
	}
	last := byDepth[workflow.MaxWebhookDepth]
	require.Equal(t, db.WorkflowRunStatusFailed, last.Status)
	require.Equal(t, "webhook_failed", *last.ErrorCode)
	require.Contains(t, *last.ErrorMessage, "HTTP 508")
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

// The depth bound ends a chain of webhook calls, not its breadth: a
// workflow whose steps call its own hook k times starts k runs at each
// depth from each run, 1 + k + k^2 + k^3 + k^4 in all (341 for k = 4; with
// 50 steps, 6.5 million from one call), each a run row and its steps'
// events. The webhook's rate check (the relay's: a token of the owner's
// publish rate per call) bounds them to what the owner may publish:
// here ten calls are allowed, so the outside call and nine of its
// descendants start runs, and the tenth step's call is refused (429),
// failing its run.
//
// Mutation killed: Serve ignoring Allow runs all 341.
func TestCallWebhookFanOutStopsAtTheOwnersRate(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	owner := f.key()
	ch := f.channel(owner)
	var allowed atomic.Int32
	allowed.Store(10)
	hooks := &workflow.Webhooks{Pool: f.pool, Clock: clock.Stub(f.clock.Now),
		Allow: func(_ uuid.UUID, who string) (bool, time.Duration) {
			require.Equal(t, pubHex(owner), who, "the owner's rate")
			return allowed.Add(-1) >= 0, time.Minute
		}}
	srv := f.serveHooks(hooks)
	e := f.engineCalling(srv)

	id := uuid.NewString()
	secret := f.saveHook(owner, ch, id, "name: Fan\ntrigger: {on: webhook}\nsteps: [{id: a, action: send_message, text: first}]")
	f.clock.Advance(time.Second) // the re-save replaces the definition
	var steps strings.Builder
	for i := range 4 {
		steps.WriteString("  - {id: call" + itoa(int64(i)) + ", action: call_webhook, url: '" + srv.URL + "/hooks/" + id + "?secret=" + secret + "', body: '{}'}\n")
	}
	f.save(owner, ch, id, "name: Fan\ntrigger: {on: webhook}\nsteps:\n"+steps.String())

	resp, err := srv.Client().Post(srv.URL+"/hooks/"+id+"?secret="+secret, "application/json", strings.NewReader("{}"))
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusAccepted, resp.StatusCode)
	for round := 0; ; round++ {
		require.Less(t, round, 100, "the runs do not end")
		claims, err := e.ClaimDue(f.ctx, 10)
		require.NoError(t, err)
		if len(claims) == 0 {
			break
		}
		for _, c := range claims {
			e.Execute(f.ctx, c)
		}
	}
	require.Equal(t, 10, len(f.runIDs(id)), "the outside call and nine calls of its runs")
	require.Positive(t, f.count(`SELECT count(*) FROM workflow_runs WHERE workflow_id = $1 AND error_message LIKE '%HTTP 429%'`, id),
		"a refused call fails its step")
}

// saveHook saves a webhook-triggered definition and returns the secret
// its save answered with.
func (f *fixture) saveHook(owner *nostr.SecretKey, channel, workflowID, yaml string) string {
	f.t.Helper()
	_, reply := f.save(owner, channel, workflowID, yaml)
	var saved struct {
		Secret string `json:"webhook_secret"`
	}
	require.NoError(f.t, json.Unmarshal([]byte(strings.TrimPrefix(reply, "response:")), &saved))
	return saved.Secret
}

// serveHooks serves hooks' POST /hooks/{id} for the fixture's community
// over TLS, as an engine made by engineCalling may call it.
func (f *fixture) serveHooks(hooks *workflow.Webhooks) *httptest.Server {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /hooks/{id}", func(w http.ResponseWriter, r *http.Request) { hooks.Serve(w, r, f.tenant.ID()) })
	srv := httptest.NewTLSServer(mux)
	f.t.Cleanup(srv.Close)
	return srv
}

// A webhook call that finds every read slot taken answers 503 with the
// relay's busy text, NIP-01 prefix first, as its other HTTP routes do.
// Mutation killed: the unprefixed "relay busy; retry shortly".
func TestWebhookCallPastTheReadSlotWaitIsBusy(t *testing.T) {
	t.Parallel()
	hooks := &workflow.Webhooks{ReadSlot: func(context.Context) (func(), error) { return nil, errors.New("every read slot stayed busy") }}
	req := httptest.NewRequest(http.MethodPost, "/hooks/x", strings.NewReader(`{}`))
	req.SetPathValue("id", uuid.NewString())
	rec := httptest.NewRecorder()
	hooks.Serve(rec, req, uuid.New())
	require.Equal(t, http.StatusServiceUnavailable, rec.Code)
	var answer struct{ Error string }
	require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &answer), rec.Body.String())
	require.Equal(t, "error: the relay is busy reading; try again shortly", answer.Error)
}

// A definition saved before a call_webhook URL had to write out its host
// still runs, but its call is not made: the run fails with
// template_resolution_failed and the owner is told to save it again. Its
// host would otherwise be whatever the message said ("127.0.0.1" here; any
// domain elsewhere), and that server would get the owner's headers.
// Mutation killed: without renderURL's origin check the call reaches the
// host the message named.
func TestCallWebhookWhoseHostIsAPlaceholderIsNotCalled(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	owner := f.key()
	ch := f.channel(owner)
	srv, calls, e := f.hookServer(200)
	id := uuid.NewString()
	f.save(owner, ch, id, "name: Hook\ntrigger: {on: message_posted}\nsteps: [{id: hook, action: call_webhook, url: '"+srv.URL+"/x'}]")
	// What a relay before the rule stored: the host is the message's.
	tag, err := f.pool.Exec(f.ctx, `UPDATE events SET content = replace(content, 'https://127.0.0.1:', 'https://{{trigger.text}}:') WHERE kind = 30620`)
	require.NoError(t, err)
	require.EqualValues(t, 1, tag.RowsAffected())
	f.store(f.sign(owner, ingest.KindChat, "127.0.0.1", nostr.Tags{{"h", ch}}))
	f.drain(e)
	run := f.run(f.runIDs(id)[0])
	require.Equal(t, db.WorkflowRunStatusFailed, run.Status)
	require.Equal(t, "template_resolution_failed", *run.ErrorCode)
	require.Contains(t, *run.ErrorMessage, "step hook: url: a placeholder may not stand in the scheme, host or port")
	require.Zero(t, calls.Load())
}

// A URL placeholder without a value fails the step instead of sending the
// placeholder's text, which the URL would carry as a path of its own
// making. Mutation killed: ignoring found in renderURL renders the
// missing value as empty (caught here as an emptied segment, with another
// message; in a query it would be sent).
func TestCallWebhookURLPlaceholderWithoutAValueIsNotCalled(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	owner := f.key()
	ch := f.channel(owner)
	srv, calls, e := f.hookServer(200)
	id := uuid.NewString()
	f.save(owner, ch, id, "name: Hook\ntrigger: {on: message_posted}\nsteps: [{id: hook, action: call_webhook, url: '"+srv.URL+"/x/{{trigger.nothing}}'}]")
	f.store(f.sign(owner, ingest.KindChat, "hi", nostr.Tags{{"h", ch}}))
	f.drain(e)
	f.failedWith(f.runIDs(id)[0], workflow.CodeTemplateResolutionFailed, "step hook: url: {{trigger.nothing}} has no value")
	require.Zero(t, calls.Load())
}

// A value in a call_webhook URL's path may not change the path's shape
// through what servers normalize: a top-level message's root_message_id
// (empty) in ".../threads/{{trigger.root_message_id}}/close" made
// /threads//close, which servers merge into /threads/close, another
// endpoint than the owner named; the run fails without a call. The same
// values in the query are data and are sent. Mutation killed: letting a
// value leave a path segment empty (renderURL's seg == "") calls
// /threads//close.
func TestCallWebhookURLValueCannotEmptyAPathSegment(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	owner := f.key()
	var mu sync.Mutex
	var got []string
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		got = append(got, r.URL.RequestURI())
		mu.Unlock()
	}))
	t.Cleanup(srv.Close)
	e := f.engineCalling(srv)
	for _, tc := range []struct{ url, text, failure, call string }{
		{"/threads/{{trigger.root_message_id}}/close", "hi", "a value may not leave a path segment empty", ""},
		{"/threads/{{trigger.text}}", "", "a value may not leave a path segment empty", ""},
		{"/threads/{{trigger.text}}/close", "..", `make it "." or ".."`, ""},
		{"/threads/x{{trigger.text}}/close/", "", "", "/threads/x/close/"},
		{"/search?q={{trigger.text}}&r={{trigger.root_message_id}}", "..", "", "/search?q=..&r="},
	} {
		ch := f.channel(owner)
		id := uuid.NewString()
		f.save(owner, ch, id, "name: Hook\ntrigger: {on: message_posted}\nsteps: [{id: hook, action: call_webhook, url: '"+srv.URL+tc.url+"'}]")
		f.store(f.sign(owner, ingest.KindChat, tc.text, nostr.Tags{{"h", ch}}))
		f.drain(e)
		run := f.runIDs(id)[0]
		mu.Lock()
		calls := got
		got = nil
		mu.Unlock()
		if tc.failure != "" {
			f.failedWith(run, workflow.CodeTemplateResolutionFailed, "step hook: url: ", tc.failure)
			require.Empty(t, calls, tc.url)
			continue
		}
		require.Equal(t, db.WorkflowRunStatusCompleted, f.run(run).Status, tc.url)
		require.Equal(t, []string{tc.call}, calls, tc.url)
	}
}
