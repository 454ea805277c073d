package workflow_test

import (
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/buzzrelay/buzz/internal/db"
	"github.com/buzzrelay/buzz/internal/ingest"
	"github.com/buzzrelay/buzz/internal/nostr"
	"github.com/buzzrelay/buzz/internal/workflow"
)

// doorbells returns the relay-signed workflow messages of a run, oldest first.
func (f *fixture) doorbells(run uuid.UUID) []*nostr.Event {
	f.t.Helper()
	rows, err := f.pool.Query(f.ctx, `
		SELECT encode(id, 'hex'), encode(pubkey, 'hex'), kind, content, tags, extract(epoch FROM created_at)::bigint
		FROM events WHERE community_id = $1 AND tags @> jsonb_build_array(jsonb_build_array('workflow-run', $2::text))
		ORDER BY created_at, id`, f.tenant.ID(), run.String())
	require.NoError(f.t, err)
	defer rows.Close()
	var out []*nostr.Event
	for rows.Next() {
		ev := &nostr.Event{}
		var tags []byte
		require.NoError(f.t, rows.Scan(&ev.ID, &ev.PubKey, &ev.Kind, &ev.Content, &tags, &ev.CreatedAt))
		require.NoError(f.t, json.Unmarshal(tags, &ev.Tags))
		out = append(out, ev)
	}
	require.NoError(f.t, rows.Err())
	return out
}

// A message in the channel creates one run in its own transaction, with
// the trigger context, the pinned definition event and the cause; the run's
// send_message emits a relay-signed doorbell with the exact tag order, the
// owner first, and wake targets only from the owner-signed template. The
// doorbell itself triggers nothing.
//
// Mutations killed: dropping the buzz:workflow tag or reordering tags fails
// the exact tag list; scanning the rendered text for mentions wakes Eve and
// fails it too; creating runs from relay-signed events (side rows on Emit)
// fails "the doorbell triggers nothing"; a filter ignored fails "filtered
// out".
func TestMessageTriggerRunsDoorbell(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	owner, robby, eve, poster := f.key(), f.key(), f.key(), f.key()
	ch := f.channel(owner, robby, eve, poster)
	f.profile(robby, "Robby")
	f.profile(eve, "Eve")
	id := uuid.NewString()
	def, _ := f.save(owner, ch, id, `
name: Doorbell
trigger: {on: message_posted, filter: 'str_contains(trigger_text, "deploy")'}
steps:
  - id: ping
    action: send_message
    text: "@Robby please look: {{trigger.text}}"
    reply_in_thread: true
`)
	f.store(f.sign(poster, ingest.KindChat, "just chatting", nostr.Tags{{"h", ch}}))
	require.Empty(t, f.runIDs(id), "filtered out")
	msg := f.sign(poster, ingest.KindChat, "deploy now @Eve", nostr.Tags{{"h", ch}})
	f.store(msg)
	runs := f.runIDs(id)
	require.Len(t, runs, 1)
	require.Equal(t, []uuid.UUID{runs[0]}, <-f.offers, "offered to the worker after commit")

	run := f.run(runs[0])
	require.Equal(t, db.WorkflowRunStatusPending, run.Status)
	var tc workflow.TriggerContext
	require.NoError(t, json.Unmarshal(run.TriggerContext, &tc))
	require.Equal(t, workflow.TriggerContext{
		Text: "deploy now @Eve", Author: pubHex(poster), ChannelID: ch, Timestamp: itoa(msg.CreatedAt),
		MessageID: msg.ID, WebhookFields: map[string]string{}, DefinitionEventID: def.ID,
		Cause: workflow.Cause{Kind: workflow.CauseEvent, Ref: msg.ID},
	}, tc)

	f.drain(f.engine(time.Minute))
	run = f.run(runs[0])
	require.Equal(t, db.WorkflowRunStatusCompleted, run.Status, "error: %v", run.ErrorMessage)
	require.Nil(t, run.ErrorCode)
	bells := f.doorbells(runs[0])
	require.Len(t, bells, 1)
	bell := bells[0]
	relayKey, err := f.p.RelayKey(f.ctx, f.tenant.ID())
	require.NoError(t, err)
	require.Equal(t, pubHex(relayKey), bell.PubKey)
	require.Equal(t, ingest.KindChat, bell.Kind)
	require.Equal(t, "@Robby please look: deploy now @Eve", bell.Content)
	ownerHex := pubHex(owner)
	require.Equal(t, nostr.Tags{
		{"workflow-run", runs[0].String()},
		{"workflow-step", "ping"},
		{"workflow-owner", ownerHex},
		{"workflow-definition", def.ID, "ping"},
		{"workflow-cause", "event", msg.ID},
		{"p", ownerHex},
		{"h", ch},
		{"buzz:workflow", "doorbell-v1"},
		{"p", pubHex(robby)},
		{"e", msg.ID, "", "reply"},
	}, bell.Tags)
	require.Len(t, f.runIDs(id), 1, "the doorbell triggers nothing")
}

