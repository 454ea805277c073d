package workflow_test

import (
	"context"
	"encoding/hex"
	"sort"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/buzzrelay/buzz/internal/clock"
	"github.com/buzzrelay/buzz/internal/db"
	"github.com/buzzrelay/buzz/internal/fanout"
	"github.com/buzzrelay/buzz/internal/ingest"
	"github.com/buzzrelay/buzz/internal/nostr"
	"github.com/buzzrelay/buzz/internal/outbox"
	"github.com/buzzrelay/buzz/internal/workflow"
)

// withListenerOutbox gives the fixture a pipeline with the given mention cap
// (0: the default) and operator-listener outbox rows wired in as the relay
// wires them (a side row that wakes, same cap, ids handed off after
// commit, given back after a rollback). It registers targets with one
// listener and returns the channels the hand-offs and the rows abandoned
// (claimed, then rolled back) arrive on.
func (f *fixture) withListenerOutbox(maxMentions int, targets ...*nostr.SecretKey) (handedOff, abandoned <-chan []uuid.UUID) {
	f.t.Helper()
	f.p = ingest.New(f.pool, fanout.NewHub(), ingest.Options{MaxFutureSkew: time.Minute, MaxMentions: maxMentions, Clock: clock.Stub(f.clock.Now)})
	workflow.Register(f.p, func(_ uuid.UUID, ids []uuid.UUID) { f.offers <- ids })
	offered, given := make(chan []uuid.UUID, 100), make(chan []uuid.UUID, 100)
	listenerKey := f.key()
	listener := listenerKey.PublicKey()
	// A worker that routes the listener (never run): Enqueue claims its rows
	// for it, and those are what the relay would hand off.
	routes := outbox.Routes{listenerKey.PublicKeyHex(): "https://listener.example"}
	m, err := outbox.NewMetrics(prometheus.NewRegistry())
	require.NoError(f.t, err)
	worker := outbox.NewWorker(f.pool, routes, outbox.NewDeliverer(f.pool, outbox.Config{Listeners: routes}, listenerKey, m))
	f.p.RegisterSideRows(ingest.SideRows{Needs: outbox.Mentions, Wakes: true, Apply: func(ctx context.Context, w *ingest.Write) error {
		claimed, _, err := outbox.Enqueue(ctx, w.Q, worker, w.Tenant.ID(), w.ChannelID, w.Event, maxMentions, clock.Stub(f.clock.Now))
		if err == nil && claimed.Len() > 0 {
			w.AfterCommit(func() { offered <- claimed.IDs() })
			w.OnRollback(func() { worker.Abandon(claimed); given <- claimed.IDs() })
		}
		return err
	}})
	pubkeys := make([][]byte, len(targets))
	for i, k := range targets {
		pk := k.PublicKey()
		pubkeys[i] = pk[:]
	}
	_, err = db.New(f.pool).ListenerRegistrationsUpsert(f.ctx, db.ListenerRegistrationsUpsertParams{Listener: listener[:], Targets: pubkeys})
	require.NoError(f.t, err)
	return offered, given
}

// wakeRows lists, sorted, the pubkeys (hex) an event has mention rows and
// operator-listener outbox rows for, and the outbox row ids.
func (f *fixture) wakeRows(eventID string) (mentioned, queued []string, ids []uuid.UUID) {
	f.t.Helper()
	strs := func(sql string) []string {
		rows, err := f.pool.Query(f.ctx, sql, eventID)
		require.NoError(f.t, err)
		var out []string
		for rows.Next() {
			var s string
			require.NoError(f.t, rows.Scan(&s))
			out = append(out, s)
		}
		require.NoError(f.t, rows.Err())
		sort.Strings(out)
		return out
	}
	mentioned = strs(`SELECT pubkey_hex FROM event_mentions WHERE encode(event_id, 'hex') = $1`)
	queued = strs(`SELECT encode(target_pubkey, 'hex') FROM operator_listener_outbox WHERE encode(event_id, 'hex') = $1`)
	for _, s := range strs(`SELECT id::text FROM operator_listener_outbox WHERE encode(event_id, 'hex') = $1`) {
		ids = append(ids, uuid.MustParse(s))
	}
	return mentioned, queued, ids
}

