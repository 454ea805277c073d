package workflow_test

import (
	"maps"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/buzzrelay/buzz/internal/clock"
	"github.com/buzzrelay/buzz/internal/db"
	"github.com/buzzrelay/buzz/internal/ingest"
	"github.com/buzzrelay/buzz/internal/nostr"
	"github.com/buzzrelay/buzz/internal/workflow"
	"github.com/buzzrelay/buzz/internal/workflow/safehttp"
)

// failedWith asserts the run ended failed with code, a diagnostic that
// contains each of texts and is not the code, and returns the row.
func (f *fixture) failedWith(run uuid.UUID, code workflow.ErrorCode, texts ...string) db.WorkflowRunGetRow {
	f.t.Helper()
	row := f.run(run)
	require.Equal(f.t, db.WorkflowRunStatusFailed, row.Status)
	require.NotNil(f.t, row.ErrorCode)
	require.Equal(f.t, string(code), *row.ErrorCode, "diagnostic: %s", *row.ErrorMessage)
	require.NotContains(f.t, *row.ErrorMessage, string(code), "the diagnostic is separate from the code")
	for _, text := range texts {
		require.Contains(f.t, *row.ErrorMessage, text)
	}
	return row
}

// lockEvents holds a SHARE lock on the events table, as a long migration
// or an operator's maintenance would: reads go on, every insert of an
// event waits. The returned func releases it.
func (f *fixture) lockEvents() func() {
	f.t.Helper()
	tx, err := f.pool.Begin(f.ctx)
	require.NoError(f.t, err)
	_, err = tx.Exec(f.ctx, `LOCK TABLE events IN SHARE MODE`)
	require.NoError(f.t, err)
	released := false
	release := func() {
		if !released {
			released = true
			require.NoError(f.t, tx.Rollback(f.ctx))
		}
	}
	f.t.Cleanup(release)
	return release
}

// slowHookServer is an HTTPS server on loopback that does not answer until
// release is called (or the test ends, or the client gives up), with an
// engine whose client may reach it and gives up after clientTimeout.
func (f *fixture) slowHookServer(clientTimeout time.Duration) (*httptest.Server, *atomic.Int32, *workflow.Engine, func()) {
	var calls atomic.Int32
	gate := make(chan struct{})
	var once sync.Once
	release := func() { once.Do(func() { close(gate) }) }
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		select {
		case <-r.Context().Done():
			// The client gave up (its TLS close ends this context):
			// returning would still answer 200, which the client can
			// read as a success. Never answer.
			panic(http.ErrAbortHandler)
		case <-gate:
		}
	}))
	f.t.Cleanup(srv.Close)
	f.t.Cleanup(release) // runs before srv.Close
	client := safehttp.New(safehttp.Options{
		AllowedNets: []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8"), netip.MustParsePrefix("::1/128")},
		RootCAs:     srv.Client().Transport.(*http.Transport).TLSClientConfig.RootCAs,
		Timeout:     clientTimeout,
	})
	e := workflow.NewEngine(f.pool, f.p, workflow.EngineOptions{Lease: time.Minute, Clock: clock.Stub(f.clock.Now), Webhooks: client, Metrics: f.metrics})
	return srv, &calls, e, release
}

// While a call is in flight its run's lease covers the call: the step's
// remaining deadline or the client's timeout, whichever is shorter, plus
// the engine's lease, so no other worker declares the outcome unknown
// while the call may still be answered. Once answered, the run completes.
//
// Mutation killed: marking the call started with the plain lease (one
// minute) fails both lower bounds.
func TestCallLeaseCoversTheCall(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name          string
		timeoutSecs   string
		clientTimeout time.Duration
		covers        time.Duration
	}{
		{"step deadline shorter", "30", time.Hour, 30 * time.Second},
		{"client timeout shorter", "600", 20 * time.Second, 20 * time.Second},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			f := newFixture(t)
			owner := f.key()
			ch := f.channel(owner)
			srv, calls, e, release := f.slowHookServer(c.clientTimeout)
			id := uuid.NewString()
			f.save(owner, ch, id, "name: Slow\ntrigger: {on: message_posted}\nsteps: [{id: hook, action: call_webhook, url: '"+srv.URL+"', timeout_secs: "+c.timeoutSecs+"}]")
			f.store(f.sign(owner, ingest.KindChat, "ping", nostr.Tags{{"h", ch}}))
			run := f.runIDs(id)[0]
			claims, err := e.ClaimDue(f.ctx, 1)
			require.NoError(t, err)
			done := make(chan bool, 1)
			go func() { done <- e.Execute(f.ctx, claims[0]) }()
			require.Eventually(t, func() bool { return calls.Load() == 1 }, time.Minute, 10*time.Millisecond)
			var lease time.Duration
			require.NoError(t, f.pool.QueryRow(f.ctx, `SELECT (extract(epoch FROM lease_until - $2::timestamptz) * 1e6)::bigint * interval '1 microsecond' FROM workflow_runs WHERE id = $1`,
				run, f.clock.Now()).Scan(&lease))
			require.Greater(t, lease, time.Minute+c.covers-10*time.Second, "covers the call")
			require.LessOrEqual(t, lease, time.Minute+c.covers)
			release()
			require.True(t, <-done)
			require.Equal(t, db.WorkflowRunStatusCompleted, f.run(run).Status)
		})
	}
}

