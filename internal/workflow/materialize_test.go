package workflow_test

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/buzzrelay/buzz/internal/ingest"
	"github.com/buzzrelay/buzz/internal/nostr"
	"github.com/buzzrelay/buzz/internal/workflow"
)

const greeter = "name: Greeter\ntrigger: {on: message_posted}\nsteps: [{id: greet, action: send_message, text: hello}]"

type wfRow struct {
	Name     string
	OwnerHex string
	Channel  string
	EventID  *string
	Status   string
	Enabled  bool
	Secret   string
	Hash     string
}

func (f *fixture) workflow(id string) wfRow {
	f.t.Helper()
	var r wfRow
	require.NoError(f.t, f.pool.QueryRow(f.ctx, `
		SELECT name, encode(owner_pubkey, 'hex'), channel_id::text, encode(definition_event_id, 'hex'), status::text, enabled,
		       coalesce(definition ->> '_webhook_secret', ''), encode(definition_hash, 'hex')
		FROM workflows WHERE community_id = $1 AND id = $2`, f.tenant.ID(), id).
		Scan(&r.Name, &r.OwnerHex, &r.Channel, &r.EventID, &r.Status, &r.Enabled, &r.Secret, &r.Hash))
	return r
}

// A saved definition becomes a workflows row pinned to the exact event, in
// the event's transaction; a re-save re-pins it. Mutations killed: an
// upsert that keeps the old definition_event_id fails "re-save pins the new
// event"; a name tag ignored fails the name check.
func TestDefinitionMaterializesPinnedRow(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	owner := f.key()
	ch := f.channel(owner)
	id := uuid.NewString()
	ev, reply := f.save(owner, ch, id, greeter)
	require.Equal(t, `response:{"workflow_id":"`+id+`"}`, reply)
	row := f.workflow(id)
	require.Equal(t, "Greeter", row.Name)
	require.Equal(t, pubHex(owner), row.OwnerHex)
	require.Equal(t, ch, row.Channel)
	require.Equal(t, ev.ID, *row.EventID)
	require.Equal(t, "active", row.Status)
	require.True(t, row.Enabled)

	f.clock.Advance(2e9)
	again := f.sign(owner, workflow.KindDefinition, greeter, nostr.Tags{{"d", id}, {"h", ch}, {"name", "Renamed"}})
	f.store(again)
	row = f.workflow(id)
	require.Equal(t, again.ID, *row.EventID, "re-save pins the new event")
	require.Equal(t, "Renamed", row.Name, "the name tag overrides the YAML name")
}

// The webhook secret is generated once, returned only then, kept across
// re-saves, and covered by definition_hash. Mutation killed: generating a
// new secret on every save fails "kept across re-saves".
func TestDefinitionWebhookSecretGeneratedOnce(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	owner := f.key()
	ch := f.channel(owner)
	id := uuid.NewString()
	hook := "name: Hook\ntrigger: {on: webhook}\nsteps: [{id: a, action: send_message, text: got it}]"
	_, reply := f.save(owner, ch, id, hook)
	var first struct {
		WorkflowID    string `json:"workflow_id"`
		WebhookSecret string `json:"webhook_secret"`
	}
	require.NoError(t, json.Unmarshal([]byte(strings.TrimPrefix(reply, "response:")), &first))
	require.Equal(t, id, first.WorkflowID)
	_, err := uuid.Parse(first.WebhookSecret)
	require.NoError(t, err)
	row := f.workflow(id)
	require.Equal(t, first.WebhookSecret, row.Secret)
	def, err := workflow.Parse(hook)
	require.NoError(t, err)
	def.WebhookSecret = first.WebhookSecret
	canonical, err := def.CanonicalJSON()
	require.NoError(t, err)
	want := sha256.Sum256(canonical)
	require.Equal(t, hex.EncodeToString(want[:]), row.Hash, "the hash covers the canonical JSON including the secret")

	f.clock.Advance(2e9)
	_, reply = f.save(owner, ch, id, hook)
	require.Equal(t, `response:{"workflow_id":"`+id+`"}`, reply, "an existing secret is not sent again")
	require.Equal(t, first.WebhookSecret, f.workflow(id).Secret, "kept across re-saves")
}

