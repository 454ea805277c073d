package relay_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/buzzrelay/buzz/internal/nostr"
	"github.com/buzzrelay/buzz/internal/relaytest"
)

// Over a real WebSocket: a saved definition answers with its workflow id, a
// message in the channel wakes the relay's worker, which posts the
// relay-signed doorbell into the channel; the manual command answers with
// the run id. Mutation killed: a relay that does not register workflows
// (registerWorkflows removed) stores the 30620 without a reply and never
// posts the doorbell.
func TestWorkflowOverWebSocket(t *testing.T) {
	t.Parallel()
	r := relaytest.Start(t)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	r.Server.StartWorkflows(ctx)
	owner := r.Dial(t, "")
	owner.Auth(nil)
	ch := createChannel(t, owner, "ops", false)

	wf := uuid.NewString()
	ok := owner.Publish(owner.Sign(30620, "name: Ping\ntrigger: {on: message_posted}\nsteps: [{id: ping, action: send_message, text: 'pong {{trigger.text}}'}]",
		nostr.Tags{{"d", wf}, {"h", ch}}, 0))
	require.True(t, ok.OK, ok.Msg)
	require.Equal(t, `response:{"workflow_id":"`+wf+`"}`, ok.Msg)

	ok = owner.Publish(owner.Sign(9, "hello", nostr.Tags{{"h", ch}}, 0))
	require.True(t, ok.OK, ok.Msg)
	var bell *nostr.Event
	require.Eventually(t, func() bool {
		for _, ev := range owner.Req("bells", map[string]any{"kinds": []int{9}, "#h": []string{ch}}) {
			if ev.Content == "pong hello" {
				bell = ev
				return true
			}
		}
		return false
	}, 30*time.Second, 50*time.Millisecond)
	require.NoError(t, bell.Verify())
	require.NotEqual(t, owner.Key.PublicKeyHex(), bell.PubKey, "signed by the relay")
	require.Contains(t, bell.Tags, nostr.Tag{"buzz:workflow", "doorbell-v1"})

	ok = owner.Publish(owner.Sign(46020, "", nostr.Tags{{"d", wf}}, 0))
	require.True(t, ok.OK, ok.Msg)
	require.True(t, strings.HasPrefix(ok.Msg, `response:{"run_id":"`), ok.Msg)
}