// A call_webhook whose server does not answer within the step's
// timeout_secs fails the run with step_timeout, naming the step and the
// limit; the call was made once and the next step never runs.
//
// The run executes in the background, watched with a generous deadline,
// so a call the step's deadline does not cut fails the test instead of
// hanging it.
//
// Mutation killed: sending the request under the run's context instead of
// the step's deadline leaves the call to the client's own (one hour)
// timeout, and the run does not end within the test's minute.
func TestStepTimeoutEndsASlowWebhookCall(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	owner := f.key()
	ch := f.channel(owner)
	srv, calls, e, _ := f.slowHookServer(time.Hour)
	id := uuid.NewString()
	f.save(owner, ch, id, "name: Slow\ntrigger: {on: message_posted}\nsteps:\n"+
		"  - {id: hook, action: call_webhook, url: '"+srv.URL+"', timeout_secs: 1}\n"+
		"  - {id: after, action: send_message, text: never}\n")
	f.store(f.sign(owner, ingest.KindChat, "ping", nostr.Tags{{"h", ch}}))
	run := f.runIDs(id)[0]
	claims, err := e.ClaimDue(f.ctx, 1)
	require.NoError(t, err)
	require.Len(t, claims, 1)
	done := make(chan bool, 1)
	go func() { done <- e.Execute(f.ctx, claims[0]) }()
	require.Eventually(t, func() bool { return f.run(run).Status == db.WorkflowRunStatusFailed }, time.Minute, 20*time.Millisecond)
	require.True(t, <-done)
	f.failedWith(run, workflow.CodeStepTimeout, "step hook", "timeout of 1s")
	require.Equal(t, int32(1), calls.Load())
	require.Empty(t, f.doorbells(run), "the next step never ran")
	require.Equal(t, 1.0, f.runsTotal("failed", "step_timeout"))
}

// A step's database work runs under the same deadline: a send_message
// whose insert waits on a lock longer than timeout_secs is cut off, its
// transaction rolls back (nothing is sent) and the run fails with
// step_timeout. The wait happens in Execute, watched with a generous
// deadline, so a missing step deadline fails the test instead of hanging.
//
// Mutation killed: running the step's transaction under the run's context
// (no deadline) leaves the insert waiting on the lock, and the run never
// fails within the test's minute.
func TestStepTimeoutEndsBlockedDatabaseWork(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	owner := f.key()
	ch := f.channel(owner)
	id := uuid.NewString()
	f.save(owner, ch, id, "name: Stuck\ntrigger: {on: message_posted}\nsteps: [{id: say, action: send_message, text: hello, timeout_secs: 1}]")
	f.store(f.sign(owner, ingest.KindChat, "go", nostr.Tags{{"h", ch}}))
	run := f.runIDs(id)[0]
	release := f.lockEvents()
	claims, err := f.engine(time.Minute).ClaimDue(f.ctx, 1)
	require.NoError(t, err)
	require.Len(t, claims, 1)
	done := make(chan bool, 1)
	e := f.engine(time.Minute)
	go func() { done <- e.Execute(f.ctx, claims[0]) }()
	require.Eventually(t, func() bool { return f.run(run).Status == db.WorkflowRunStatusFailed }, time.Minute, 20*time.Millisecond)
	release()
	require.True(t, <-done)
	f.failedWith(run, workflow.CodeStepTimeout, "step say", "timeout of 1s")
	require.Empty(t, f.doorbells(run), "the step's message rolled back with it")
}