func itoa(n int64) string { return strconv.FormatInt(n, 10) }

// A reaction fires a reaction_added workflow only with the exact emoji,
// and add_reaction reacts to the triggering message. Mutation killed:
// comparing emoji loosely (prefix/case) fails "exact emoji".
func TestReactionTriggerExactEmoji(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	owner, poster := f.key(), f.key()
	ch := f.channel(owner, poster)
	id := uuid.NewString()
	f.save(owner, ch, id, "name: R\ntrigger: {on: reaction_added, emoji: \"🚀\"}\nsteps: [{id: ack, action: add_reaction, emoji: \"👀\"}]")
	msg := f.store(f.sign(poster, ingest.KindChat, "ship it", nostr.Tags{{"h", ch}}))
	_ = msg
	target := f.sign(poster, ingest.KindChat, "target", nostr.Tags{{"h", ch}})
	f.store(target)
	f.store(f.sign(poster, nostr.KindReaction, "🚀🚀", nostr.Tags{{"e", target.ID}}))
	require.Empty(t, f.runIDs(id), "exact emoji")
	f.store(f.sign(poster, nostr.KindReaction, "🚀", nostr.Tags{{"e", target.ID}}))
	runs := f.runIDs(id)
	require.Len(t, runs, 1)
	f.drain(f.engine(time.Minute))
	require.Equal(t, db.WorkflowRunStatusCompleted, f.run(runs[0]).Status)
	bells := f.doorbells(runs[0])
	require.Len(t, bells, 1)
	require.Equal(t, nostr.KindReaction, bells[0].Kind)
	require.Equal(t, "👀", bells[0].Content)
	require.Equal(t, nostr.Tag{"e", target.ID}, bells[0].Tags[0])
}

// Kind 46020 by the owner creates a run in the command's transaction and
// returns its id in the OK message; anyone else is refused. Mutation
// killed: dropping the owner check fails the refusal.
func TestManualTrigger(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	owner, member := f.key(), f.key()
	ch := f.channel(owner, member)
	id := uuid.NewString()
	f.save(owner, ch, id, "name: Cron-ish\ntrigger: {on: schedule, interval: 1h}\nsteps: [{id: a, action: send_message, text: tick}]")
	f.rejected(f.sign(member, workflow.KindManualTrigger, "", nostr.Tags{{"d", id}}), "restricted: not authorized to trigger this workflow")
	f.rejected(f.sign(owner, workflow.KindManualTrigger, "", nostr.Tags{{"d", uuid.NewString()}}), "invalid: workflow not found")
	f.rejected(f.sign(owner, workflow.KindManualTrigger, "", nostr.Tags{{"d", "x"}}), "invalid: bad workflow_id format")
	cmd := f.sign(owner, workflow.KindManualTrigger, "", nostr.Tags{{"d", id}})
	reply := f.store(cmd)
	runs := f.runIDs(id)
	require.Len(t, runs, 1)
	require.Equal(t, `response:{"run_id":"`+runs[0].String()+`"}`, reply)
	f.drain(f.engine(time.Minute))
	bells := f.doorbells(runs[0])
	require.Len(t, bells, 1)
	require.Contains(t, bells[0].Tags, nostr.Tag{"workflow-cause", "command", cmd.ID})
}

