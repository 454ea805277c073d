package workflow_test

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/buzzrelay/buzz/internal/clock"
	"github.com/buzzrelay/buzz/internal/db"
	"github.com/buzzrelay/buzz/internal/dbtest"
	"github.com/buzzrelay/buzz/internal/ingest"
	"github.com/buzzrelay/buzz/internal/nostr"
	"github.com/buzzrelay/buzz/internal/workflow"
)

// statusCount counts a workflow's runs with status (and error code, when
// code is not empty).
func (f *fixture) statusCount(workflowID string, status db.WorkflowRunStatus, code string) int {
	f.t.Helper()
	return f.count(`SELECT count(*) FROM workflow_runs WHERE workflow_id = $1 AND status = $2 AND ($3 = '' OR error_code = $3)`,
		workflowID, status, code)
}

// Many messages trigger one workflow at once, each in its own transaction
// on its own connection: exactly the bound's worth of runs queue, every
// other run is recorded failed with capacity_exceeded (counted in the
// metric), and every message is stored. Once the queued runs ended, the
// next burst queues again; three bursts make a race that slips through
// once very likely to show.
//
// Mutation killed: counting without first locking the workflow row lets
// concurrent triggers each see room and queue more than the bound.
func TestCapacityBoundUnderParallelTriggers(t *testing.T) {
	t.Parallel()
	const bound, triggers, bursts = 5, 24, 3
	f := newFixtureMax(t, bound)
	owner := f.key()
	ch := f.channel(owner)
	id := uuid.NewString()
	f.save(owner, ch, id, "name: Busy\ntrigger: {on: message_posted}\nsteps: [{id: say, action: send_message, text: 'seen {{trigger.text}}'}]")

	for burst := range bursts {
		events := make([]*nostr.Event, triggers)
		for i := range events {
			events[i] = f.sign(owner, ingest.KindChat, "m"+itoa(int64(burst*triggers+i)), nostr.Tags{{"h", ch}})
		}
		start := make(chan struct{})
		errs := make(chan error, triggers)
		var wg sync.WaitGroup
		for _, ev := range events {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				out, _, err := f.p.SubmitReply(f.ctx, f.tenant, ev.PubKey, ev)
				if err == nil && out != ingest.Stored {
					err = &ingest.Rejection{Prefix: "test", Reason: "not stored"}
				}
				errs <- err
			}()
		}
		close(start)
		wg.Wait()
		close(errs)
		for err := range errs {
			require.NoError(t, err, "a trigger at capacity never refuses the event")
		}

		refused := (burst + 1) * (triggers - bound)
		require.Equal(t, bound, f.statusCount(id, db.WorkflowRunStatusPending, ""), "exactly the bound queues")
		require.Equal(t, refused, f.statusCount(id, db.WorkflowRunStatusFailed, "capacity_exceeded"))
		require.Equal(t, float64(refused), f.runsTotal("failed", "capacity_exceeded"))
		f.drain(f.engine(time.Minute))
		require.Equal(t, (burst+1)*bound, f.statusCount(id, db.WorkflowRunStatusCompleted, ""), "ended runs free the bound")
		for range bound {
			<-f.offers // only queued runs are offered
		}
	}
	var msg string
	require.NoError(t, f.pool.QueryRow(f.ctx, `SELECT error_message FROM workflow_runs WHERE workflow_id = $1 AND status = 'failed' LIMIT 1`, id).Scan(&msg))
	require.Contains(t, msg, "5 unfinished runs")
	require.Empty(t, f.offers, "refused runs are not offered")
}