func sortedHex(keys ...*nostr.SecretKey) []string {
	out := make([]string, len(keys))
	for i, k := range keys {
		out[i] = pubHex(k)
	}
	sort.Strings(out)
	return out
}

func sortedIDs(ids []uuid.UUID) []uuid.UUID {
	out := append([]uuid.UUID(nil), ids...)
	sort.Slice(out, func(i, j int) bool { return out[i].String() < out[j].String() })
	return out
}

// A doorbell written by a step whose claim was lost wakes nobody: the late
// worker's doorbell, mention rows and outbox rows roll back with its step,
// and nothing is handed off. The worker that holds the claim sends the
// doorbell once, with a mention row and an outbox row for the owner and
// the @-mentioned member, in its step's transaction, and hands exactly
// those outbox ids to the listener worker after commit.
//
// Mutations killed: sending the doorbell with Emit (no wake rows) fails
// "the owner and the mentioned member are woken"; writing the wake rows
// outside the step's transaction (on the pool) leaves rows behind the
// fenced-out step; handing the ids off before commit, or after the
// rollback, fails "nothing is handed off"; EmitWaking not carrying the
// side rows' after-commit hand-off over to the step fails "handed off
// after commit"; the engine not running the rolled-back step's rollback
// steps (Write.Discard) fails "the fenced-out step gives back its rows'
// hand-off room".
func TestFencedOutDoorbellWakesNobody(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	owner, robby := f.key(), f.key()
	handedOff, abandoned := f.withListenerOutbox(0, owner, robby)
	ch := f.channel(owner, robby)
	f.profile(robby, "Robby")
	id := uuid.NewString()
	f.save(owner, ch, id, "name: Bell\ntrigger: {on: message_posted}\nsteps: [{id: ping, action: send_message, text: '@Robby look: {{trigger.text}}'}]")
	f.store(f.sign(owner, ingest.KindChat, "deploy", nostr.Tags{{"h", ch}}))
	run := f.runIDs(id)[0]

	const lease = 30 * time.Second
	late, holder := f.engine(lease), f.engine(lease)
	claims, err := late.ClaimDue(f.ctx, 10)
	require.NoError(t, err)
	require.Len(t, claims, 1)
	stale := claims[0]
	f.clock.Advance(lease + time.Second)
	claims, err = holder.ClaimDue(f.ctx, 10)
	require.NoError(t, err)
	require.Len(t, claims, 1)

	require.False(t, late.Execute(f.ctx, stale), "the late worker lost its claim")
	require.Empty(t, f.doorbells(run))
	require.Zero(t, f.count(`SELECT count(*) FROM event_mentions`),
		"no mention row survives the fenced-out step")
	require.Zero(t, f.count(`SELECT count(*) FROM operator_listener_outbox`), "no outbox row survives the fenced-out step")
	select {
	case ids := <-handedOff:
		t.Fatalf("nothing is handed off for a rolled-back step, got %v", ids)
	default:
	}
	select {
	case ids := <-abandoned:
		require.Len(t, ids, 2, "the owner's and the member's rows were claimed at insert")
	default:
		t.Fatal("the fenced-out step gives back its rows' hand-off room")
	}

	require.True(t, holder.Execute(f.ctx, claims[0]))
	require.Equal(t, db.WorkflowRunStatusCompleted, f.run(run).Status)
	bells := f.doorbells(run)
	require.Len(t, bells, 1)
	mentioned, queued, ids := f.wakeRows(bells[0].ID)
	want := sortedHex(owner, robby)
	require.Equal(t, want, mentioned, "the owner and the mentioned member are woken")
	require.Equal(t, want, queued, "the owner and the mentioned member are woken")
	select {
	case got := <-handedOff:
		require.Equal(t, sortedIDs(ids), sortedIDs(got), "handed off after commit")
	default:
		t.Fatal("handed off after commit: the step's outbox ids never reached the worker")
	}
	require.Empty(t, abandoned, "the committed step abandons nothing")
}

