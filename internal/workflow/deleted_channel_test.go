package workflow_test

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/buzzrelay/buzz/internal/clock"
	"github.com/buzzrelay/buzz/internal/ingest"
	"github.com/buzzrelay/buzz/internal/nostr"
	"github.com/buzzrelay/buzz/internal/workflow"
)

// A deleted channel's workflows start no runs: its schedule fires no slot
// and its webhook answers 409, as for a disabled workflow. Before, each
// slot (every second, for a per-second cron) and each call created a run
// that could only fail (the channel is gone), for as long as the relay
// ran, and nobody could read that history: run history needs read access
// to the channel.
//
// Mutations killed: WorkflowsScheduled without its live-channel condition
// fires the slots ("no slot of a deleted channel"); the webhook without
// its channel check answers 202 and creates a run.
func TestADeletedChannelsWorkflowsStartNoRuns(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	owner := f.key()
	ch := f.channel(owner)
	tick := func() int {
		n, err := workflow.NewScheduler(f.pool, clock.Stub(f.clock.Now), 10*time.Minute, nil, nil).Tick(f.ctx)
		require.NoError(t, err)
		return n
	}
	scheduled, hook := uuid.NewString(), uuid.NewString()
	f.save(owner, ch, scheduled, "name: Tick\ntrigger: {on: schedule, interval: 60s}\nsteps: [{id: a, action: send_message, text: tick}]")
	secret := f.saveHook(owner, ch, hook, "name: Hook\ntrigger: {on: webhook}\nsteps: [{id: say, action: send_message, text: hooked}]")
	hooks := &workflow.Webhooks{Pool: f.pool, Clock: clock.Stub(f.clock.Now)}
	call := func() (int, string) {
		req := httptest.NewRequest(http.MethodPost, "/hooks/"+hook, strings.NewReader(`{}`))
		req.SetPathValue("id", hook)
		req.Header.Set("X-Webhook-Secret", secret)
		rec := httptest.NewRecorder()
		hooks.Serve(rec, req, f.tenant.ID())
		return rec.Code, rec.Body.String()
	}

	// While the channel lives, both start runs.
	f.clock.Advance(time.Minute)
	require.Equal(t, 1, tick())
	code, answer := call()
	require.Equal(t, http.StatusAccepted, code, answer)

	f.store(f.sign(owner, ingest.KindDeleteGroup, "", nostr.Tags{{"h", ch}}))
	f.clock.Advance(3 * time.Minute)
	require.Zero(t, tick(), "no slot of a deleted channel's schedule fires")
	require.Len(t, f.runIDs(scheduled), 1)
	code, answer = call()
	require.Equal(t, http.StatusConflict, code, answer)
	require.JSONEq(t, `{"error":"invalid: workflow is not accepting webhook calls"}`, answer)
	require.Len(t, f.runIDs(hook), 1)
}

// A run waiting for an approval in a channel that is then deleted ends at
// once, failed with approval_expired, and is counted: a decision is stored
// in the channel, so nobody could decide any more, and the run would wait
// out the approval's timeout (the owner's choice, unbounded) holding a
// place in its workflow's bound on unfinished runs.
//
// Mutation killed: without the deletion's side rows the run stays
// waiting_approval and its approval pending.
func TestDeletingAChannelEndsItsRunsWaitingForApproval(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	owner, member := f.key(), f.key()
	ch, other := f.channel(owner, member), f.channel(owner, member)
	run, ref := f.approvalRun(owner, ch, "any")
	elsewhere, _ := f.approvalRun(owner, other, "any")

	f.store(f.sign(owner, ingest.KindDeleteGroup, "", nostr.Tags{{"h", ch}}))
	f.failedWith(run, workflow.CodeApprovalExpired, "channel was deleted")
	require.Equal(t, 1.0, f.runsTotal("failed", string(workflow.CodeApprovalExpired)))
	var status string
	require.NoError(t, f.pool.QueryRow(f.ctx, `SELECT status FROM workflow_approvals WHERE encode(token, 'hex') = $1`, ref).Scan(&status))
	require.Equal(t, "expired", status)
	require.Equal(t, "waiting_approval", string(f.run(elsewhere).Status), "another channel's run still waits")
}

// A run that reaches request_approval after its channel was deleted or
// archived fails there, as a send_message step into that channel does,
// and stores nothing. It used to post the relay-signed 46010 into the
// deleted (or archived, frozen) channel and wait, its approval pending,
// for the approval's timeout (up to a week, holding a place in its
// workflow's bound on unfinished runs): a decision is stored in the
// channel, so nobody could decide it, and the deletion, which ends the
// waits it finds, had come before this one began. A run parked by a
// `delay` when the channel goes is how one gets there.
//
// Mutation killed: requestApproval without its channel check leaves both
// runs waiting_approval, each with a pending approval and a 46010 stored.
func TestApprovalStepInAChannelGoneFailsTheRun(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name, code, message string
		gone                func(f *fixture, owner *nostr.SecretKey, ch string)
	}{
		{"deleted", string(workflow.CodeOwnerUnauthorized), "step ask: the channel does not exist or is private to its members",
			func(f *fixture, owner *nostr.SecretKey, ch string) {
				f.store(f.sign(owner, ingest.KindDeleteGroup, "", nostr.Tags{{"h", ch}}))
			}},
		{"archived", string(workflow.CodeWebhookFailed), "step ask: channel is archived",
			func(f *fixture, _ *nostr.SecretKey, ch string) {
				_, err := f.pool.Exec(f.ctx, `UPDATE channels SET archived_at = now() WHERE id = $1`, uuid.MustParse(ch))
				require.NoError(t, err)
			}},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			f := newFixture(t)
			owner := f.key()
			ch := f.channel(owner)
			id := uuid.NewString()
			f.save(owner, ch, id, "name: A\ntrigger: {on: message_posted}\nsteps:\n"+
				"  - {id: wait, action: delay, duration: 5s}\n"+
				"  - {id: ask, action: request_approval, message: 'ok?', timeout: 1h}\n")
			f.store(f.sign(owner, ingest.KindChat, "go", nostr.Tags{{"h", ch}}))
			run := f.runIDs(id)[0]
			e := f.engine(time.Minute)
			f.drain(e)
			require.Equal(t, "pending", string(f.run(run).Status), "parked by the delay")

			c.gone(f, owner, ch)
			f.clock.Advance(10 * time.Second)
			f.drain(e)
			r := f.run(run)
			require.Equal(t, "failed", string(r.Status))
			require.Equal(t, c.code, *r.ErrorCode)
			require.Equal(t, c.message, *r.ErrorMessage)
			require.Zero(t, f.count(`SELECT count(*) FROM workflow_approvals WHERE run_id = $1`, run), "no approval asked for")
			require.Zero(t, f.count(`SELECT count(*) FROM events WHERE kind = $1 AND channel_id = $2`,
				workflow.KindApprovalRequested, uuid.MustParse(ch)), "no request posted into the channel")
		})
	}
}
