package workflow_test

import (
	"context"
	"encoding/hex"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/buzzrelay/buzz/internal/logtest"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/buzzrelay/buzz/internal/clock"
	"github.com/buzzrelay/buzz/internal/db"
	"github.com/buzzrelay/buzz/internal/fanout"
	"github.com/buzzrelay/buzz/internal/ingest"
	"github.com/buzzrelay/buzz/internal/nostr"
	"github.com/buzzrelay/buzz/internal/workflow"
)

// approvalRun saves a two-step workflow whose first step asks approver
// (an approver spec) and whose second posts "approved", triggers it and
// runs it to the approval; it returns the run and the approval reference.
func (f *fixture) approvalRun(owner *nostr.SecretKey, ch, from string) (uuid.UUID, string) {
	f.t.Helper()
	run, ref := f.approvalRunOf(owner, ch, uuid.NewString(), from)
	return run, ref
}

// approvalYAML is approvalRun's definition.
func approvalYAML(from string) string {
	return "name: A\ntrigger: {on: message_posted}\nsteps:\n" +
		"  - {id: ask, action: request_approval, from: '" + from + "', message: 'ok to ship?', timeout: 1h}\n" +
		"  - {id: go, action: send_message, text: approved}\n"
}

// approvalRunOf is approvalRun for the workflow id.
func (f *fixture) approvalRunOf(owner *nostr.SecretKey, ch, id, from string) (uuid.UUID, string) {
	f.t.Helper()
	f.save(owner, ch, id, approvalYAML(from))
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
	n, err := workflow.ExpireApprovals(f.ctx, f.pool, clock.Stub(f.clock.Now), f.metrics, nil)
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

// approvalStatus reads an approval's status and note.
func (f *fixture) approvalStatus(ref string) (status, note string) {
	f.t.Helper()
	var n *string
	require.NoError(f.t, f.pool.QueryRow(f.ctx, `SELECT status::text, note FROM workflow_approvals WHERE encode(token, 'hex') = $1`, ref).Scan(&status, &n))
	if n != nil {
		note = *n
	}
	return status, note
}

// noticesOf counts the relay's decision notices (46011, 46012) of run.
func (f *fixture) noticesOf(run uuid.UUID) int {
	n := 0
	for _, ev := range f.doorbells(run) {
		if ev.Kind == workflow.KindApprovalGranted || ev.Kind == workflow.KindApprovalDenied {
			n++
		}
	}
	return n
}

// An approval whose workflow was archived, saved again, disabled or whose
// definition event was deleted cannot be decided: the decision is refused
// at once with the reason, and nothing of it is stored. Archiving, saving
// again and the owner's removal also end the run's wait in their own
// transaction (the approval expires with the reason as its note, the run
// fails with workflow_disabled or invalid_definition), instead of leaving
// it waiting for a grant that could only fail it.
//
// Mutations killed: without decidable, the grant after the deletion is
// accepted (the archive, re-save and disable ones answer "approval already
// expired"); without the withdrawal on archive, on re-save or on the
// owner's removal (OwnerRemoval's side rows), the run stays
// waiting_approval.
func TestApprovalOfAnArchivedOrResavedWorkflowIsRefused(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	owner, member, approver := f.key(), f.key(), f.key()
	ch := f.channel(owner, member, approver)
	grant := func(ref string) *nostr.Event {
		return f.sign(approver, workflow.KindApprovalGrant, "", nostr.Tags{{"d", ref}})
	}

	archived := uuid.NewString()
	run, ref := f.approvalRunOf(owner, ch, archived, "any")
	f.store(f.sign(owner, nostr.KindDeletion, "", nostr.Tags{{"a", "30620:" + pubHex(owner) + ":" + archived}}))
	r := f.run(run)
	require.Equal(t, db.WorkflowRunStatusFailed, r.Status)
	require.Equal(t, "workflow_disabled", *r.ErrorCode)
	require.Equal(t, "the workflow was archived while the run waited for approval", *r.ErrorMessage)
	status, note := f.approvalStatus(ref)
	require.Equal(t, "expired", status)
	require.Equal(t, *r.ErrorMessage, note)
	f.rejected(grant(ref), "invalid: the workflow was archived; its run no longer waits for this approval")
	require.Equal(t, 1.0, f.runsTotal("failed", "workflow_disabled"), "the ended run is counted")

	resaved := uuid.NewString()
	run, ref = f.approvalRunOf(owner, ch, resaved, "any")
	f.clock.Advance(time.Second) // a newer created_at replaces the definition
	f.save(owner, ch, resaved, approvalYAML("any"))
	r = f.run(run)
	require.Equal(t, db.WorkflowRunStatusFailed, r.Status)
	require.Equal(t, "invalid_definition", *r.ErrorCode)
	status, _ = f.approvalStatus(ref)
	require.Equal(t, "expired", status)
	f.rejected(grant(ref), "invalid: the workflow was saved again since this approval was requested; its run no longer waits for it")

	// The owner's removal disables the workflow (a trigger of the database)
	// and, in the same transaction, ends the run's wait.
	disabled := uuid.NewString()
	run, ref = f.approvalRunOf(member, ch, disabled, "any")
	f.store(f.sign(owner, ingest.KindRemoveUser, "", nostr.Tags{{"h", ch}, {"p", pubHex(member)}}))
	r = f.run(run)
	require.Equal(t, db.WorkflowRunStatusFailed, r.Status)
	require.Equal(t, "workflow_disabled", *r.ErrorCode)
	require.Equal(t, ownerLeftReason, *r.ErrorMessage)
	status, note = f.approvalStatus(ref)
	require.Equal(t, "expired", status)
	require.Equal(t, ownerLeftReason, note)
	require.Equal(t, 2.0, f.runsTotal("failed", "workflow_disabled"), "the archived run and this one are counted")
	f.rejected(grant(ref), ownerLeftRefusal)

	// The definition event deleted by id archives the workflow, as its
	// coordinate does, and ends the run's wait.
	deleted := uuid.NewString()
	run, ref = f.approvalRunOf(owner, ch, deleted, "any")
	var defID string
	require.NoError(t, f.pool.QueryRow(f.ctx, `SELECT encode(definition_event_id, 'hex') FROM workflows WHERE id = $1`, deleted).Scan(&defID))
	f.store(f.sign(owner, nostr.KindDeletion, "", nostr.Tags{{"e", defID}}))
	r = f.run(run)
	require.Equal(t, db.WorkflowRunStatusFailed, r.Status)
	require.Equal(t, "workflow_disabled", *r.ErrorCode)
	f.rejected(grant(ref), "invalid: the workflow was archived; its run no longer waits for this approval")

	require.Zero(t, f.count(`SELECT count(*) FROM events WHERE community_id = $1 AND kind IN (46030, 46011)`, f.tenant.ID()), "no refused decision is stored")
}

// An archive and a grant of its workflow's approval, sent at once, many
// times: each pair ends one way or the other, never half. Either the grant
// committed first (the approval is granted, its notice posted, and the run,
// due again, fails at its next step because the workflow is archived), or
// the archive did (the approval expired with the archive's reason, the run
// failed workflow_disabled, the grant refused with the archive's reason and
// nothing of it stored).
//
// Mutation killed: the decision's workflow read before its approval's
// lock (WorkflowApprovalLockForDecision): a grant that read the row before
// the archive committed goes on, and is refused for a reason that is not
// the archive ("the workflow's definition was deleted", "approval already
// expired").
func TestApprovalDecisionRacingTheArchiveHasOneOutcome(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	owner, approver := f.key(), f.key()
	ch := f.channel(owner, approver)
	// The archive goes through a second pipeline on the same database, as
	// from another relay process: one pipeline's group commit would write
	// the two events one after the other, or in one transaction.
	other := ingest.New(f.pool, fanout.NewHub(), ingest.Options{MaxFutureSkew: time.Minute, Clock: clock.Stub(f.clock.Now)})
	workflow.RegisterTriggers(other, &workflow.Triggers{})
	const rounds = 30
	type pair struct {
		workflowID string
		run        uuid.UUID
		ref        string
	}
	pairs := make([]pair, rounds)
	outcomes := map[string]int{}
	for i := range pairs {
		// One at a time: the channel holds 20 firing workflows, and each
		// round archives its own.
		p := &pairs[i]
		p.workflowID = uuid.NewString()
		p.run, p.ref = f.approvalRunOf(owner, ch, p.workflowID, "any")
		grantEv := f.sign(approver, workflow.KindApprovalGrant, "", nostr.Tags{{"d", p.ref}})
		archiveEv := f.sign(owner, nostr.KindDeletion, "", nostr.Tags{{"a", "30620:" + pubHex(owner) + ":" + p.workflowID}})
		grantErr, archiveErr := f.submitWith(other, grantEv, archiveEv)
		require.NoError(t, archiveErr)
		status, note := f.approvalStatus(p.ref)
		r := f.run(p.run)
		if grantErr == nil {
			outcomes["granted first"]++
			require.Equal(t, "granted", status)
			require.Equal(t, db.WorkflowRunStatusPending, r.Status, "granted: due again")
			require.Equal(t, 1, f.noticesOf(p.run))
			continue
		}
		outcomes["archived first"]++
		require.EqualError(t, grantErr, "invalid: the workflow was archived; its run no longer waits for this approval")
		require.Equal(t, "expired", status)
		require.Equal(t, "the workflow was archived while the run waited for approval", note)
		require.Equal(t, db.WorkflowRunStatusFailed, r.Status)
		require.Equal(t, "workflow_disabled", *r.ErrorCode)
		require.Zero(t, f.noticesOf(p.run))
		require.Zero(t, f.count(`SELECT count(*) FROM events WHERE encode(id, 'hex') = $1`, grantEv.ID))
	}
	t.Logf("outcomes: %v", outcomes)
	// Every granted run fails at its next step: its workflow is archived.
	f.drain(f.engine(time.Minute))
	for _, p := range pairs {
		r := f.run(p.run)
		require.Equal(t, db.WorkflowRunStatusFailed, r.Status)
		require.Equal(t, "workflow_disabled", *r.ErrorCode)
	}
}

// What a disabled workflow's waiting run and its decision are told: the
// approval's note and the run's diagnostic, and the refusal of a decision.
const (
	ownerLeftReason  = "the workflow was disabled while the run waited for approval: its owner is no longer a member of the channel"
	ownerLeftRefusal = "invalid: the workflow is disabled (its owner is no longer a member of the channel); its run no longer waits for this approval"
)

// The owner leaving the channel and a grant of their workflow's approval,
// sent at once, many times: each pair ends one way or the other. Either
// the grant committed first (granted, its notice posted, the run due again
// and failing at its next step because its workflow is disabled), or the
// leave did: in its own transaction the workflow was disabled, the
// approval expired with the reason as its note and the run failed
// workflow_disabled, so nobody waits on an approval that can never pass;
// the grant is refused with the reason and nothing of it is stored.
//
// Mutations killed: without OwnerRemoval's side rows, a leave that
// committed first leaves the approval pending and the run waiting; with the
// decision's workflow read before its approval's lock, a grant that read
// the workflow before the leave committed is refused "approval already
// expired", not with the reason.
func TestApprovalDecisionRacingTheOwnersLeavingHasOneOutcome(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	owner, approver := f.key(), f.key()
	ch := f.channel(owner, approver)
	// The leave goes through a second pipeline on the same database, as
	// from another relay process (one pipeline's group commit could put
	// the two in one transaction).
	other := ingest.New(f.pool, fanout.NewHub(), ingest.Options{MaxFutureSkew: time.Minute, Clock: clock.Stub(f.clock.Now)})
	workflow.RegisterTriggers(other, &workflow.Triggers{})
	const rounds = 30
	runs := make([]uuid.UUID, rounds)
	outcomes := map[string]int{}
	for i := range runs {
		// Each round's workflow belongs to a member who joins, saves it,
		// starts its run and then leaves.
		member := f.key()
		f.store(f.sign(member, ingest.KindJoinRequest, "", nostr.Tags{{"h", ch}}))
		run, ref := f.approvalRunOf(member, ch, uuid.NewString(), "any")
		runs[i] = run
		grantEv := f.sign(approver, workflow.KindApprovalGrant, "", nostr.Tags{{"d", ref}})
		leaveEv := f.sign(member, ingest.KindLeaveRequest, "", nostr.Tags{{"h", ch}})
		grantErr, leaveErr := f.submitWith(other, grantEv, leaveEv)
		require.NoError(t, leaveErr)
		status, note := f.approvalStatus(ref)
		r := f.run(run)
		if grantErr == nil {
			outcomes["granted first"]++
			require.Equal(t, "granted", status)
			require.Equal(t, db.WorkflowRunStatusPending, r.Status, "granted: due again")
			require.Equal(t, 1, f.noticesOf(run))
			continue
		}
		outcomes["left first"]++
		require.EqualError(t, grantErr, ownerLeftRefusal)
		require.Equal(t, "expired", status)
		require.Equal(t, ownerLeftReason, note)
		require.Equal(t, db.WorkflowRunStatusFailed, r.Status)
		require.Equal(t, "workflow_disabled", *r.ErrorCode)
		require.Equal(t, ownerLeftReason, *r.ErrorMessage)
		require.Zero(t, f.noticesOf(run))
		require.Zero(t, f.count(`SELECT count(*) FROM events WHERE encode(id, 'hex') = $1`, grantEv.ID))
	}
	t.Logf("outcomes: %v", outcomes)
	// Every granted run fails at its next step: its workflow is disabled.
	f.drain(f.engine(time.Minute))
	for _, run := range runs {
		r := f.run(run)
		require.Equal(t, db.WorkflowRunStatusFailed, r.Status)
		require.Equal(t, "workflow_disabled", *r.ErrorCode)
	}
	require.Zero(t, f.count(`SELECT count(*) FROM workflow_approvals WHERE community_id = $1 AND status = 'pending'`, f.tenant.ID()),
		"no approval is left waiting")
}

// A request_approval step racing a re-save of its workflow: the step read
// the workflow row before the save committed, so the run's pinned
// definition looked current; the step then reads the row again FOR SHARE,
// which waits for the save, and fails the run with invalid_definition
// instead of storing an approval under a definition just replaced (which
// nobody could decide, and which the save, having run first, did not
// withdraw). The save is played by a transaction of the test that moves
// the row's pinned event and holds its lock.
//
// Mutation killed: requestApproval without the locked re-read: the step
// stores the approval and the run waits for it.
func TestApprovalRequestRacingAResaveFailsTheRun(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	owner := f.key()
	ch := f.channel(owner)
	id := uuid.NewString()
	f.save(owner, ch, id, approvalYAML("any"))
	f.store(f.sign(owner, ingest.KindChat, "ship", nostr.Tags{{"h", ch}}))
	run := f.runIDs(id)[0]

	resave, err := f.pool.Begin(f.ctx)
	require.NoError(t, err)
	defer func() { _ = resave.Rollback(f.ctx) }()
	_, err = resave.Exec(f.ctx, `UPDATE workflows SET definition_event_id = sha256(definition_event_id) WHERE id = $1`, id)
	require.NoError(t, err)

	e := f.engine(time.Minute)
	claims, err := e.ClaimDue(f.ctx, 1)
	require.NoError(t, err)
	require.Len(t, claims, 1)
	done := make(chan bool, 1)
	go func() { done <- e.Execute(f.ctx, claims[0]) }()
	require.Eventually(t, func() bool {
		return f.count(`SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()
			AND wait_event_type = 'Lock' AND query LIKE '%FOR SHARE%'`) > 0
	}, 30*time.Second, 10*time.Millisecond, "the step waits for the save")
	require.NoError(t, resave.Commit(f.ctx))
	require.True(t, <-done)

	r := f.run(run)
	require.Equal(t, db.WorkflowRunStatusFailed, r.Status)
	require.Equal(t, "invalid_definition", *r.ErrorCode)
	require.Zero(t, f.count(`SELECT count(*) FROM workflow_approvals WHERE run_id = $1`, run))
}

// An approval's timeout is at most a week (workflow.MaxApprovalTimeout). A
// definition asking for more is refused when saved, naming the field. One
// stored before the bound still runs: its approval expires a week after it
// was asked for (clamped and logged). An approval already pending with a
// longer expiry (asked for before the bound) is clamped by the expiry
// sweep, and expires a week after it was made.
//
// Mutations killed: ParseForSave without the bound accepts the 169h save;
// requestApproval without the clamp stores the stored definition's 1000h;
// ExpireApprovals without the clamp statement leaves the year-long approval
// pending past its week.
func TestApprovalTimeoutIsBounded(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	owner := f.key()
	ch := f.channel(owner)
	yaml := func(timeout string) string {
		return "name: A\ntrigger: {on: message_posted}\nsteps:\n" +
			"  - {id: ask, action: request_approval, message: 'ok?', timeout: " + timeout + "}\n"
	}
	f.rejected(f.sign(owner, workflow.KindDefinition, yaml("169h"), nostr.Tags{{"d", uuid.NewString()}, {"h", ch}}),
		"invalid: workflow YAML parse error: invalid definition: steps[0].timeout: must be at most 168h (7 days), got 169h")

	id := uuid.NewString()
	def, _ := f.save(owner, ch, id, yaml("168h"))
	// As if saved before the bound: the stored definition asks for 1000h.
	_, err := f.pool.Exec(f.ctx, `UPDATE events SET content = $2 WHERE id = decode($1, 'hex')`, def.ID, yaml("1000h"))
	require.NoError(t, err)
	f.store(f.sign(owner, ingest.KindChat, "go", nostr.Tags{{"h", ch}}))
	run := f.runIDs(id)[0]
	f.drain(f.engine(time.Minute))
	require.Equal(t, db.WorkflowRunStatusWaitingApproval, f.run(run).Status)
	var expires time.Time
	require.NoError(t, f.pool.QueryRow(f.ctx, `SELECT expires_at FROM workflow_approvals WHERE run_id = $1`, run).Scan(&expires))
	require.WithinDuration(t, f.clock.Now().Add(workflow.MaxApprovalTimeout), expires, time.Second, "clamped to a week")

	// An approval pending since before the bound, due in a year.
	_, err = f.pool.Exec(f.ctx, `UPDATE workflow_approvals SET expires_at = created_at + interval '1 year' WHERE run_id = $1`, run)
	require.NoError(t, err)
	n, err := workflow.ExpireApprovals(f.ctx, f.pool, clock.Stub(f.clock.Now), f.metrics, nil)
	require.NoError(t, err)
	require.Zero(t, n)
	f.clock.Advance(workflow.MaxApprovalTimeout)
	n, err = workflow.ExpireApprovals(f.ctx, f.pool, clock.Stub(f.clock.Now), f.metrics, nil)
	require.NoError(t, err)
	require.Equal(t, 1, n, "expired a week after it was asked for")
	require.Equal(t, "approval_expired", *f.run(run).ErrorCode)
}

// submitWith submits grant through f's pipeline and ev through other (a
// second pipeline on the same database, as another relay process) at the
// same instant, and returns what each answered.
func (f *fixture) submitWith(other *ingest.Pipeline, grant, ev *nostr.Event) (grantErr, evErr error) {
	var wg sync.WaitGroup
	start := make(chan struct{})
	wg.Go(func() { <-start; _, grantErr = f.submit(grant) })
	wg.Go(func() { <-start; _, _, evErr = other.SubmitReply(f.ctx, f.tenant, ev.PubKey, ev) })
	close(start)
	wg.Wait()
	return grantErr, evErr
}

// A request_approval step and the removal of its workflow's owner, in
// flight together: the removal holds the channel (its row and its write
// lock exclusive) while the step checks the channel; the removal then
// removes the owner, whose trigger disables the owner's workflows. The step
// checks the channel before it locks the workflow row, so it waits holding
// nothing the removal needs, and once the removal commits the run fails
// workflow_disabled, with no deadlock on the way.
// Mutation killed: the workflow row locked before the channel check, as it
// was: the step held the row FOR SHARE while waiting for the channel, the
// removal's trigger waited for that row, and the deadlock detector failed
// the step (40P01), whose transaction was then tried again.
func TestApprovalRequestRacingItsOwnersRemovalDoesNotDeadlock(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	owner, member := f.key(), f.key()
	ch := f.channel(owner, member)
	id := uuid.NewString()
	f.save(member, ch, id, approvalYAML("any"))
	f.store(f.sign(owner, ingest.KindChat, "ship", nostr.Tags{{"h", ch}}))
	run := f.runIDs(id)[0]
	logged := &logtest.Buffer{}
	e := workflow.NewEngine(f.pool, f.p, workflow.EngineOptions{Lease: time.Minute, Clock: clock.Stub(f.clock.Now), Metrics: f.metrics,
		Log: slog.New(slog.NewTextHandler(logged, nil))})
	claims, err := e.ClaimDue(f.ctx, 10)
	require.NoError(t, err)
	require.Len(t, claims, 1)

	channel := uuid.MustParse(ch)
	removal, err := f.pool.Begin(f.ctx)
	require.NoError(t, err)
	defer func() { _ = removal.Rollback(context.Background()) }()
	rq := db.New(removal)
	_, err = ingest.ChannelLockForChange(f.ctx, rq, f.tenant.ID(), channel)
	require.NoError(t, err)

	executed := make(chan struct{})
	go func() {
		defer close(executed)
		e.Execute(f.ctx, claims[0])
	}()
	lockWaiters := `SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'`
	require.Eventually(t, func() bool { return f.count(lockWaiters) == 1 }, 30*time.Second, 5*time.Millisecond,
		"the step does not wait for the removal holding the channel")

	memberBytes, _ := hex.DecodeString(pubHex(member))
	removed, err := rq.ChannelMemberRemove(f.ctx, db.ChannelMemberRemoveParams{CommunityID: f.tenant.ID(), ChannelID: channel, Pubkey: memberBytes, RemovedBy: memberBytes})
	require.NoError(t, err, "the removal")
	require.EqualValues(t, 1, removed)
	require.NoError(t, removal.Commit(f.ctx))
	<-executed

	// The deadlock's 40P01 is transient: the step's transaction is tried
	// again, and logged so.
	require.NotContains(t, logged.String(), "trying it again", "the step deadlocked with the removal")
	r := f.run(run)
	require.Equal(t, db.WorkflowRunStatusFailed, r.Status)
	require.Equal(t, "workflow_disabled", *r.ErrorCode)
	require.Zero(t, f.count(`SELECT count(*) FROM workflow_approvals WHERE run_id = $1`, run), "no approval was asked for")
}
