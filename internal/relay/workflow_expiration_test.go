package relay_test

import (
	"encoding/json"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/buzzrelay/buzz/internal/clock"
	"github.com/buzzrelay/buzz/internal/config"
	"github.com/buzzrelay/buzz/internal/dbtest"
	"github.com/buzzrelay/buzz/internal/nostr"
	"github.com/buzzrelay/buzz/internal/relay"
	"github.com/buzzrelay/buzz/internal/relaytest"
	"github.com/buzzrelay/buzz/internal/workflow"
)

// A workflow whose definition event carries an expiration (NIP-40) fires
// nothing once it passed: no run from a message, a schedule slot, a webhook
// call or the owner's command, before the purge deleted the event and after
// (the workflow row stays, so it must not fire for ever, each run failing
// closed). A run created before it expired fails at its next step with
// invalid_definition. A workflow without an expiration in the same channel
// fires throughout, and a re-save without one makes the expired workflow
// fire again. All on the relay's stopped clock.
//
// Mutations killed: WorkflowsTriggerable, WorkflowsScheduled or the webhook
// and command checks without the expiration condition (the expired
// workflow's message run, slot run, 202 or OK appear); loadPinned without
// the event's expiry (the in-flight run executes, completed); the upsert
// not setting definition_expires_at (nothing ever expires).
func TestAnExpiredWorkflowDefinitionFiresNothing(t *testing.T) {
	t.Parallel()
	r, owner, now, start := startOnAStoppedClock(t)
	stub := clock.Stub(func() time.Time { return time.Unix(now.Load(), 0) })
	ch := createChannel(t, owner, "expiring", false)
	expires := nostr.Tag{"expiration", strconv.FormatInt(start.Add(time.Hour).Unix(), 10)}

	save := func(yaml string, extra ...nostr.Tag) (id, reply string) {
		t.Helper()
		id = uuid.NewString()
		ok := owner.Publish(owner.Sign(30620, yaml, append(nostr.Tags{{"d", id}, {"h", ch}}, extra...), now.Load()))
		require.True(t, ok.OK, ok.Msg)
		return id, ok.Msg
	}
	const onMessage = "name: M\ntrigger: {on: message_posted}\nsteps: [{id: a, action: send_message, text: 'seen {{trigger.text}}'}]"
	expiringMessage, _ := save(onMessage, expires)
	lasting, _ := save("name: L\ntrigger: {on: message_posted}\nsteps: [{id: a, action: send_message, text: 'lasting'}]")
	scheduled, _ := save("name: S\ntrigger: {on: schedule, interval: 60s}\nsteps: [{id: a, action: send_message, text: tick}]", expires)
	hook, hookReply := save("name: H\ntrigger: {on: webhook}\nsteps: [{id: a, action: send_message, text: hooked}]", expires)
	secret := webhookSecret(t, hookReply)

	posted := 0
	post := func() {
		t.Helper()
		posted++ // each its own event: the same one twice is a duplicate
		ok := owner.Publish(owner.Sign(9, "hello "+strconv.Itoa(posted), nostr.Tags{{"h", ch}}, now.Load()))
		require.True(t, ok.OK, ok.Msg)
	}
	callHook := func() (int, map[string]string) {
		t.Helper()
		req, err := http.NewRequest(http.MethodPost, r.HTTPURL+"/hooks/"+hook, strings.NewReader(`{}`))
		require.NoError(t, err)
		req.Header.Set("X-Webhook-Secret", secret)
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		defer resp.Body.Close()
		var out map[string]string
		require.NoError(t, json.NewDecoder(resp.Body).Decode(&out))
		return resp.StatusCode, out
	}
	command := func(workflowID string) (bool, string) {
		t.Helper()
		ok := owner.Publish(owner.Sign(46020, "", nostr.Tags{{"d", workflowID}}, now.Load()))
		return ok.OK, ok.Msg
	}
	sched := workflow.NewScheduler(r.Pool, stub, 0, nil, nil)

	// Before the expiration every trigger fires.
	now.Store(start.Add(2 * time.Minute).Unix())
	post()
	require.Equal(t, 1, workflowRuns(t, r, expiringMessage))
	require.Equal(t, 1, workflowRuns(t, r, lasting))
	fired, err := sched.Tick(t.Context())
	require.NoError(t, err)
	require.Equal(t, 2, fired, "the slots of the first two minutes")
	status, out := callHook()
	require.Equal(t, http.StatusAccepted, status, out)
	ok, msg := command(expiringMessage)
	require.True(t, ok, msg)
	require.Equal(t, 2, workflowRuns(t, r, expiringMessage))

	// Past it, nothing of the expired definitions fires, purged or not.
	now.Store(start.Add(2 * time.Hour).Unix())
	firesNothing := func(stage string) {
		t.Helper()
		post()
		require.Equal(t, 2, workflowRuns(t, r, expiringMessage), stage)
		fired, err := sched.Tick(t.Context())
		require.NoError(t, err)
		require.Zero(t, fired, stage)
		require.Equal(t, 2, workflowRuns(t, r, scheduled), stage)
		status, out := callHook()
		require.Equal(t, http.StatusConflict, status, stage)
		require.Equal(t, "invalid: the workflow's definition expired (NIP-40); save it again to run it", out["error"], stage)
		require.Equal(t, 1, workflowRuns(t, r, hook), stage)
		ok, msg := command(expiringMessage)
		require.False(t, ok, stage)
		require.Equal(t, "invalid: the workflow's definition expired (NIP-40); save it again to run it", msg, stage)
	}
	firesNothing("expired")

	// The runs created before the expiration fail closed at their step,
	// before the purge as after it.
	require.NoError(t, r.Server.StartWorkflows(t.Context()))
	var failedRuns int
	require.Eventually(t, func() bool {
		require.NoError(t, r.Pool.QueryRow(t.Context(), `SELECT count(*) FROM workflow_runs
			WHERE community_id = $1 AND workflow_id = ANY($2::uuid[]) AND status = 'failed' AND error_code = 'invalid_definition'
			  AND error_message = 'the pinned definition event expired (NIP-40) while the run was executing'`,
			r.CommunityID, []string{expiringMessage, scheduled, hook}).Scan(&failedRuns))
		return failedRuns == 5
	}, 30*time.Second, 20*time.Millisecond, "the five runs of expired definitions fail closed")

	require.GreaterOrEqual(t, r.Server.PurgeExpired(t.Context()), int64(3), "the three definitions are purged")
	firesNothing("expired and purged")
	require.Equal(t, 3, workflowRuns(t, r, lasting), "a definition without an expiration fires throughout")

	// Saved again without an expiration, it fires again.
	ok2 := owner.Publish(owner.Sign(30620, onMessage, nostr.Tags{{"d", expiringMessage}, {"h", ch}}, now.Load()))
	require.True(t, ok2.OK, ok2.Msg)
	post()
	require.Equal(t, 3, workflowRuns(t, r, expiringMessage))
}