// A manual trigger from someone who cannot read the workflow's private
// channel is answered as an unknown workflow id is, so the refusal does
// not confirm that the workflow exists; a reader of the channel who is not
// the owner is refused as unauthorized.
//
// Mutation killed: refusing every non-owner as "not authorized" tells an
// outsider which ids are workflows.
func TestManualTriggerOfAnUnreadableWorkflow(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	owner, member, outsider := f.key(), f.key(), f.key()
	ch := f.privateChannel(owner, member)
	id := uuid.NewString()
	f.save(owner, ch, id, "name: Private\ntrigger: {on: schedule, interval: 1h}\nsteps: [{id: a, action: send_message, text: tick}]")

	f.rejected(f.sign(member, workflow.KindManualTrigger, "", nostr.Tags{{"d", id}}), "restricted: not authorized to trigger this workflow")
	f.rejected(f.sign(outsider, workflow.KindManualTrigger, "", nostr.Tags{{"d", uuid.NewString()}}), "invalid: workflow not found")
	f.rejected(f.sign(outsider, workflow.KindManualTrigger, "", nostr.Tags{{"d", id}}), "invalid: workflow not found")
	require.Empty(t, f.runIDs(id))
}

// A delay parks the run: pending, due at now + duration, no claim held;
// the poll does not take it before then, and after it the run completes.
// Mutation killed: a delay executed by sleeping in the worker (or parked
// without releasing the claim) fails the parked-state checks.
func TestDelayIsDurable(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	owner := f.key()
	ch := f.channel(owner)
	id := uuid.NewString()
	f.save(owner, ch, id, "name: D\ntrigger: {on: message_posted}\nsteps: [{id: wait, action: delay, duration: 120s}, {id: say, action: send_message, text: done}]")
	f.store(f.sign(owner, ingest.KindChat, "go", nostr.Tags{{"h", ch}}))
	run := f.runIDs(id)[0]
	e := f.engine(time.Minute)
	f.drain(e)
	parked := f.run(run)
	require.Equal(t, db.WorkflowRunStatusPending, parked.Status)
	require.Nil(t, parked.ClaimID)
	require.Equal(t, int32(1), parked.CurrentStep)
	require.Equal(t, f.clock.Now().Add(120*time.Second), parked.RunAt.UTC().In(f.clock.Now().Location()))
	f.clock.Advance(119 * time.Second)
	f.drain(e)
	require.Equal(t, db.WorkflowRunStatusPending, f.run(run).Status, "not due yet")
	f.clock.Advance(time.Second)
	f.drain(e)
	require.Equal(t, db.WorkflowRunStatusCompleted, f.run(run).Status)
	require.Len(t, f.doorbells(run), 1)
}

// Runs fail closed with stable codes: a row without a pinned definition
// event fires nothing; a run whose pinned event is gone (replaced by a
// newer save) fails with invalid_definition and sends nothing; an unimplemented action fails
// with action_not_implemented. Mutation killed: falling back to the row's
// current definition when the pinned event is gone fails the second case.
func TestRunsFailClosed(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	owner := f.key()
	ch := f.channel(owner)

	legacy := uuid.NewString()
	f.save(owner, ch, legacy, greeter)
	_, err := f.pool.Exec(f.ctx, `UPDATE workflows SET definition_event_id = NULL WHERE id = $1`, legacy)
	require.NoError(t, err)

	pinned := uuid.NewString()
	def, _ := f.save(owner, ch, pinned, "name: P\ntrigger: {on: message_posted}\nsteps: [{id: a, action: send_message, text: hi}]")
	dm := uuid.NewString()
	f.save(owner, ch, dm, "name: DM\ntrigger: {on: message_posted}\nsteps: [{id: a, action: send_dm, to: x, text: hi}]")

	f.store(f.sign(owner, ingest.KindChat, "go", nostr.Tags{{"h", ch}}))
	require.Empty(t, f.runIDs(legacy), "a row without a pinned event fires nothing")
	f.clock.Advance(time.Second) // a newer created_at replaces the definition
	f.save(owner, ch, pinned, "name: P\ntrigger: {on: message_posted}\nsteps: [{id: a, action: send_message, text: again}]")
	gone := def.IDBytes()
	require.Zero(t, f.count(`SELECT count(*) FROM events WHERE id = $1 AND deleted_at IS NULL`, gone[:]), "the first version is gone")
	f.drain(f.engine(time.Minute))

	for wf, code := range map[string]workflow.ErrorCode{pinned: workflow.CodeInvalidDefinition, dm: workflow.CodeActionNotImplemented} {
		runs := f.runIDs(wf)
		require.Len(t, runs, 1)
		run := f.run(runs[0])
		require.Equal(t, db.WorkflowRunStatusFailed, run.Status)
		require.Equal(t, string(code), *run.ErrorCode)
		require.NotContains(t, *run.ErrorMessage, string(code), "the diagnostic is separate from the code")
		require.Empty(t, f.doorbells(runs[0]))
	}
}