// The mention cap applies to a doorbell as to a user's message: with a cap
// of one, only the first p tag (the owner) gets a mention row and an outbox
// row. The cap is on rows, not on the event: the doorbell keeps its tags.
// Mutation killed: waking side rows that read every p tag (no cap) give
// the member rows too.
func TestDoorbellWakeRowsFollowTheMentionCap(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	owner, robby := f.key(), f.key()
	f.withListenerOutbox(1, owner, robby)
	ch := f.channel(owner, robby)
	f.profile(robby, "Robby")
	id := uuid.NewString()
	f.save(owner, ch, id, "name: Bell\ntrigger: {on: message_posted}\nsteps: [{id: ping, action: send_message, text: '@Robby look'}]")
	f.store(f.sign(owner, ingest.KindChat, "deploy", nostr.Tags{{"h", ch}}))
	run := f.runIDs(id)[0]
	f.drain(f.engine(time.Minute))
	bells := f.doorbells(run)
	require.Len(t, bells, 1)
	require.Len(t, bells[0].Tags.Values("p"), 2, "the doorbell keeps every wake target")
	mentioned, queued, _ := f.wakeRows(bells[0].ID)
	require.Equal(t, []string{pubHex(owner)}, mentioned)
	require.Equal(t, []string{pubHex(owner)}, queued)
}

// An approval request that names its approver by pubkey wakes the approver
// like a doorbell: a mention row and an outbox row for the 46010, written
// with the step. Mutations killed: emitting the request with Emit (no wake
// rows), or an outbox that ignores kind 46010, fail the rows.
func TestApprovalRequestWakesTheApprover(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	owner, approver := f.key(), f.key()
	f.withListenerOutbox(0, approver)
	ch := f.channel(owner, approver)
	run, _ := f.approvalRun(owner, ch, pubHex(approver))
	bells := f.doorbells(run)
	require.Len(t, bells, 1)
	require.Equal(t, workflow.KindApprovalRequested, bells[0].Kind)
	mentioned, queued, _ := f.wakeRows(bells[0].ID)
	require.Equal(t, []string{pubHex(approver)}, mentioned)
	require.Equal(t, []string{pubHex(approver)}, queued)
}

// The relay's add_reaction writes the reactions row a user's reaction
// gets (the relay as reactor, the emoji, the target's channel, the
// reaction event), so it counts next to users' reactions. A second
// workflow reacting alike to the same message completes with the same
// reaction: one active row per reactor, target and emoji, and no second
// kind 7 that would count nowhere.
//
// Mutations killed: storing the relay's kind 7 with Emit (no reactions
// row) fails the row; upserting the row after storing the event, or
// failing the second run on the duplicate, fails "reacted once".
func TestRelayReactionCountsLikeAUsers(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	owner, poster := f.key(), f.key()
	ch := f.channel(owner, poster)
	chID := uuid.MustParse(ch)
	first, second := uuid.NewString(), uuid.NewString()
	for _, id := range []string{first, second} {
		f.save(owner, ch, id, "name: Ack\ntrigger: {on: message_posted}\nsteps: [{id: ack, action: add_reaction, emoji: \"👀\"}]")
	}
	msg := f.sign(poster, ingest.KindChat, "ship it", nostr.Tags{{"h", ch}})
	f.store(msg)
	f.store(f.sign(owner, nostr.KindReaction, "👀", nostr.Tags{{"e", msg.ID}}))
	f.drain(f.engine(time.Minute))

	relayKey, err := f.p.RelayKey(f.ctx, f.tenant.ID())
	require.NoError(t, err)
	var reactionIDs []string
	for _, id := range []string{first, second} {
		runID := f.runIDs(id)[0]
		run := f.run(runID)
		require.Equal(t, db.WorkflowRunStatusCompleted, run.Status, "run of workflow %s", id)
		var out string
		require.NoError(t, f.pool.QueryRow(f.ctx, `SELECT execution_trace->0->'output'->>'reaction_id' FROM workflow_runs WHERE id = $1`, runID).Scan(&out))
		reactionIDs = append(reactionIDs, out)
	}

	type row struct {
		reactor, emoji, reactionEvent string
		channel                       *uuid.UUID
	}
	rows, err := f.pool.Query(f.ctx, `
		SELECT encode(pubkey, 'hex'), emoji, encode(reaction_event_id, 'hex'), channel_id FROM reactions
		WHERE community_id = $1 AND encode(event_id, 'hex') = $2 AND removed_at IS NULL
		ORDER BY encode(pubkey, 'hex') = $3`, f.tenant.ID(), msg.ID, pubHex(relayKey))
	require.NoError(t, err)
	var got []row
	for rows.Next() {
		var r row
		require.NoError(t, rows.Scan(&r.reactor, &r.emoji, &r.reactionEvent, &r.channel))
		got = append(got, r)
	}
	require.NoError(t, rows.Err())
	require.Len(t, got, 2, "the owner's reaction and the relay's count alike")
	require.Equal(t, pubHex(owner), got[0].reactor)
	relayRow := got[1]
	require.Equal(t, row{reactor: pubHex(relayKey), emoji: "👀", reactionEvent: reactionIDs[0], channel: &chID}, relayRow)
	require.Equal(t, 1, f.count(`SELECT count(*) FROM events WHERE kind = 7 AND pubkey = $1`, hexBytes(t, pubHex(relayKey))), "reacted once")
	require.Equal(t, reactionIDs[0], reactionIDs[1], "both runs name the relay's one reaction")
}