// The bound holds for every trigger: the manual command's run is recorded
// failed and its OK message says so; a schedule slot at capacity is
// claimed with a failed run (it never fires again); a webhook call at
// capacity answers 429 with the failed run, keeps no idempotency key (a
// retry with the key after the queue drained starts a run), while a retry
// of a key that did queue returns its run even at capacity. Waiting
// approvals count as unfinished.
//
// Mutations killed: admitting manual, schedule or webhook runs without the
// bound queues a second run on each path; storing the key on a refused run
// makes the later retry return the failed run.
func TestCapacityOnEveryTrigger(t *testing.T) {
	t.Parallel()
	f := newFixtureMax(t, 1)
	owner := f.key()
	ch := f.channel(owner)

	// Manual command and schedule, on a schedule workflow.
	tick := uuid.NewString()
	f.save(owner, ch, tick, "name: Tick\ntrigger: {on: schedule, interval: 1h}\nsteps: [{id: ask, action: request_approval, message: ok?}]")
	first := f.store(f.sign(owner, workflow.KindManualTrigger, "", nostr.Tags{{"d", tick}}))
	require.Regexp(t, `^response:\{"run_id":"[0-9a-f-]{36}"\}$`, first)
	f.drain(f.engine(time.Minute))
	require.Equal(t, 1, f.statusCount(tick, db.WorkflowRunStatusWaitingApproval, ""))
	second := f.store(f.sign(owner, workflow.KindManualTrigger, "again", nostr.Tags{{"d", tick}}))
	require.Regexp(t, `^response:\{"run_id":"[0-9a-f-]{36}","status":"failed","error_code":"capacity_exceeded"\}$`, second)

	f.clock.Advance(time.Hour)
	s := workflow.NewScheduler(f.pool, clock.Stub(f.clock.Now), time.Hour, nil, nil)
	s.MaxUnfinishedRuns, s.Metrics = 1, f.metrics
	n, err := s.Tick(f.ctx)
	require.NoError(t, err)
	require.Zero(t, n, "nothing queued")
	require.Equal(t, 2, f.statusCount(tick, db.WorkflowRunStatusFailed, "capacity_exceeded"))
	require.Equal(t, 1, f.count(`SELECT count(*) FROM scheduled_workflow_fires f JOIN workflow_runs r ON r.id = f.workflow_run_id
		WHERE f.workflow_id = $1 AND r.error_code = 'capacity_exceeded'`, tick), "the slot is claimed with its failed run")
	n, err = s.Tick(f.ctx)
	require.NoError(t, err)
	require.Zero(t, n)
	require.Equal(t, 2, f.statusCount(tick, db.WorkflowRunStatusFailed, "capacity_exceeded"), "a refused slot is not fired again")
	require.Equal(t, 2.0, f.runsTotal("failed", "capacity_exceeded"))

	// Webhook.
	hook := uuid.NewString()
	secret := f.saveHook(owner, ch, hook, "name: Hook\ntrigger: {on: webhook}\nsteps: [{id: say, action: send_message, text: hooked}]")
	hooks := &workflow.Webhooks{Pool: f.pool, Clock: clock.Stub(f.clock.Now), MaxUnfinishedRuns: 1, Metrics: f.metrics}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /hooks/{id}", func(w http.ResponseWriter, r *http.Request) { hooks.Serve(w, r, f.tenant.ID()) })
	call := func(key string) (int, map[string]string) {
		req := httptest.NewRequest(http.MethodPost, "/hooks/"+hook, strings.NewReader(`{"a":"b"}`))
		req.Header.Set("X-Webhook-Secret", secret)
		if key != "" {
			req.Header.Set("Idempotency-Key", key)
		}
		rec := httptest.NewRecorder()
		mux.ServeHTTP(rec, req)
		var body map[string]string
		require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &body), rec.Body.String())
		return rec.Code, body
	}
	code, queued := call("k1")
	require.Equal(t, http.StatusAccepted, code)
	require.Equal(t, "pending", queued["status"])
	code, refused := call("k2")
	require.Equal(t, http.StatusTooManyRequests, code)
	require.Equal(t, map[string]string{
		"run_id": refused["run_id"], "workflow_id": hook, "status": "failed", "error_code": "capacity_exceeded",
		"error": "rate-limited: the workflow has its limit of unfinished runs; try again once some end",
	}, refused)
	require.Equal(t, 1, f.statusCount(hook, db.WorkflowRunStatusFailed, "capacity_exceeded"))
	code, again := call("k1")
	require.Equal(t, http.StatusAccepted, code, "a key that queued returns its run, even at capacity")
	require.Equal(t, queued["run_id"], again["run_id"])

	f.drain(f.engine(time.Minute))
	code, retried := call("k2")
	require.Equal(t, http.StatusAccepted, code, "the refused call's key was not kept")
	require.NotEqual(t, refused["run_id"], retried["run_id"])
	require.Equal(t, 3.0, f.runsTotal("failed", "capacity_exceeded"))
}

// A webhook body whose field name or text holds NUL (which the jsonb
// trigger context cannot hold) is refused with 400 and a JSON error
// naming it; no run is created. A NUL escape inside a non-string value
// stays JSON text and is accepted.
//
// Mutation killed: without the check, the run insert fails and the call
// is answered 503 "database unavailable".
func TestWebhookBodyWithNULIsRefused(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	owner := f.key()
	ch := f.channel(owner)
	hook := uuid.NewString()
	secret := f.saveHook(owner, ch, hook, "name: Hook\ntrigger: {on: webhook}\nsteps: [{id: say, action: send_message, text: hooked}]")
	hooks := &workflow.Webhooks{Pool: f.pool, Clock: clock.Stub(f.clock.Now)}
	call := func(body string) (int, string) {
		req := httptest.NewRequest(http.MethodPost, "/hooks/"+hook, strings.NewReader(body))
		req.SetPathValue("id", hook)
		req.Header.Set("X-Webhook-Secret", secret)
		rec := httptest.NewRecorder()
		hooks.Serve(rec, req, f.tenant.ID())
		return rec.Code, rec.Body.String()
	}
	for _, body := range []string{`{"a":"x\u0000y"}`, `{"a\u0000":"b"}`, `{"a\u0000":1}`} {
		code, answer := call(body)
		require.Equal(t, http.StatusBadRequest, code, body)
		require.JSONEq(t, `{"error":"invalid: JSON body: fields must not contain NUL characters (\\u0000)"}`, answer, body)
	}
	require.Empty(t, f.runIDs(hook))
	code, answer := call(`{"a":["x\u0000y"]}`)
	require.Equal(t, http.StatusAccepted, code, answer)
}