// Every code the engine can write is accepted by the database CHECK.
func TestErrorCodesMatchTheDatabase(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	owner := f.key()
	ch := f.channel(owner)
	id := uuid.NewString()
	f.save(owner, ch, id, greeter)
	for _, code := range workflow.AllErrorCodes {
		_, err := f.pool.Exec(f.ctx, `INSERT INTO workflow_runs (community_id, id, workflow_id, status, error_code, error_message)
			VALUES ($1, gen_random_uuid(), $2, 'failed', $3, 'x')`, f.tenant.ID(), id, string(code))
		require.NoError(t, err, code)
	}
}

// A diff (kind 40008) fires diff_posted workflows and nothing else does.
// Mutation killed: mapping 40008 to no trigger fails the run count.
func TestDiffTrigger(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	owner := f.key()
	ch := f.channel(owner)
	id := uuid.NewString()
	f.save(owner, ch, id, "name: Diff\ntrigger: {on: diff_posted}\nsteps: [{id: a, action: send_message, text: 'diff by {{trigger.author}}'}]")
	f.store(f.sign(owner, ingest.KindChat, "not a diff", nostr.Tags{{"h", ch}}))
	require.Empty(t, f.runIDs(id))
	f.store(f.sign(owner, 40008, "--- a\n+++ b", nostr.Tags{{"h", ch}}))
	require.Len(t, f.runIDs(id), 1)
}

// A step whose if is false is skipped (recorded, not failed); an if that
// cannot be evaluated fails the run with condition_evaluation_failed.
// Mutation killed: treating a false if as a failure (or running the step
// anyway) fails the skipped-step checks.
func TestStepConditions(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	owner := f.key()
	ch := f.channel(owner)
	skip := uuid.NewString()
	f.save(owner, ch, skip, "name: S\ntrigger: {on: message_posted}\nsteps:\n"+
		"  - {id: never, if: 'str_contains(trigger_text, \"nope\")', action: send_message, text: never}\n"+
		"  - {id: always, action: send_message, text: always}\n")
	bad := uuid.NewString()
	f.save(owner, ch, bad, "name: B\ntrigger: {on: message_posted}\nsteps: [{id: a, if: 'str_len(trigger_text) % 0 == 1', action: send_message, text: x}]")
	f.store(f.sign(owner, ingest.KindChat, "hello", nostr.Tags{{"h", ch}}))
	f.drain(f.engine(time.Minute))

	run := f.runIDs(skip)[0]
	row := f.run(run)
	require.Equal(t, db.WorkflowRunStatusCompleted, row.Status)
	require.Equal(t, []string{"always"}, contents(f.doorbells(run)))
	require.Contains(t, string(row.ExecutionTrace), `"status": "skipped"`)

	failed := f.run(f.runIDs(bad)[0])
	require.Equal(t, db.WorkflowRunStatusFailed, failed.Status)
	require.Equal(t, "condition_evaluation_failed", *failed.ErrorCode)
}