func hexBytes(t *testing.T, s string) []byte {
	t.Helper()
	b, err := hex.DecodeString(s)
	require.NoError(t, err)
	return b
}

// A doorbell that replies in the thread of its trigger joins that thread
// like a user's reply: a thread_metadata row under the trigger message, and
// the reply counted on it. A doorbell posted to another channel (the
// step's channel override) keeps its e tags but cannot join a thread
// there: it is stored without thread metadata and the run completes.
//
// Mutations killed: a doorbell stored without thread metadata fails the
// row; refusing it like a user's cross-channel reply fails the second run.
func TestDoorbellReplyJoinsTheThread(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	owner, poster := f.key(), f.key()
	ch, elsewhere := f.channel(owner, poster), f.channel(owner)
	here, there := uuid.NewString(), uuid.NewString()
	f.save(owner, ch, here, "name: Here\ntrigger: {on: message_posted}\nsteps: [{id: ping, action: send_message, text: seen, reply_in_thread: true}]")
	f.save(owner, ch, there, "name: There\ntrigger: {on: message_posted}\nsteps: [{id: ping, action: send_message, text: relayed, channel: '"+elsewhere+"', reply_in_thread: true}]")
	msg := f.sign(poster, ingest.KindChat, "deploy", nostr.Tags{{"h", ch}})
	f.store(msg)
	f.drain(f.engine(time.Minute))

	for _, id := range []string{here, there} {
		require.Equal(t, db.WorkflowRunStatusCompleted, f.run(f.runIDs(id)[0]).Status, "run of workflow %s", id)
	}
	bell := f.doorbells(f.runIDs(here)[0])[0]
	require.Contains(t, bell.Tags, nostr.Tag{"e", msg.ID, "", "reply"})
	var parent string
	var depth int
	require.NoError(t, f.pool.QueryRow(f.ctx, `SELECT encode(parent_event_id, 'hex'), depth FROM thread_metadata WHERE encode(event_id, 'hex') = $1`, bell.ID).Scan(&parent, &depth))
	require.Equal(t, msg.ID, parent)
	require.Equal(t, 1, depth)
	require.Equal(t, 1, f.count(`SELECT reply_count FROM thread_metadata WHERE encode(event_id, 'hex') = $1`, msg.ID), "counted on the trigger message")

	away := f.doorbells(f.runIDs(there)[0])[0]
	require.Contains(t, away.Tags, nostr.Tag{"e", msg.ID, "", "reply"})
	require.Zero(t, f.count(`SELECT count(*) FROM thread_metadata WHERE encode(event_id, 'hex') = $1`, away.ID))
}

