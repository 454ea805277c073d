package relay_test

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/buzzrelay/buzz/internal/nostr"
	"github.com/buzzrelay/buzz/internal/relaytest"
)

// A kind 5 naming a workflow's pinned definition event by id (an e tag, as
// NIP-09 deletes any event) stops the workflow as deleting its coordinate
// does: a message starts no run, a webhook call is refused, the owner's
// command answers that it is archived. Another member's e tag naming it
// changes nothing. Before, only the coordinate archived the row: deleted
// by id, the workflow went on firing, every run failing closed with
// invalid_definition (a schedule one per slot, for good). A moderator's
// 9005 hiding a member's definition stops that workflow likewise.
//
// Mutations killed: archiveDeleted without the e-tag lookup (the message's
// run is created, the call answers 202, the command is accepted);
// deletesDefinitions without 9005 (the hidden workflow's run is created).
func TestDeletingAWorkflowsDefinitionByIDArchivesIt(t *testing.T) {
	t.Parallel()
	r := relaytest.Start(t)
	owner := r.Dial(t, "")
	owner.Auth(nil)
	other := r.Dial(t, "")
	other.Auth(nil)
	ch := createChannel(t, owner, "deleting", false)
	require.True(t, other.Publish(other.Sign(9021, "", nostr.Tags{{"h", ch}}, 0)).OK)

	saveEvent := func(yaml string) (id string, def *nostr.Event, reply string) {
		t.Helper()
		id = uuid.NewString()
		def = owner.Sign(30620, yaml, nostr.Tags{{"d", id}, {"h", ch}}, 0)
		ok := owner.Publish(def)
		require.True(t, ok.OK, ok.Msg)
		return id, def, ok.Msg
	}
	onMessage, onMessageDef, _ := saveEvent("name: M\ntrigger: {on: message_posted}\nsteps: [{id: a, action: send_message, text: seen}]")
	hook, hookDef, hookReply := saveEvent("name: H\ntrigger: {on: webhook}\nsteps: [{id: a, action: send_message, text: hooked}]")
	secret := webhookSecret(t, hookReply)
	posted := 0
	post := func() {
		t.Helper()
		posted++
		ok := other.Publish(other.Sign(9, "hello "+itoa(posted), nostr.Tags{{"h", ch}}, 0))
		require.True(t, ok.OK, ok.Msg)
	}
	callHook := func() (int, string) {
		t.Helper()
		req, err := http.NewRequest(http.MethodPost, r.HTTPURL+"/hooks/"+hook, strings.NewReader(`{}`))
		require.NoError(t, err)
		req.Header.Set("X-Webhook-Secret", secret)
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		defer resp.Body.Close()
		var out map[string]string
		require.NoError(t, json.NewDecoder(resp.Body).Decode(&out))
		return resp.StatusCode, out["error"]
	}
	deleteByID := func(c *relaytest.Client, ids ...string) {
		t.Helper()
		tags := nostr.Tags{{"h", ch}}
		for _, id := range ids {
			tags = append(tags, nostr.Tag{"e", id})
		}
		ok := c.Publish(c.Sign(5, "", tags, 0))
		require.True(t, ok.OK, ok.Msg)
	}

	// Someone else's deletion naming the definitions deletes nothing.
	deleteByID(other, onMessageDef.ID, hookDef.ID)
	post()
	require.Equal(t, 1, workflowRuns(t, r, onMessage))
	status, _ := callHook()
	require.Equal(t, http.StatusAccepted, status)

	deleteByID(owner, onMessageDef.ID, hookDef.ID)
	post()
	require.Equal(t, 1, workflowRuns(t, r, onMessage), "a message after the definition was deleted by id starts no run")
	status, msg := callHook()
	require.Equal(t, http.StatusConflict, status)
	require.Equal(t, "invalid: workflow is not accepting webhook calls", msg)
	require.Equal(t, 1, workflowRuns(t, r, hook))
	ok := owner.Publish(owner.Sign(46020, "", nostr.Tags{{"d", onMessage}}, 0))
	require.False(t, ok.OK)
	require.Equal(t, "invalid: workflow is archived", ok.Msg)

	// A channel moderator hiding a member's definition (9005) stops it too.
	members := uuid.NewString()
	membersDef := other.Sign(30620, "name: O\ntrigger: {on: message_posted}\nsteps: [{id: a, action: send_message, text: mine}]",
		nostr.Tags{{"d", members}, {"h", ch}}, 0)
	ok = other.Publish(membersDef)
	require.True(t, ok.OK, ok.Msg)
	post()
	require.Equal(t, 1, workflowRuns(t, r, members))
	ok = owner.Publish(owner.Sign(9005, "", nostr.Tags{{"h", ch}, {"e", membersDef.ID}}, 0))
	require.True(t, ok.OK, ok.Msg)
	post()
	require.Equal(t, 1, workflowRuns(t, r, members), "a message after the moderator hid the definition starts no run")
}

// The deletion's side rows archive a workflow only for an event that
// deletion may delete: a kind 5 its author's, a 9005 its channel's. Hidden
// alone does not do: a definition deleted by id before these side rows
// existed stayed hidden with its workflow active (made here as that
// release left it), and any member's kind 5 naming its id, or the 9005 of
// a moderator of another channel, then archived someone else's workflow.
// The owner's own kind 5 still archives it.
//
// Mutation killed: WorkflowsArchiveByDefinitionEvent without the author
// and channel condition (the stranger's kind 5 archives the workflow).
func TestADeletionArchivesOnlyTheWorkflowsOfWhatItMayDelete(t *testing.T) {
	t.Parallel()
	r := relaytest.Start(t)
	owner := r.Dial(t, "")
	owner.Auth(nil)
	other := r.Dial(t, "")
	other.Auth(nil)
	ch := createChannel(t, owner, "stale", false)
	elsewhere := createChannel(t, other, "elsewhere", false)
	require.True(t, other.Publish(other.Sign(9021, "", nostr.Tags{{"h", ch}}, 0)).OK)

	workflowID := uuid.NewString()
	def := owner.Sign(30620, "name: M\ntrigger: {on: message_posted}\nsteps: [{id: a, action: send_message, text: seen}]",
		nostr.Tags{{"d", workflowID}, {"h", ch}}, 0)
	ok := owner.Publish(def)
	require.True(t, ok.OK, ok.Msg)
	_, err := r.Pool.Exec(t.Context(), `UPDATE events SET deleted_at = now() WHERE community_id = $1 AND id = decode($2, 'hex')`,
		r.CommunityID, def.ID)
	require.NoError(t, err)
	status := func() string {
		t.Helper()
		var s string
		require.NoError(t, r.Pool.QueryRow(t.Context(), `SELECT status FROM workflows WHERE community_id = $1 AND id = $2`,
			r.CommunityID, workflowID).Scan(&s))
		return s
	}

	ok = other.Publish(other.Sign(5, "", nostr.Tags{{"e", def.ID}}, 0))
	require.True(t, ok.OK, ok.Msg)
	require.Equal(t, "active", status(), "another member's kind 5 naming the hidden definition")
	ok = other.Publish(other.Sign(9005, "", nostr.Tags{{"h", elsewhere}, {"e", def.ID}}, 0))
	require.True(t, ok.OK, ok.Msg)
	require.Equal(t, "active", status(), "a 9005 of another channel's moderator naming it")

	ok = owner.Publish(owner.Sign(5, "", nostr.Tags{{"e", def.ID}}, 0))
	require.True(t, ok.OK, ok.Msg)
	require.Equal(t, "archived", status(), "the owner's own kind 5 naming it")
}