// Every refusal of a definition event, in materialization order; none
// stores the event or a row.
//
// Mutation killed: parsing only in Prepare (not in Validate) answers the
// non-member's too-deep text "restricted: not a member of this channel".
func TestDefinitionRefusals(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	owner, stranger, member := f.key(), f.key(), f.key()
	ch := f.channel(owner, member)
	other := f.channel(owner)
	taken := uuid.NewString()
	f.save(owner, ch, taken, greeter)
	sign := func(key *nostr.SecretKey, content string, tags nostr.Tags) *nostr.Event {
		return f.sign(key, workflow.KindDefinition, content, tags)
	}
	d := nostr.Tag{"d", uuid.NewString()}
	h := nostr.Tag{"h", ch}
	for _, c := range []struct {
		name string
		ev   *nostr.Event
		want string
	}{
		{"missing h", sign(owner, greeter, nostr.Tags{d}), "invalid: missing h tag (channel_id)"},
		{"bad h", sign(owner, greeter, nostr.Tags{d, {"h", "general"}}), "invalid: bad channel_id format"},
		{"missing d", sign(owner, greeter, nostr.Tags{h}), "invalid: missing d tag (workflow_id)"},
		{"bad d", sign(owner, greeter, nostr.Tags{{"d", "wf-1"}, h}), "invalid: bad workflow_id format"},
		{"bad YAML", sign(owner, "name: [", nostr.Tags{d, h}), "invalid: workflow YAML parse error: invalid YAML: "},
		{"invalid definition", sign(owner, "name: x\ntrigger: {on: webhook}\nsteps: []", nostr.Tags{d, h}), "invalid: workflow YAML parse error: invalid definition: steps: must not be empty"},
		// Parsed before the write transaction, so even a non-member's
		// text is refused for itself (no channel is looked up).
		{"nested too deep", sign(stranger, "name: "+strings.Repeat("[", 65000), nostr.Tags{d, h}), "invalid: workflow YAML parse error: invalid YAML: nested deeper than 32 levels"},
		{"not a member", sign(stranger, greeter, nostr.Tags{d, h}), "restricted: not a member of this channel"},
		{"unknown channel", sign(owner, greeter, nostr.Tags{d, {"h", uuid.NewString()}}), "restricted: not a member of this channel"},
		{"another owner", sign(member, greeter, nostr.Tags{{"d", taken}, h}), "restricted: workflow belongs to a different owner or channel"},
		{"another channel", sign(owner, greeter, nostr.Tags{{"d", taken}, {"h", other}}), "restricted: workflow belongs to a different owner or channel"},
	} {
		_, err := f.submit(c.ev)
		require.Error(t, err, c.name)
		require.True(t, strings.HasPrefix(err.Error(), c.want), "%s: got %q", c.name, err.Error())
		require.Zero(t, f.count(`SELECT count(*) FROM events WHERE encode(id, 'hex') = $1`, c.ev.ID), c.name)
	}
	require.Equal(t, 1, f.count(`SELECT count(*) FROM workflows`))
	require.Equal(t, pubHex(owner), f.workflow(taken).OwnerHex)
}

// A kind 5 by the definition's coordinate archives the workflow; the same
// coordinate deleted by someone else changes nothing. The owner leaving the
// channel disables their workflows there. Mutations killed: not
// registering DefinitionDeletion fails "archived"; matching the
// coordinate's workflow without its owner fails "a stranger's deletion".
func TestDefinitionDeletionAndOwnerLeaving(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	owner, member := f.key(), f.key()
	ch := f.channel(owner, member)
	deleted, kept := uuid.NewString(), uuid.NewString()
	f.save(owner, ch, deleted, greeter)
	f.save(member, ch, kept, greeter)

	coordinate := func(pk, id string) string { return "30620:" + pk + ":" + id }
	f.store(f.sign(member, nostr.KindDeletion, "", nostr.Tags{{"a", coordinate(pubHex(owner), deleted)}}))
	require.Equal(t, "active", f.workflow(deleted).Status, "a stranger's deletion changes nothing")

	f.store(f.sign(owner, nostr.KindDeletion, "", nostr.Tags{{"a", coordinate(pubHex(owner), deleted)}}))
	row := f.workflow(deleted)
	require.Equal(t, "archived", row.Status)
	require.False(t, row.Enabled)

	f.store(f.sign(member, ingest.KindLeaveRequest, "", nostr.Tags{{"h", ch}}))
	require.False(t, f.workflow(kept).Enabled, "the owner left: their workflow is disabled")
}

