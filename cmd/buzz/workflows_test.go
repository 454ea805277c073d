package main

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/buzzrelay/buzz/internal/nostr"
	"github.com/buzzrelay/buzz/internal/relaytest"
)

// buzz workflows list, show, trigger, runs, approve and deny against a real
// relay running its workflow worker. Mutation killed: a trigger that does
// not print the relay's response (or a runs command signing the wrong URL)
// fails the run-id comparison; a trigger not re-signed when the relay
// answers duplicate fails the second trigger within one second.
func TestWorkflowsCommands(t *testing.T) {
	t.Parallel()
	r := relaytest.Start(t)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	require.NoError(t, r.Server.StartWorkflows(ctx))
	env, kp := newUser(t, r)
	ch := createChannel(t, env, "flows")
	key, err := nostr.SecretKeyFromHex(kp.SecretKey)
	require.NoError(t, err)
	owner := r.Dial(t, "")
	owner.Auth(key)
	wf := uuid.NewString()
	ok := owner.Publish(owner.Sign(30620, "name: Ask\ntrigger: {on: webhook}\nsteps: [{id: ask, action: request_approval, from: any, message: go?}, {id: done, action: send_message, text: done}]",
		nostr.Tags{{"d", wf}, {"h", ch.ID}}, 0))
	require.True(t, ok.OK, ok.Msg)

	var list []workflowJSON
	buzz(t, env, "", "workflows", "list", ch.ID).ok(t, &list)
	require.Len(t, list, 1)
	require.Equal(t, wf, list[0].ID)
	var shown workflowJSON
	buzz(t, env, "", "workflows", "show", wf).ok(t, &shown)
	require.Contains(t, shown.YAML, "request_approval")

	var triggered struct {
		RunID string `json:"run_id"`
	}
	buzz(t, env, "", "workflows", "trigger", wf).ok(t, &triggered)
	require.Len(t, triggered.RunID, 36)

	var page struct {
		Runs []struct {
			ID             string          `json:"id"`
			WorkflowID     string          `json:"workflow_id"`
			Status         string          `json:"status"`
			CurrentStep    int             `json:"current_step"`
			ExecutionTrace json.RawMessage `json:"execution_trace"`
			StartedAt      *int64          `json:"started_at"`
			CompletedAt    *int64          `json:"completed_at"`
			ErrorCode      *string         `json:"error_code"`
			ErrorMessage   *string         `json:"error_message"`
			CreatedAt      int64           `json:"created_at"`
		} `json:"runs"`
		Next json.RawMessage `json:"next"`
	}
	require.Eventually(t, func() bool {
		buzz(t, env, "", "workflows", "runs", wf, "--limit", "5").ok(t, &page)
		return len(page.Runs) == 1 && page.Runs[0].Status == "waiting_approval"
	}, 30*time.Second, 50*time.Millisecond)
	require.Equal(t, triggered.RunID, page.Runs[0].ID)

	var ref string
	require.NoError(t, r.Pool.QueryRow(ctx, `SELECT encode(token, 'hex') FROM workflow_approvals WHERE run_id = $1`, triggered.RunID).Scan(&ref))
	var decided struct {
		Status string `json:"status"`
		RunID  string `json:"run_id"`
	}
	buzz(t, env, "", "workflows", "approve", ref).ok(t, &decided)
	require.Equal(t, "granted", decided.Status)
	require.Equal(t, triggered.RunID, decided.RunID)
	e := buzz(t, env, "", "workflows", "deny", ref).fail(t, 3)
	require.Equal(t, "invalid", e.Code)
	buzz(t, env, "", "workflows", "trigger", "not-a-uuid").fail(t, 2)

	// A trigger repeated within one second is a second run, not the
	// relay's duplicate answer "without a response".
	var again, twice struct {
		RunID string `json:"run_id"`
	}
	startOfNextSecond()
	buzz(t, env, "", "workflows", "trigger", wf).ok(t, &again)
	buzz(t, env, "", "workflows", "trigger", wf).ok(t, &twice)
	require.Len(t, twice.RunID, 36)
	require.NotEqual(t, again.RunID, twice.RunID)
}
