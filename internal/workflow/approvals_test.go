package workflow_test

import (
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/buzzrelay/buzz/internal/clock"
	"github.com/buzzrelay/buzz/internal/db"
	"github.com/buzzrelay/buzz/internal/ingest"
	"github.com/buzzrelay/buzz/internal/nostr"
	"github.com/buzzrelay/buzz/internal/workflow"
)

// approvalRun saves a two-step workflow whose first step asks approver
// (an approver spec) and whose second posts "approved", triggers it and
// runs it to the approval; it returns the run and the approval reference.
func (f *fixture) approvalRun(owner *nostr.SecretKey, ch, from string) (uuid.UUID, string) {
	f.t.Helper()
	id := uuid.NewString()
	f.save(owner, ch, id, "name: A\ntrigger: {on: message_posted}\nsteps:\n"+
		"  - {id: ask, action: request_approval, from: '"+from+"', message: 'ok to ship?', timeout: 1h}\n"+
		"  - {id: go, action: send_message, text: approved}\n")
	f.store(f.sign(owner, ingest.KindChat, "ship "+id, nostr.Tags{{"h", ch}}))
	run := f.runIDs(id)[0]
	f.drain(f.engine(time.Minute))
	require.Equal(f.t, db.WorkflowRunStatusWaitingApproval, f.run(run).Status)
	var ref string
	require.NoError(f.t, f.pool.QueryRow(f.ctx, `SELECT encode(token, 'hex') FROM workflow_approvals WHERE run_id = $1`, run).Scan(&ref))
	return run, ref
}

// request_approval parks the run waiting for a decision and posts a
// relay-signed 46010 naming the approval by its stored hash; a grant by
// the named approver resumes the run at the next step, and the OK message
// carries the run id. Mutations killed: a grant that does not make the run
// due again leaves it waiting; an approver check that accepts anyone fails
// the stranger's refusal.
func TestApprovalGrantResumes(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	owner, approver, stranger := f.key(), f.key(), f.key()
	ch := f.channel(owner, approver, stranger)
	run, ref := f.approvalRun(owner, ch, pubHex(approver))
	bells := f.doorbells(run)
	require.Len(t, bells, 1)
	require.Equal(t, workflow.KindApprovalRequested, bells[0].Kind)
	require.Contains(t, bells[0].Tags, nostr.Tag{"approval", ref})

	f.rejected(f.sign(stranger, workflow.KindApprovalGrant, "", nostr.Tags{{"d", ref}}), "restricted: not the approver of this step")
	reply := f.store(f.sign(approver, workflow.KindApprovalGrant, "", nostr.Tags{{"d", ref}}))
	require.Equal(t, `response:{"run_id":"`+run.String()+`","status":"granted"}`, reply)
	f.rejected(f.sign(approver, workflow.KindApprovalDeny, "", nostr.Tags{{"d", ref}}), "invalid: approval already granted")

	f.drain(f.engine(time.Minute))
	require.Equal(t, db.WorkflowRunStatusCompleted, f.run(run).Status)
	require.ElementsMatch(t, []string{"ok to ship?", "", "approved"}, contents(f.doorbells(run)), "request, granted notice, next step")
}

// A decision is announced in the channel, in the decision's transaction:
// a relay-signed 46011 (granted) or 46012 (denied) naming the approval by
// its hash, the run and step, and the approver's signed decision as
// evidence; it p-tags nobody, so it wakes nobody. Mutations killed: not
// emitting the notice fails "kind 46011"; emitting the grant's kind for a
// denial fails "kind 46012".
func TestApprovalDecisionIsAnnounced(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	owner, approver := f.key(), f.key()
	ch := f.channel(owner, approver)
	relayKey, err := f.p.RelayKey(f.ctx, f.tenant.ID())
	require.NoError(t, err)
	for _, c := range []struct {
		decide, notice int
	}{{workflow.KindApprovalGrant, workflow.KindApprovalGranted}, {workflow.KindApprovalDeny, workflow.KindApprovalDenied}} {
		run, ref := f.approvalRun(owner, ch, pubHex(approver))
		decision := f.sign(approver, c.decide, "", nostr.Tags{{"d", ref}})
		f.store(decision)
		var notices []*nostr.Event
		for _, ev := range f.doorbells(run) {
			if ev.Kind == c.notice {
				notices = append(notices, ev)
			}
		}
		require.Len(t, notices, 1, "kind %d", c.notice)
		require.Equal(t, pubHex(relayKey), notices[0].PubKey)
		require.Equal(t, nostr.Tags{
			{"workflow-run", run.String()},
			{"workflow-step", "ask"},
			{"approval", ref},
			{"e", decision.ID},
			{"h", ch},
			{"buzz:workflow", "doorbell-v1"},
		}, notices[0].Tags)
		require.Equal(t, 1, f.count(`SELECT count(*) FROM events WHERE encode(id, 'hex') = $1 AND channel_id = $2`, notices[0].ID, uuid.MustParse(ch)),
			"stored in the workflow's channel")
	}
}