func pubHex(k *nostr.SecretKey) string { pk := k.PublicKey(); return hex.EncodeToString(pk[:]) }

// A save racing the removal of its signer must not leave the removed
// member a firing workflow in the channel: the removal's trigger disables
// only the workflows that exist when it runs. The save reads the signer's
// membership after taking the channel's workflow lock, which waits for the
// removal (holding the channel's row lock) to commit. Mutation killed:
// ChannelAccess read before lockChannelForWorkflows, as it was: the save
// saw the membership the uncommitted removal was ending, waited for the
// lock, and stored an enabled workflow for a member no longer in the
// channel.
func TestDefinitionSaveRacingOwnerRemoval(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	owner, member := f.key(), f.key()
	ch := f.privateChannel(owner, member)

	// The removal as 9001 takes it: the channel's row lock, then the row.
	removal, err := f.pool.Begin(f.ctx)
	require.NoError(t, err)
	defer func() { _ = removal.Rollback(f.ctx) }()
	_, err = removal.Exec(f.ctx, `SELECT 1 FROM channels WHERE community_id = $1 AND id = $2 FOR NO KEY UPDATE`, f.tenant.ID(), ch)
	require.NoError(t, err)
	_, err = removal.Exec(f.ctx, `UPDATE channel_members SET removed_at = now() WHERE community_id = $1 AND channel_id = $2 AND pubkey = decode($3, 'hex')`,
		f.tenant.ID(), ch, pubHex(member))
	require.NoError(t, err)

	wf := uuid.NewString()
	saved := make(chan error, 1)
	go func() {
		_, err := f.submit(f.sign(member, workflow.KindDefinition, greeter, nostr.Tags{{"d", wf}, {"h", ch}}))
		saved <- err
	}()
	// Wait until the save waits for the channel (alone, after its group's
	// lock timeout), then let the removal commit.
	require.Eventually(t, func() bool {
		return f.count(`SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock' AND query LIKE '%FOR NO KEY UPDATE%'`) > 0
	}, time.Minute, 10*time.Millisecond)
	require.NoError(t, removal.Commit(f.ctx))

	err = <-saved
	var rej *ingest.Rejection
	require.True(t, errors.As(err, &rej), "want a refusal, got %v", err)
	require.Equal(t, "restricted: not a member of this channel", rej.Error())
	require.Zero(t, f.count(`SELECT count(*) FROM workflows WHERE community_id = $1 AND enabled`, f.tenant.ID()))
}

// Workflow saves and membership changes of one channel, run in parallel
// round after round, each in its own transaction (no group, so no group
// lock timeout hides a wait), all commit: neither deadlocks (40P01) with
// the other. Both take the channel's row before its write lock, a save
// shared (its channel check), a change exclusive.
// Mutation killed: the change taking the write lock before the row, as it
// did: a save holding the row and asking the write lock shared, and a
// change holding it exclusive and asking the row, waited on each other
// until the deadlock detector failed one.
func TestDefinitionSavesRacingMembershipChangesNeverDeadlock(t *testing.T) {
	t.Parallel()
	f := newFixtureWith(t, ingest.Options{GroupMax: 1}, workflow.Triggers{MinScheduleInterval: time.Second})
	owner, member := f.key(), f.key()
	ch := f.privateChannel(owner)
	wf := uuid.NewString()
	base := f.clock.Now().Unix() - 100
	const rounds = 40
	for round := range rounds {
		save := &nostr.Event{Kind: workflow.KindDefinition, Content: greeter, Tags: nostr.Tags{{"d", wf}, {"h", ch}}, CreatedAt: base + int64(round)}
		require.NoError(t, save.Sign(owner))
		kind := ingest.KindPutUser
		if round%2 == 1 {
			kind = ingest.KindRemoveUser
		}
		change := &nostr.Event{Kind: kind, Tags: nostr.Tags{{"h", ch}, {"p", pubHex(member)}}, CreatedAt: base + int64(round)}
		require.NoError(t, change.Sign(owner))
		start := make(chan struct{})
		errs := make(chan error, 2)
		for _, ev := range []*nostr.Event{save, change} {
			go func() {
				<-start
				_, err := f.submit(ev)
				errs <- err
			}()
		}
		close(start)
		for range 2 {
			require.NoError(t, <-errs, "round %d", round)
		}
	}
	require.True(t, f.workflow(wf).Enabled)
}
