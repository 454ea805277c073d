package main

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/buzzrelay/buzz/internal/dbtest"
	"github.com/buzzrelay/buzz/internal/nostr"
)

// A relay process is SIGKILLed while its call_webhook request is in flight
// (the webhook received it and has not answered). A second process on the
// same database resumes the run once the call's lease
// (the client's timeout plus the run lease) has passed, finds the call
// started without an outcome and fails the step "outcome unknown" instead
// of calling again: the webhook saw one request, and the step after it
// never ran. Mutation killed: a resumed step that ignores the started mark
// calls the webhook again (the run completed, two calls).
func TestRelayProcessKilledDuringAWebhookCallIsNotCalledAgain(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	bin := buildRelay(t)
	databaseURL := dbtest.URL(t)
	pool := observerPool(t, databaseURL)

	var calls atomic.Int32
	arrived, release := make(chan struct{}), make(chan struct{})
	hook := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.ReadAll(r.Body)
		if calls.Add(1) == 1 {
			close(arrived)
			select { // A dies with this request open
			case <-release:
			case <-r.Context().Done():
			}
			return
		}
		_, _ = io.WriteString(w, "again")
	}))
	t.Cleanup(hook.Close)
	t.Cleanup(func() { close(release) })
	certFile := writeCertFile(t, hook)
	env := func(name string) map[string]string {
		return map[string]string{
			"BUZZ_DATABASE_URL":                  withAppName(t, databaseURL, name),
			"BUZZ_WORKFLOW_RUN_LEASE":            "2s",
			"BUZZ_WORKFLOW_POLL":                 "100ms",
			"BUZZ_WORKFLOW_WEBHOOK_TIMEOUT":      "2s",
			"BUZZ_WORKFLOW_WEBHOOK_ALLOWED_NETS": "127.0.0.1/32",
			"SSL_CERT_FILE":                      certFile,
		}
	}
	a := startRelayProcess(t, bin, "relay-a", env("relay-a"))
	owner := a.client(t, nil)
	channel := newChannel(t, owner, "deploys")
	wf := saveWorkflow(t, owner, channel, "name: Deploy\ntrigger: {on: message_posted}\nsteps:\n"+
		"  - {id: hook, action: call_webhook, url: '"+hook.URL+"/deploy', body: '{{trigger.text}}'}\n"+
		"  - {id: say, action: send_message, text: 'deployed'}\n")
	ok := owner.Publish(owner.Sign(9, "ship it", nostr.Tags{{"h", channel}}, 0))
	require.True(t, ok.OK, ok.Msg)
	select {
	case <-arrived:
	case <-time.After(time.Minute):
		t.Fatal("A never called the webhook")
	}
	// A dies with its call in flight (the client's timeout is still ahead),
	// then B starts on the same database.
	var leaseLeft time.Duration
	require.NoError(t, pool.QueryRow(ctx, `SELECT lease_until - now() FROM workflow_runs WHERE workflow_id = $1`, wf).Scan(&leaseLeft))
	a.kill()
	b := startRelayProcess(t, bin, "relay-b", env("relay-b"))

	var status, code, message string
	var attempts int
	require.Eventually(t, func() bool {
		err := pool.QueryRow(ctx, `SELECT status, coalesce(error_code, ''), coalesce(error_message, ''), attempts FROM workflow_runs WHERE workflow_id = $1`, wf).
			Scan(&status, &code, &message, &attempts)
		return err == nil && status != "running" && status != "pending"
	}, 60*time.Second, 20*time.Millisecond, "B resumes the run after A's lease")
	t.Logf("call lease left when A was killed: %s", leaseLeft.Round(time.Millisecond))
	require.Equal(t, "failed", status)
	require.Equal(t, "webhook_failed", code)
	require.Contains(t, message, "outcome unknown")
	require.Equal(t, 2, attempts, "claimed by A, then by B after the call's lease")
	require.EqualValues(t, 1, calls.Load(), "the webhook is called once")
	var said int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM events WHERE kind = 9 AND content = 'deployed'`).Scan(&said))
	require.Zero(t, said, "the step after the call never ran")
	_ = b
}