// A denial cancels the run with approval_denied, counted in
// buzz_workflow_runs_total; an unsupported approver spec fails closed;
// clients cannot publish the relay's lifecycle kinds. Mutation killed: not
// counting the denial (it ends in the decision's transaction, not in a
// worker) fails the metric check.
func TestApprovalDenyAndFailClosed(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	owner, member := f.key(), f.key()
	ch := f.channel(owner, member)
	run, ref := f.approvalRun(owner, ch, "any")
	reply := f.store(f.sign(member, workflow.KindApprovalDeny, "", nostr.Tags{{"d", ref}}))
	require.Equal(t, `response:{"run_id":"`+run.String()+`","status":"denied"}`, reply)
	denied := f.run(run)
	require.Equal(t, db.WorkflowRunStatusCancelled, denied.Status)
	require.Equal(t, "approval_denied", *denied.ErrorCode)
	require.Equal(t, "workflow cancelled: approval denied by "+pubHex(member), *denied.ErrorMessage)
	require.Equal(t, 1.0, f.runsTotal("cancelled", "approval_denied"), "a denied run is counted")

	_, ref2 := f.approvalRun(owner, ch, "@leads")
	f.rejected(f.sign(owner, workflow.KindApprovalGrant, "", nostr.Tags{{"d", ref2}}), "restricted: approver spec '@leads' is not yet supported")
	f.rejected(f.sign(owner, workflow.KindApprovalGrant, "", nostr.Tags{{"d", uuid.NewString()}}), "invalid: bad approval reference format")
	f.rejected(f.sign(owner, workflow.KindApprovalRequested, "", nostr.Tags{{"h", ch}}), "restricted: only the relay publishes kind 46010")
}

// An approval nobody decided expires: the run fails with approval_expired
// and a late grant is refused. Mutations killed: an expiry sweep that does
// not end the waiting run leaves it waiting_approval; one that does not
// count it fails the metric check.
func TestApprovalExpires(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	owner := f.key()
	ch := f.channel(owner)
	run, ref := f.approvalRun(owner, ch, "")
	f.clock.Advance(time.Hour)
	n, err := workflow.ExpireApprovals(f.ctx, f.pool, clock.Stub(f.clock.Now), f.metrics)
	require.NoError(t, err)
	require.Equal(t, 1, n)
	expired := f.run(run)
	require.Equal(t, db.WorkflowRunStatusFailed, expired.Status)
	require.Equal(t, "approval_expired", *expired.ErrorCode)
	require.Equal(t, 1.0, f.runsTotal("failed", "approval_expired"), "an expired run is counted")
	f.rejected(f.sign(owner, workflow.KindApprovalGrant, "", nostr.Tags{{"d", ref}}), "invalid: approval already expired")
}

// A grant or denial is stored in the run's channel, so the decider must
// pass the channel write check every event with an h tag passes; "any"
// approver means any member who may write there. An outsider and a member
// removed from the private channel are answered as for an unknown
// reference, even when the spec names them, nothing is stored and the run
// keeps waiting; a current member's decision still works.
//
// Mutation killed: binding the decision to the channel without the write
// check lets the outsider's grant (arbitrary content and p tags) into the
// private channel and resumes the run.
func TestApprovalDecisionNeedsChannelWrite(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	owner, member, removed, outsider, victim := f.key(), f.key(), f.key(), f.key(), f.key()
	ch := f.privateChannel(owner, member, removed)
	run, ref := f.approvalRun(owner, ch, "any")
	named, namedRef := f.approvalRun(owner, ch, pubHex(removed))
	f.store(f.sign(owner, ingest.KindRemoveUser, "", nostr.Tags{{"h", ch}, {"p", pubHex(removed)}}))

	for _, c := range []struct {
		key *nostr.SecretKey
		ref string
	}{{outsider, ref}, {removed, ref}, {removed, namedRef}} {
		for _, kind := range []int{workflow.KindApprovalGrant, workflow.KindApprovalDeny} {
			ev := f.sign(c.key, kind, "injected", nostr.Tags{{"d", c.ref}, {"p", pubHex(victim)}})
			f.rejected(ev, "invalid: approval not found")
			require.Zero(t, f.count(`SELECT count(*) FROM events WHERE encode(id, 'hex') = $1`, ev.ID))
		}
	}
	require.Zero(t, f.count(`SELECT count(*) FROM event_mentions WHERE pubkey_hex = $1`, pubHex(victim)))
	require.Equal(t, db.WorkflowRunStatusWaitingApproval, f.run(run).Status)
	require.Equal(t, db.WorkflowRunStatusWaitingApproval, f.run(named).Status)

	reply := f.store(f.sign(member, workflow.KindApprovalGrant, "", nostr.Tags{{"d", ref}}))
	require.Equal(t, `response:{"run_id":"`+run.String()+`","status":"granted"}`, reply)
}