// A step whose database work fails (here Postgres gives up on a lock under
// the lock_timeout an operator set) ends the run with database_error in a
// fresh transaction; the step's own effects roll back.
//
// Mutation killed: recording nothing when the step's transaction fails
// (returning without finish) leaves the run running.
func TestDatabaseErrorEndsTheRun(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	owner := f.key()
	ch := f.channel(owner)
	id := uuid.NewString()
	f.save(owner, ch, id, "name: Locked\ntrigger: {on: message_posted}\nsteps: [{id: say, action: send_message, text: hello}]")
	f.store(f.sign(owner, ingest.KindChat, "go", nostr.Tags{{"h", ch}}))
	run := f.runIDs(id)[0]

	cfg := f.pool.Config()
	cfg.ConnConfig.RuntimeParams["lock_timeout"] = "200ms"
	impatient, err := pgxpool.NewWithConfig(f.ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(impatient.Close)
	release := f.lockEvents()
	e := workflow.NewEngine(impatient, f.p, workflow.EngineOptions{Lease: time.Minute, Clock: clock.Stub(f.clock.Now), Metrics: f.metrics})
	f.drain(e)
	release()
	f.failedWith(run, workflow.CodeDatabaseError, "step say")
	require.Empty(t, f.doorbells(run))
	require.Equal(t, 1.0, f.runsTotal("failed", "database_error"))
}

// A placeholder that renders to something the step cannot use (here a
// channel that is not a channel id, from the trigger's text) fails the
// run with template_resolution_failed.
//
// Mutation killed: sending to the run's own channel when the rendered
// channel does not parse completes the run instead.
func TestTemplateResolutionFailed(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	owner := f.key()
	ch := f.channel(owner)
	id := uuid.NewString()
	f.save(owner, ch, id, "name: T\ntrigger: {on: message_posted}\nsteps: [{id: fwd, action: send_message, channel: '{{trigger.text}}', text: hi}]")
	f.store(f.sign(owner, ingest.KindChat, "nowhere", nostr.Tags{{"h", ch}}))
	run := f.runIDs(id)[0]
	f.drain(f.engine(time.Minute))
	f.failedWith(run, workflow.CodeTemplateResolutionFailed, "step fwd", "channel")
	require.Empty(t, f.doorbells(run))
}

// A run whose workflow was archived (its owner deleted it by coordinate)
// after the run was queued fails with workflow_disabled and sends nothing.
//
// Mutation killed: not re-reading the workflow row at each step (trusting
// the state at trigger time) sends the message.
func TestWorkflowDisabledBeforeTheRunExecutes(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	owner := f.key()
	ch := f.channel(owner)
	id := uuid.NewString()
	f.save(owner, ch, id, "name: Gone\ntrigger: {on: message_posted}\nsteps: [{id: say, action: send_message, text: hello}]")
	f.store(f.sign(owner, ingest.KindChat, "go", nostr.Tags{{"h", ch}}))
	run := f.runIDs(id)[0]
	f.store(f.sign(owner, nostr.KindDeletion, "", nostr.Tags{{"a", "30620:" + pubHex(owner) + ":" + id}}))
	f.drain(f.engine(time.Minute))
	f.failedWith(run, workflow.CodeWorkflowDisabled, "archived")
	require.Empty(t, f.doorbells(run))
}

// A send_message into a private channel the owner is not a member of
// fails with owner_unauthorized: a workflow never speaks, even as the
// relay, where its owner may not. The run's error is readable by everyone
// in the workflow's channel, so it must not tell a private channel (live
// or archived) from an id that names no channel; only a channel the owner
// can read may be reported as archived.
//
// Mutations killed: dropping the membership check posts into the private
// channel; answering a missing channel or an archived private one with
// its own code or text fails the comparison; checking archived before
// readability reports the archived private channel as archived.
func TestOwnerUnauthorizedForAPrivateChannel(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	owner, other := f.key(), f.key()
	ch := f.channel(owner)
	privateChannel := func() string {
		id := uuid.NewString()
		f.store(f.sign(other, ingest.KindCreateGroup, "", nostr.Tags{{"h", id}, {"name", "secret"}, {"visibility", "private"}}))
		return id
	}
	archive := func(channel string) string {
		_, err := f.pool.Exec(f.ctx, `UPDATE channels SET archived_at = now() WHERE community_id = $1 AND id = $2`, f.tenant.ID(), channel)
		require.NoError(t, err)
		return channel
	}
	targets := map[string]string{
		"private":          privateChannel(),
		"archived private": archive(privateChannel()),
		"missing":          uuid.NewString(),
		"archived open":    archive(f.channel(other)),
	}
	workflows := map[string]string{}
	for name, target := range targets {
		workflows[name] = uuid.NewString()
		f.save(owner, ch, workflows[name], "name: Leak\ntrigger: {on: message_posted}\nsteps: [{id: leak, action: send_message, channel: '"+target+"', text: psst}]")
	}
	f.store(f.sign(owner, ingest.KindChat, "go", nostr.Tags{{"h", ch}}))
	runs := map[string]uuid.UUID{}
	for name, id := range workflows {
		runs[name] = f.runIDs(id)[0]
	}
	f.drain(f.engine(time.Minute))

	private := f.failedWith(runs["private"], workflow.CodeOwnerUnauthorized, "step leak", "does not exist or is private")
	for _, name := range []string{"archived private", "missing"} {
		row := f.failedWith(runs[name], workflow.CodeOwnerUnauthorized)
		require.Equal(t, *private.ErrorMessage, *row.ErrorMessage, "%s answers like a private channel", name)
	}
	f.failedWith(runs["archived open"], workflow.CodeWebhookFailed, "step leak", "archived")
	for _, run := range runs {
		require.Empty(t, f.doorbells(run))
	}
}

// A channel a template picks is chosen by whoever triggers the run, so
// they must be allowed to write there as well as the owner: a member of
// the workflow's open channel who names the owner's private channel in a
// message does not get the relay to post their text into it. A member of
// both does, and so does the owner.
//
// Mutation killed: checking only the owner's access to the rendered
// channel (as before) stores the outsider's text in the private channel.
func TestTemplatedChannelNeedsTheTriggerersAccess(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	owner, insider, outsider := f.key(), f.key(), f.key()
	ch := f.channel(owner, insider, outsider)
	secret := f.privateChannel(owner, insider)
	id := uuid.NewString()
	f.save(owner, ch, id, "name: Fwd\ntrigger: {on: message_posted}\nsteps: [{id: fwd, action: send_message, channel: '{{trigger.text}}', text: 'from {{trigger.author}}: {{trigger.text}}'}]")
	f.store(f.sign(outsider, ingest.KindChat, secret, nostr.Tags{{"h", ch}}))
	f.store(f.sign(insider, ingest.KindChat, secret, nostr.Tags{{"h", ch}}))
	f.store(f.sign(owner, ingest.KindChat, secret, nostr.Tags{{"h", ch}}))
	runOf := func(author *nostr.SecretKey) uuid.UUID {
		var run uuid.UUID
		require.NoError(t, f.pool.QueryRow(f.ctx, `SELECT id FROM workflow_runs WHERE community_id = $1 AND workflow_id = $2 AND trigger_context->>'author' = $3`,
			f.tenant.ID(), id, pubHex(author)).Scan(&run))
		return run
	}
	refused := runOf(outsider)
	f.drain(f.engine(time.Minute))

	f.failedWith(refused, workflow.CodeOwnerUnauthorized, "step fwd", "does not exist or is private")
	require.Empty(t, f.doorbells(refused))
	require.Zero(t, f.count(`SELECT count(*) FROM events WHERE community_id = $1 AND channel_id = $2 AND content LIKE $3`,
		f.tenant.ID(), secret, "from "+pubHex(outsider)+"%"), "nothing the outsider triggered reached the private channel")
	for _, run := range []uuid.UUID{runOf(insider), runOf(owner)} {
		require.Equal(t, db.WorkflowRunStatusCompleted, f.run(run).Status)
		bells := f.doorbells(run)
		require.Len(t, bells, 1)
		require.Equal(t, secret, bells[0].Tags.First("h")[1])
	}
}

// A pinned definition the parser no longer accepts (stored under an
// earlier, more lenient parser; simulated by rewriting the stored event,
// as saving refuses such a definition today) fails closed: invalid_yaml
// when the text is not YAML at all.
//
// Mutation killed: reporting every parse failure as invalid_definition.
func TestPinnedDefinitionNoLongerYAML(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	owner := f.key()
	ch := f.channel(owner)
	id := uuid.NewString()
	def, _ := f.save(owner, ch, id, "name: Old\ntrigger: {on: message_posted}\nsteps: [{id: say, action: send_message, text: hello}]")
	f.store(f.sign(owner, ingest.KindChat, "go", nostr.Tags{{"h", ch}}))
	run := f.runIDs(id)[0]
	_, err := f.pool.Exec(f.ctx, `UPDATE events SET content = 'name: [unclosed' WHERE id = decode($1, 'hex')`, def.ID)
	require.NoError(t, err)
	f.drain(f.engine(time.Minute))
	f.failedWith(run, workflow.CodeInvalidYAML, "no longer parses", "invalid YAML")
	require.Empty(t, f.doorbells(run))
}

// Every error code has a test that produces it through real triggers and
// steps, except the one no engine path can write. This list is the index:
// a code added to AllErrorCodes without a producing test fails here.
func TestEveryErrorCodeIsProduced(t *testing.T) {
	t.Parallel()
	producedBy := map[workflow.ErrorCode]string{
		workflow.CodeInvalidYAML:               "TestPinnedDefinitionNoLongerYAML",
		workflow.CodeInvalidDefinition:         "TestRunsFailClosed",
		workflow.CodeConditionEvaluationFailed: "TestStepConditions",
		workflow.CodeTemplateResolutionFailed:  "TestTemplateResolutionFailed",
		workflow.CodeStepTimeout:               "TestStepTimeoutEndsASlowWebhookCall, TestStepTimeoutEndsBlockedDatabaseWork",
		workflow.CodeWebhookFailed:             "TestCallWebhookStep, TestCallWebhookIsNotRepeatedAfterACrash",
		workflow.CodeCapacityExceeded:          "TestCapacityBoundUnderParallelTriggers, TestCapacityOnEveryTrigger",
		workflow.CodeDatabaseError:             "TestDatabaseErrorEndsTheRun",
		workflow.CodeOwnerUnauthorized:         "TestOwnerUnauthorizedForAPrivateChannel",
		workflow.CodeActionNotImplemented:      "TestRunsFailClosed",
		workflow.CodeApprovalDenied:            "TestApprovalDenyAndFailClosed",
		workflow.CodeApprovalExpired:           "TestApprovalExpires",
		workflow.CodeWorkflowDisabled:          "TestWorkflowDisabledBeforeTheRunExecutes",
		workflow.CodeStepAbandoned:             "TestAStepThatKeepsKillingItsWorkerEndsTheRun",
		// Reserved for run rows imported from elsewhere without a known
		// code; the engine never writes it (the migration test stores it).
		workflow.CodeLegacyUnclassified: "",
	}
	for _, code := range workflow.AllErrorCodes {
		_, ok := producedBy[code]
		require.True(t, ok, "no test produces %s", code)
	}
	require.Len(t, producedBy, len(workflow.AllErrorCodes))
}

// runsTotal reads buzz_workflow_runs_total{outcome,error_code} from the
// fixture's registry (0 when the series does not exist).
func (f *fixture) runsTotal(outcome, code string) float64 {
	return f.counter("buzz_workflow_runs_total", map[string]string{"outcome": outcome, "error_code": code})
}

// counter reads the counter series of name with exactly labels from the
// fixture's registry (0 when the series does not exist).
func (f *fixture) counter(name string, labels map[string]string) float64 {
	f.t.Helper()
	families, err := f.reg.Gather()
	require.NoError(f.t, err)
	for _, fam := range families {
		if fam.GetName() != name {
			continue
		}
		for _, m := range fam.GetMetric() {
			got := map[string]string{}
			for _, l := range m.GetLabel() {
				got[l.GetName()] = l.GetValue()
			}
			if maps.Equal(got, labels) {
				return m.GetCounter().GetValue()
			}
		}
	}
	return 0
}

// A step that failed and whose transaction then ran out of its deadline
// before it committed ends with step_timeout, and the diagnostic keeps the
// step's own failure, recorded by nobody otherwise.
//
// Mutation killed: the deadline's failure alone (as before): the template
// failure is lost.
func TestStepTimeoutKeepsTheFailureItCutShort(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	owner := f.key()
	ch := f.channel(owner)
	id := uuid.NewString()
	f.save(owner, ch, id, "name: T\ntrigger: {on: message_posted}\nsteps: [{id: fwd, action: send_message, channel: '{{trigger.text}}', text: hi, timeout_secs: 1}]")
	f.store(f.sign(owner, ingest.KindChat, "nowhere", nostr.Tags{{"h", ch}}))
	run := f.runIDs(id)[0]
	e := f.engine(time.Minute)
	// The step's transaction outlives its one-second deadline before COMMIT.
	e.SetBeforeCommit(func(uuid.UUID, int) { time.Sleep(2 * time.Second) })
	f.drain(e)
	f.failedWith(run, workflow.CodeStepTimeout, "step fwd did not finish within its timeout of 1s; before that: step fwd: channel is not a channel id")
	require.Empty(t, f.doorbells(run))
}