// add_reaction follows a user's rules for the target: a trigger message
// deleted before the step runs takes no reaction, and the run fails with
// webhook_failed instead of storing a reaction to nothing. Mutation
// killed: skipping the target lookup stores a kind 7 (and a reactions row)
// for a deleted message.
func TestRelayReactionToADeletedMessageFails(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	owner, poster := f.key(), f.key()
	ch := f.channel(owner, poster)
	id := uuid.NewString()
	f.save(owner, ch, id, "name: Ack\ntrigger: {on: message_posted}\nsteps: [{id: ack, action: add_reaction, emoji: \"👀\"}]")
	msg := f.sign(poster, ingest.KindChat, "oops", nostr.Tags{{"h", ch}})
	f.store(msg)
	f.store(f.sign(poster, nostr.KindDeletion, "", nostr.Tags{{"e", msg.ID}}))
	f.drain(f.engine(time.Minute))

	run := f.run(f.runIDs(id)[0])
	require.Equal(t, db.WorkflowRunStatusFailed, run.Status)
	require.Equal(t, "webhook_failed", *run.ErrorCode)
	require.Equal(t, "step ack: reaction target event not found", *run.ErrorMessage)
	require.Zero(t, f.count(`SELECT count(*) FROM events WHERE kind = 7`))
	require.Zero(t, f.count(`SELECT count(*) FROM reactions`))
}

// A step transaction tried again after a transient failure (here its
// connection terminated just before its commit) gives back the hand-off
// room its rolled-back attempt's outbox rows reserved, before the next
// attempt claims its own: the first attempt's rows never existed, so its
// reservation would otherwise hold the worker's hand-off room for a lease
// (30 s) and leave later events' rows to the poll.
//
// Mutation killed: the engine not discarding a failed attempt's write
// before the next one (emitted.Discard() inside the step's transaction
// function): "the retried attempt gives back its rows' hand-off room".
func TestRetriedStepGivesBackItsRolledBackAttemptsHandOffRoom(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	owner, robby := f.key(), f.key()
	handedOff, abandoned := f.withListenerOutbox(0, owner, robby)
	ch := f.channel(owner, robby)
	f.profile(robby, "Robby")
	id := uuid.NewString()
	f.save(owner, ch, id, "name: Bell\ntrigger: {on: message_posted}\nsteps: [{id: ping, action: send_message, text: '@Robby look'}]")
	f.store(f.sign(owner, ingest.KindChat, "deploy", nostr.Tags{{"h", ch}}))
	run := f.runIDs(id)[0]

	e := f.engine(30 * time.Second)
	terminated := 0
	e.SetBeforeCommit(func(uuid.UUID, int) {
		if terminated > 0 {
			return
		}
		// The step's own transaction is the only one open in the database.
		require.NoError(t, f.pool.QueryRow(f.ctx, `SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
			WHERE datname = current_database() AND state = 'idle in transaction' AND pid <> pg_backend_pid()`).Scan(&terminated))
		require.Equal(t, 1, terminated)
	})
	f.drain(e)
	require.Equal(t, db.WorkflowRunStatusCompleted, f.run(run).Status)
	bells := f.doorbells(run)
	require.Len(t, bells, 1, "the step ran again and committed once")
	_, _, ids := f.wakeRows(bells[0].ID)
	require.Len(t, ids, 2)

	select {
	case got := <-abandoned:
		require.Len(t, got, 2, "the failed attempt claimed the owner's and the member's rows")
		require.NotSubset(t, ids, got, "the rows given back are the rolled-back attempt's")
	default:
		t.Fatal("the retried attempt gives back its rows' hand-off room")
	}
	require.Empty(t, abandoned, "the committed attempt abandons nothing")
	select {
	case got := <-handedOff:
		require.Equal(t, sortedIDs(ids), sortedIDs(got), "the committed attempt's rows are handed off")
	default:
		t.Fatal("the committed attempt's rows are handed off")
	}
}
