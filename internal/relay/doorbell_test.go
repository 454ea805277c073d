package relay_test

import (
	"context"
	"net/http"
	"sort"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/buzzrelay/buzz/internal/nostr"
	"github.com/buzzrelay/buzz/internal/outbox"
)

// A message-triggered workflow's doorbell reaches the agents it wakes by
// every path a user's mention would: an operator listener registered for
// the owner and for the @-mentioned member gets one delivery for each,
// naming the stored doorbell (whose tags are exactly the doorbell's), through
// the post-commit hand-off (the outbox poll is minutes away); the member's
// live subscription gets the doorbell too.
//
// Mutations killed: sending the doorbell with Emit (no outbox rows) or
// dropping the outbox side row's Wakes mark: "the listener was not called";
// PublishEmitted not running the after-commit hand-off: the same, since
// only the poll could deliver; a second delivery for a target fails the
// exactly-once check.
func TestDoorbellReachesOperatorListenersAndLiveSubscribers(t *testing.T) {
	t.Parallel()
	h := startHandoffRelay(t) // the listener serves h.agent
	r := h.Relay
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	require.NoError(t, r.Server.StartWorkflows(ctx))
	owner := h.client
	ownerHex := owner.Key.PublicKeyHex()

	// The same listener also serves the owner.
	body := []byte(`{"pubkeys":["` + ownerHex + `"]}`)
	reply := operatorRequest(t, r, http.MethodPost, "", body, nip98(t, h.listenerKey, "POST", r.HTTPURL+outbox.RegistrationPath, body, nil))
	require.Equal(t, http.StatusOK, reply.Status, reply.Raw)

	// The agent is a member with a display name, subscribed to what names it.
	agent := r.Dial(t, "")
	agent.Auth(h.agent)
	agentHex := h.agent.PublicKeyHex()
	require.True(t, agent.Publish(agent.Sign(0, `{"display_name":"Robby"}`, nil, 0)).OK)
	require.True(t, agent.Publish(agent.Sign(9021, "", nostr.Tags{{"h", h.channel}}, 0)).OK)
	agent.Send("REQ", "woken", map[string]any{"kinds": []int{9}, "#h": []string{h.channel}, "#p": []string{agentHex}, "limit": 0})
	agent.Expect("EOSE")

	wf := uuid.NewString()
	def := owner.Sign(30620, "name: Bell\ntrigger: {on: message_posted}\nsteps: [{id: ping, action: send_message, text: '@Robby please look: {{trigger.text}}'}]",
		nostr.Tags{{"d", wf}, {"h", h.channel}}, 0)
	ok := owner.Publish(def)
	require.True(t, ok.OK, ok.Msg)
	trigger := owner.Sign(9, "deploy finished", nostr.Tags{{"h", h.channel}}, 0)
	ok = owner.Publish(trigger)
	require.True(t, ok.OK, ok.Msg)

	delivered := map[string]string{} // woken pubkey -> event id
	for range 2 {
		got := h.nextDelivery(t)
		pubkey, _ := got["pubkey"].(string)
		_, twice := delivered[pubkey]
		require.False(t, twice, "one delivery per woken pubkey, got a second for %s", pubkey)
		delivered[pubkey], _ = got["event_id"].(string)
		require.EqualValues(t, 9, got["event_kind"])
	}
	bellID := delivered[ownerHex]
	require.NotEmpty(t, bellID, "the owner is woken")
	require.Equal(t, bellID, delivered[agentHex], "the mentioned member is woken by the same doorbell")
	require.Eventually(t, func() bool { _, done := h.watch.snapshot(); return len(done) == 2 },
		30*time.Second, 10*time.Millisecond, "both outbox rows were handed to the listener worker and completed")
	polls, _ := h.watch.snapshot()
	require.Equal(t, 1, polls, "only the start-up poll ran: the hand-off delivered")

	live := agent.Expect("EVENT")
	require.Equal(t, "woken", live.SubID)
	require.Equal(t, bellID, live.Event.ID, "the doorbell is in the member's live feed")

	stored := owner.Req("bell", map[string]any{"ids": []string{bellID}})
	require.Len(t, stored, 1)
	bell := stored[0]
	require.NoError(t, bell.Verify())
	var runID string
	require.NoError(t, r.Pool.QueryRow(ctx, `SELECT id::text FROM workflow_runs WHERE workflow_id = $1`, wf).Scan(&runID))
	require.Equal(t, nostr.Tags{
		{"workflow-run", runID},
		{"workflow-step", "ping"},
		{"workflow-owner", ownerHex},
		{"workflow-definition", def.ID, "ping"},
		{"workflow-cause", "event", trigger.ID},
		{"p", ownerHex},
		{"h", h.channel},
		{"buzz:workflow", "doorbell-v1"},
		{"p", agentHex},
	}, bell.Tags)
	require.Equal(t, bell.Tags, live.Event.Tags)

	// Exactly once: both rows are deleted once delivered, so nothing is left
	// that could be delivered again.
	waitForEmptyOutbox(t, r, 30*time.Second, "the delivered rows are gone")
	select {
	case extra := <-h.deliveries:
		t.Fatalf("a third delivery: %v", extra)
	default:
	}
	var mentioned []string
	rows, err := r.Pool.Query(ctx, `SELECT pubkey_hex FROM event_mentions WHERE encode(event_id, 'hex') = $1`, bellID)
	require.NoError(t, err)
	for rows.Next() {
		var pk string
		require.NoError(t, rows.Scan(&pk))
		mentioned = append(mentioned, pk)
	}
	require.NoError(t, rows.Err())
	sort.Strings(mentioned)
	want := []string{ownerHex, agentHex}
	sort.Strings(want)
	require.Equal(t, want, mentioned, "the doorbell's mention rows name exactly the woken pubkeys")
}