// An expired workflow fires nothing, so it takes no place in its channel's
// bound of firing workflows: with a bound of one, a second workflow is
// refused while the first's definition lasts and accepted once it expired.
// Mutation killed: WorkflowsActiveInChannel counting expired workflows (the
// second save stays refused).
func TestAnExpiredWorkflowTakesNoPlaceInItsChannelsBound(t *testing.T) {
	t.Parallel()
	now := new(atomic.Int64)
	start := time.Now().Truncate(time.Second)
	now.Store(start.Unix())
	stub := clock.Stub(func() time.Time { return time.Unix(now.Load(), 0) })
	r := relaytest.StartWith(t, dbtest.Pool(t), []relay.Option{relay.WithClock(stub)}, func(c *config.Config) { c.WorkflowMaxPerChannel = 1 })
	owner := r.Dial(t, "")
	owner.Auth(nil)
	ch := createChannel(t, owner, "bounded", false)
	save := func(extra ...nostr.Tag) relaytest.Reply {
		t.Helper()
		return owner.Publish(owner.Sign(30620, "name: M\ntrigger: {on: message_posted}\nsteps: [{id: a, action: send_message, text: x}]",
			append(nostr.Tags{{"d", uuid.NewString()}, {"h", ch}}, extra...), now.Load()))
	}
	first := save(nostr.Tag{"expiration", strconv.FormatInt(start.Add(time.Hour).Unix(), 10)})
	require.True(t, first.OK, first.Msg)
	second := save()
	require.False(t, second.OK)
	require.Equal(t, "restricted: the channel has its limit of 1 active workflows; archive one first", second.Msg)

	now.Store(start.Add(2 * time.Hour).Unix())
	second = save()
	require.True(t, second.OK, second.Msg)
}
