package main

import (
	"context"
	"encoding/pem"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/buzzrelay/buzz/internal/dbtest"
	"github.com/buzzrelay/buzz/internal/nostr"
	"github.com/buzzrelay/buzz/internal/relaytest"
)

// Every PostgreSQL backend of a relay process is terminated
// (pg_terminate_backend) while it holds a workflow run's claim with its
// webhook call in flight and a mention's claim with its POST in flight.
// When the two answer, the process records both outcomes on fresh
// connections: the run completes with the webhook called once and its
// next step stored once, and the mention's row is gone after one POST.
//
// Mutations killed: the call's outcome recorded without trying again on a
// transient error (its first statement meets a terminated session and the
// run fails database_error); the listener's completion likewise (the row
// stays leased and is POSTed a second time after the lease).
func TestRelayProcessRecordsClaimsHeldWhileItsBackendsWereTerminated(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	bin := buildRelay(t)
	databaseURL := dbtest.URL(t)
	pool := observerPool(t, databaseURL)

	var calls, posts atomic.Int32
	callArrived, postArrived, release := make(chan struct{}), make(chan struct{}), make(chan struct{})
	hook := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.ReadAll(r.Body)
		if calls.Add(1) == 1 {
			close(callArrived)
			<-release
		}
		_, _ = io.WriteString(w, "pong")
	}))
	t.Cleanup(hook.Close)
	listener := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost {
			return
		}
		_, _ = io.ReadAll(r.Body)
		if posts.Add(1) == 1 {
			close(postArrived)
			<-release
		}
	}))
	t.Cleanup(listener.Close)
	listenerKey := relaytest.NewKey(t)
	env := listenerEnv(t, databaseURL, "relay", listenerKey, listener)
	env["SSL_CERT_FILE"] = writeCertFiles(t, hook, listener)
	env["BUZZ_WORKFLOW_POLL"] = "100ms"
	env["BUZZ_WORKFLOW_WEBHOOK_ALLOWED_NETS"] = "127.0.0.1/32"
	env["BUZZ_OPERATOR_LISTENER_TIMEOUT_MS"] = "10000"
	p := startRelayProcess(t, bin, "relay", env)
	target := registerTarget(t, pool, listenerKey)

	owner := p.client(t, nil)
	channel := newChannel(t, owner, "deploys")
	wf := saveWorkflow(t, owner, channel, "name: Deploy\ntrigger: {on: message_posted}\nsteps:\n"+
		"  - {id: hook, action: call_webhook, url: '"+hook.URL+"/deploy', body: '{{trigger.text}}'}\n"+
		"  - {id: say, action: send_message, text: 'deployed {{steps.hook.output.body}}'}\n")
	ok := owner.Publish(owner.Sign(9, "ship it", nostr.Tags{{"h", channel}, {"p", target.PublicKeyHex()}}, 0))
	require.True(t, ok.OK, ok.Msg)
	for _, arrived := range []chan struct{}{callArrived, postArrived} {
		select {
		case <-arrived:
		case <-time.After(time.Minute):
			t.Fatal("the webhook call or the mention's POST never arrived")
		}
	}

	var terminated int
	require.NoError(t, pool.QueryRow(ctx, `
		SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) FROM pg_stat_activity
		WHERE datname = current_database() AND application_name = 'relay'`).Scan(&terminated))
	require.Positive(t, terminated)
	t.Logf("terminated %d backends of the relay", terminated)
	close(release)

	var status string
	require.Eventually(t, func() bool {
		return pool.QueryRow(ctx, `SELECT status FROM workflow_runs WHERE workflow_id = $1`, wf).Scan(&status) == nil &&
			status != "running" && status != "pending"
	}, time.Minute, 20*time.Millisecond, "the run ends")
	require.Equal(t, "completed", status)
	require.Eventually(t, func() bool {
		var n int
		return pool.QueryRow(ctx, `SELECT count(*) FROM operator_listener_outbox`).Scan(&n) == nil && n == 0
	}, time.Minute, 20*time.Millisecond, "the delivered mention's row is gone")
	var said int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM events WHERE kind = 9 AND content = 'deployed pong'`).Scan(&said))
	require.Equal(t, 1, said, "the step after the call is stored once")
	require.EqualValues(t, 1, calls.Load(), "the webhook is called once")
	require.EqualValues(t, 1, posts.Load(), "the mention is POSTed once")
}

// writeCertFiles stores the certificates of servers in one file a relay
// process trusts through SSL_CERT_FILE.
func writeCertFiles(t *testing.T, servers ...*httptest.Server) string {
	t.Helper()
	var all []byte
	for _, srv := range servers {
		all = append(all, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw})...)
	}
	file := filepath.Join(t.TempDir(), "cas.pem")
	require.NoError(t, os.WriteFile(file, all, 0o600))
	return file
}