// A webhook call refused at capacity says when to retry: a slot frees only
// when one of the workflow's runs ends, and none can end before the
// soonest is due. The one unfinished run waits out a 120 s delay, so
// Retry-After is 120 s, then 20 s once 100 s have passed on the database's
// clock (the stubbed one); with a run due now, 1 s.
//
// Mutation killed: no Retry-After on the capacity answer (the header is
// empty); a fixed 1 s (120 expected).
func TestCapacityAnswerSaysWhenARunCanEnd(t *testing.T) {
	t.Parallel()
	f := newFixtureMax(t, 1)
	owner := f.key()
	ch := f.channel(owner)
	hook := uuid.NewString()
	secret := f.saveHook(owner, ch, hook, "name: Slow\ntrigger: {on: webhook}\nsteps: [{id: wait, action: delay, duration: 120s}, {id: say, action: send_message, text: done}]")
	hooks := &workflow.Webhooks{Pool: f.pool, Clock: clock.Stub(f.clock.Now), MaxUnfinishedRuns: 1, Metrics: f.metrics}
	call := func() (int, string) {
		req := httptest.NewRequest(http.MethodPost, "/hooks/"+hook, strings.NewReader(`{}`))
		req.SetPathValue("id", hook)
		req.Header.Set("X-Webhook-Secret", secret)
		rec := httptest.NewRecorder()
		hooks.Serve(rec, req, f.tenant.ID())
		return rec.Code, rec.Header().Get("Retry-After")
	}
	code, _ := call()
	require.Equal(t, http.StatusAccepted, code)
	code, retry := call()
	require.Equal(t, http.StatusTooManyRequests, code)
	require.Equal(t, "1", retry, "the queued run is due: it may end at any moment")

	f.drain(f.engine(time.Minute)) // the run starts its delay
	code, retry = call()
	require.Equal(t, http.StatusTooManyRequests, code)
	require.Equal(t, "120", retry, "the run cannot end before its delay does")
	f.clock.Advance(100 * time.Second)
	_, retry = call()
	require.Equal(t, "20", retry)
}

// The capacity answer's Retry-After reads a few of the workflow's runs, not
// all of its unfinished ones (up to the bound, 1,000 by default): one
// index probe for a run that may end at any moment (running or awaiting an
// approval) and one for the soonest due pending run. Rows read are
// PostgreSQL's count for the query's own transaction.
//
// Mutation killed: the soonest end as a min() over every unfinished run
// (the query before; it reads all 1,000 runs).
func TestCapacityAnswerReadsAFewRuns(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	owner := f.key()
	workflowID := uuid.NewString()
	f.save(owner, f.channel(owner), workflowID, twoSteps)
	const unfinished = 1000
	// Delayed runs, the soonest due in 100 s.
	_, err := f.pool.Exec(f.ctx, `
		INSERT INTO workflow_runs (community_id, id, workflow_id, run_at)
		SELECT $1, gen_random_uuid(), $2, now() + interval '100 seconds' + i * interval '1 second'
		FROM generate_series(0, $3::int - 1) AS i`, f.tenant.ID(), workflowID, unfinished)
	require.NoError(t, err)
	_, err = f.pool.Exec(f.ctx, `ANALYZE workflow_runs`)
	require.NoError(t, err)
	soonest := func() (time.Duration, int64) {
		t.Helper()
		tx, err := f.pool.Begin(f.ctx)
		require.NoError(t, err)
		defer func() { _ = tx.Rollback(f.ctx) }()
		before := dbtest.RowsRead(t, tx, "workflow_runs")
		row, err := db.New(tx).WorkflowRunSoonestEnd(f.ctx, db.WorkflowRunSoonestEndParams{CommunityID: f.tenant.ID(), WorkflowID: uuid.MustParse(workflowID)})
		require.NoError(t, err)
		return row.Soonest.Sub(row.Now), dbtest.RowsRead(t, tx, "workflow_runs") - before
	}
	wait, read := soonest()
	require.Greater(t, wait, 99*time.Second)
	require.LessOrEqual(t, wait, 100*time.Second)
	require.Less(t, read, int64(10), "rows read of %d unfinished runs", unfinished)

	// One run awaits an approval: it may end at any moment.
	_, err = f.pool.Exec(f.ctx, `UPDATE workflow_runs SET status = 'waiting_approval'
		WHERE id = (SELECT id FROM workflow_runs WHERE workflow_id = $1 ORDER BY run_at DESC LIMIT 1)`, workflowID)
	require.NoError(t, err)
	wait, read = soonest()
	require.Zero(t, wait)
	require.Less(t, read, int64(10), "rows read of %d unfinished runs", unfinished)
}