// The manual command is stored in the workflow's channel, so it passes
// the channel write check every event with an h tag passes: an owner
// removed from the private channel is answered as for an unknown id, and
// nothing is stored, even if the workflow were enabled again. A disabled
// workflow is refused up front instead of creating a run that fails.
//
// Mutation killed: binding the command to the channel without the write
// check stores the removed owner's command (with its p tags) in the
// private channel and creates a run once the workflow is enabled; dropping
// the disabled check creates a run of the disabled workflow.
func TestManualTriggerNeedsChannelWrite(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	owner, member, victim := f.key(), f.key(), f.key()
	ch := f.privateChannel(owner, member)
	id := uuid.NewString()
	f.save(member, ch, id, "name: Mine\ntrigger: {on: schedule, interval: 1h}\nsteps: [{id: a, action: send_message, text: tick}]")
	f.store(f.sign(owner, ingest.KindRemoveUser, "", nostr.Tags{{"h", ch}, {"p", pubHex(member)}}))

	// Removal disabled the workflow; enable it again by hand so only the
	// write check stands between the removed owner and the channel.
	for _, enabled := range []bool{false, true} {
		if enabled {
			_, err := f.pool.Exec(f.ctx, `UPDATE workflows SET enabled = true, status = 'active' WHERE id = $1`, id)
			require.NoError(t, err)
		}
		cmd := f.sign(member, workflow.KindManualTrigger, "injected", nostr.Tags{{"d", id}, {"p", pubHex(victim)}})
		f.rejected(cmd, "invalid: workflow not found")
		require.Zero(t, f.count(`SELECT count(*) FROM events WHERE encode(id, 'hex') = $1`, cmd.ID), "enabled=%v: nothing stored", enabled)
	}
	require.Zero(t, f.count(`SELECT count(*) FROM event_mentions WHERE pubkey_hex = $1`, pubHex(victim)))
	require.Empty(t, f.runIDs(id))

	// An owner who left an open channel may still write there, but
	// leaving disabled the workflow: the command is refused, no run.
	open := f.channel(owner, member)
	mine := uuid.NewString()
	f.save(member, open, mine, "name: Left\ntrigger: {on: schedule, interval: 1h}\nsteps: [{id: a, action: send_message, text: tick}]")
	f.store(f.sign(member, ingest.KindLeaveRequest, "", nostr.Tags{{"h", open}}))
	f.rejected(f.sign(member, workflow.KindManualTrigger, "", nostr.Tags{{"d", mine}}), "invalid: workflow is disabled")
	require.Empty(t, f.runIDs(mine))

	// An archived channel its reader knows of is said to be archived: only
	// a channel the actor cannot see hides the workflow.
	// Mutation killed: hiding every refusal answers "workflow not found".
	shelved := f.channel(owner, member)
	kept := uuid.NewString()
	f.save(member, shelved, kept, "name: Kept\ntrigger: {on: schedule, interval: 1h}\nsteps: [{id: a, action: send_message, text: tick}]")
	_, err := f.pool.Exec(f.ctx, `UPDATE channels SET archived_at = now() WHERE id = $1`, uuid.MustParse(shelved))
	require.NoError(t, err)
	f.rejected(f.sign(member, workflow.KindManualTrigger, "", nostr.Tags{{"d", kept}}), "restricted: channel is archived")
}

// The trigger author is the event's signer. An `actor` tag is only the
// poster's claim: a stranger's message naming the owner does not meet
// `trigger_author == "<owner>"`; the owner's own message does.
//
// Mutation killed: taking the author from the actor tag (as before) runs
// the workflow for the stranger's message.
func TestTriggerAuthorIsTheSigner(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	owner, stranger := f.key(), f.key()
	ch := f.channel(owner, stranger)
	id := uuid.NewString()
	f.save(owner, ch, id, "name: Boss only\ntrigger: {on: message_posted, filter: 'trigger_author == \""+pubHex(owner)+"\"'}\n"+
		"steps: [{id: a, action: send_message, text: deploying}]")
	f.store(f.sign(stranger, ingest.KindChat, "deploy", nostr.Tags{{"h", ch}, {"actor", pubHex(owner)}}))
	require.Empty(t, f.runIDs(id), "the actor tag does not make the stranger the author")
	f.store(f.sign(owner, ingest.KindChat, "deploy", nostr.Tags{{"h", ch}}))
	require.Len(t, f.runIDs(id), 1)
}

// doublingFilter binds the message text and doubles it n times with let:
// a few hundred bytes of expression that build 2^n copies of the text.
func doublingFilter(n int) string {
	var b strings.Builder
	b.WriteString("let s0 = trigger_text;")
	for i := 1; i <= n; i++ {
		fmt.Fprintf(&b, " let s%d = s%d + s%d;", i, i-1, i-1)
	}
	fmt.Fprintf(&b, " str_len(s%d) > 0", n)
	return b.String()
}

// A channel member (no role needed) may save a filter or an if that
// doubles a string with each let binding. With 30 bindings it asks for a
// terabyte: the process dies of it while the message's transaction is
// open, and a step's if does it again in every process that resumes the
// run. Here 12 doublings of 1 KiB (4 MiB) stand in for that: the
// evaluation must stop at its budget, so the filter fires nothing and the
// if fails the run, and the message is still stored.
//
// Mutation killed: without the budget on "+" the filter is true (a run is
// created) and the step's if is true (the doorbell is sent).
func TestConditionsCannotBuildUnboundedText(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	owner, member := f.key(), f.key()
	ch := f.channel(owner, member)
	filtered, guarded := uuid.NewString(), uuid.NewString()
	f.save(member, ch, filtered, "name: F\ntrigger: {on: message_posted, filter: '"+doublingFilter(12)+"'}\n"+
		"steps: [{id: a, action: send_message, text: fired}]")
	f.save(member, ch, guarded, "name: G\ntrigger: {on: message_posted}\n"+
		"steps: [{id: a, if: '"+doublingFilter(12)+"', action: send_message, text: guarded}]")

	msg := f.sign(member, ingest.KindChat, strings.Repeat("x", 1024), nostr.Tags{{"h", ch}})
	f.store(msg)
	f.drain(f.engine(time.Minute))

	require.Empty(t, f.runIDs(filtered), "a filter over its budget fires nothing")
	runs := f.runIDs(guarded)
	require.Len(t, runs, 1)
	row := f.run(runs[0])
	require.Equal(t, db.WorkflowRunStatusFailed, row.Status)
	require.Equal(t, "condition_evaluation_failed", *row.ErrorCode)
	require.Contains(t, *row.ErrorMessage, "builds more than")
	require.Empty(t, f.doorbells(runs[0]))
}

// Every step that stores into a channel reads the channel's readers
// version in its own transaction, and the version goes with what it
// stores to the fan-out (and across Redis), so no relay process delivers it
// from a reader set cached before a membership change committed ahead of
// the step, such as the removal below: a send_message step's message, an
// add_reaction step's reaction, a request_approval step's request.
// Mutations killed: sendMessage not recording the version it read
// (Write.ReadChannel), and storeEmitted not reading the version of a
// channel its write had not read (readChannelOnce): the reaction and the
// approval request were published with version 0.
func TestChannelStepsCarryTheReadersVersionTheyRead(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		step string
		kind int
	}{
		{"{id: say, action: send_message, text: seen}", ingest.KindChat},
		{"{id: ack, action: add_reaction, emoji: eyes}", nostr.KindReaction},
		{"{id: ask, action: request_approval, message: 'ok?', timeout: 1h}", workflow.KindApprovalRequested},
	} {
		t.Run(strconv.Itoa(c.kind), func(t *testing.T) {
			t.Parallel()
			f := newFixture(t)
			var mu sync.Mutex
			published := map[int][]int64{}
			f.p.OnPublish = func(_ uuid.UUID, ev *nostr.Event, _ *uuid.UUID, readersVersion int64) {
				mu.Lock()
				defer mu.Unlock()
				published[ev.Kind] = append(published[ev.Kind], readersVersion)
			}
			owner, poster, leaving := f.key(), f.key(), f.key()
			ch := f.privateChannel(owner, poster, leaving)
			id := uuid.NewString()
			f.save(owner, ch, id, "name: Echo\ntrigger: {on: message_posted}\nsteps: ["+c.step+"]")
			f.store(f.sign(poster, ingest.KindChat, "hello", nostr.Tags{{"h", ch}}))
			runs := f.runIDs(id)
			require.Len(t, runs, 1)
			f.store(f.sign(owner, ingest.KindRemoveUser, "", nostr.Tags{{"h", ch}, {"p", pubHex(leaving)}}))
			version := f.count(`SELECT readers_version FROM channels WHERE community_id = $1 AND id = $2`, f.tenant.ID(), ch)
			mu.Lock()
			clear(published)
			mu.Unlock()

			f.drain(f.engine(time.Minute))
			require.NotEqual(t, db.WorkflowRunStatusFailed, f.run(runs[0]).Status)
			mu.Lock()
			defer mu.Unlock()
			require.Equal(t, []int64{int64(version)}, published[c.kind], "the step's event carries the version it was written under")
		})
	}
}
