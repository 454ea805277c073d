package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"encoding/pem"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/buzzrelay/buzz/internal/dbtest"
	"github.com/buzzrelay/buzz/internal/nostr"
	"github.com/buzzrelay/buzz/internal/relaytest"
)

// These tests run real `buzz-relay serve` processes on one database: what
// they check (a process killed mid-run, several processes racing for a
// schedule slot) only happens across processes.

// processHost is the community every relay process of a test serves: they
// all seed it from the same BUZZ_RELAY_URL.
const processHost = "workflows.test"

// buildRelay compiles this command into a fresh directory. It is built
// with -race when the test is, so the build reuses the packages the test
// binary was compiled from and only links.
func buildRelay(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "buzz-relay")
	args := []string{"build", "-o", bin}
	if raceEnabled {
		args = append(args, "-race")
	}
	out, err := exec.Command("go", append(args, ".")...).CombinedOutput()
	require.NoError(t, err, "go build: %s", out)
	return bin
}

// relayProcess is one running `buzz-relay serve`.
type relayProcess struct {
	name   string
	cmd    *exec.Cmd
	logs   *lockedBuffer
	exited chan struct{}
	addr   string // the public listener, host:port
}

// withAppName sets the PostgreSQL application_name of a process's
// connections, so the test can find its backends in pg_stat_activity.
func withAppName(t *testing.T, databaseURL, name string) string {
	t.Helper()
	u, err := url.Parse(databaseURL)
	require.NoError(t, err)
	q := u.Query()
	q.Set("application_name", name)
	u.RawQuery = q.Encode()
	return u.String()
}

// observerPool is the test's own pool on the relays' database, named so a
// test can tell its sessions from the relays' in pg_stat_activity.
func observerPool(t *testing.T, databaseURL string) *pgxpool.Pool {
	t.Helper()
	pool, err := pgxpool.New(context.Background(), withAppName(t, databaseURL, "test-observer"))
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	return pool
}

// startRelayProcess runs bin serve with env (on top of loopback listeners
// on free ports and the shared relay URL) and waits until it is ready. The
// process is killed when the test ends, and its log is shown if the test
// failed.
func startRelayProcess(t *testing.T, bin, name string, env map[string]string) *relayProcess {
	t.Helper()
	p := &relayProcess{name: name, logs: &lockedBuffer{}, exited: make(chan struct{})}
	p.cmd = exec.Command(bin, "serve")
	p.cmd.Env = []string{
		"PATH=" + os.Getenv("PATH"),
		"BUZZ_LISTEN_ADDR=127.0.0.1:0",
		"BUZZ_METRICS_ADDR=127.0.0.1:0",
		"BUZZ_RELAY_URL=ws://" + processHost,
	}
	for k, v := range env {
		p.cmd.Env = append(p.cmd.Env, k+"="+v)
	}
	p.cmd.Stdout, p.cmd.Stderr = p.logs, p.logs
	killWithParent(p.cmd)
	require.NoError(t, p.cmd.Start())
	go func() {
		_ = p.cmd.Wait()
		close(p.exited)
	}()
	t.Cleanup(func() {
		p.kill()
		if t.Failed() {
			t.Logf("log of relay process %s:\n%s", name, p.logs.String())
		}
	})

	deadline := time.Now().Add(60 * time.Second)
	for p.addr == "" {
		if addr, ok := p.logs.find("relay listening", "addr"); ok {
			p.addr = addr
			break
		}
		select {
		case <-p.exited:
			t.Fatalf("relay process %s exited before listening: %v\n%s", name, p.cmd.ProcessState, p.logs.String())
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("relay process %s is not listening after 60s:\n%s", name, p.logs.String())
		}
	}
	require.Eventually(t, func() bool {
		resp, err := http.Get("http://" + p.addr + "/ready")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	}, 60*time.Second, 20*time.Millisecond, "relay process %s never became ready", name)
	return p
}

// kill ends the process at once (SIGKILL) and waits for it.
func (p *relayProcess) kill() {
	if p.cmd.Process != nil {
		_ = p.cmd.Process.Kill()
	}
	<-p.exited
}

// stop ends the process the way an operator does (SIGTERM) and waits for it.
func (p *relayProcess) stop(t *testing.T) {
	t.Helper()
	require.NoError(t, p.cmd.Process.Signal(syscall.SIGTERM))
	select {
	case <-p.exited:
	case <-time.After(60 * time.Second):
		t.Fatalf("relay process %s did not stop within 60s of SIGTERM", p.name)
	}
}

// client connects a client authenticated as key (a new key when nil).
func (p *relayProcess) client(t *testing.T, key *nostr.SecretKey) *relaytest.Client {
	t.Helper()
	c := (&relaytest.Relay{URL: "ws://" + p.addr, Host: processHost}).Dial(t, "")
	c.Auth(key)
	return c
}

// find returns attribute key of the first complete log line with message
// msg.
func (b *lockedBuffer) find(msg, key string) (string, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	lines := bufio.NewScanner(bytes.NewReader(b.buf.Bytes()))
	for lines.Scan() {
		var line map[string]any
		if json.Unmarshal(lines.Bytes(), &line) == nil && line["msg"] == msg {
			v, ok := line[key].(string)
			return v, ok
		}
	}
	return "", false
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// newChannel creates a channel owned by c's key and returns its id.
func newChannel(t *testing.T, c *relaytest.Client, name string) string {
	t.Helper()
	id := uuid.NewString()
	ok := c.Publish(c.Sign(9007, "", nostr.Tags{{"h", id}, {"name", name}}, 0))
	require.True(t, ok.OK, ok.Msg)
	return id
}

// saveWorkflow publishes an owner-signed definition and returns its id.
func saveWorkflow(t *testing.T, c *relaytest.Client, channel, yaml string) uuid.UUID {
	t.Helper()
	id := uuid.New()
	ok := c.Publish(c.Sign(30620, yaml, nostr.Tags{{"d", id.String()}, {"h", channel}}, 0))
	require.True(t, ok.OK, ok.Msg)
	return id
}

// A relay process is SIGKILLed in the middle of a two-step run (call a
// webhook, then post the doorbell); another process resumes the run after
// the lease and completes it: the webhook, which cannot be repeated
// safely, was called once, and the doorbell exists once.
//
// Two gates on the test's own database connections pin the moment of the
// kill without sleeps:
//   - the webhook handler locks the workflows table before answering, so
//     process A records the call's outcome (the run advances to step 1)
//     and then blocks on the first read of the send_message step;
//   - the test then locks the run's row and opens the first gate: A stores
//     the doorbell in the step's transaction and blocks on the fenced
//     transition that would record it. That is when A is killed: the
//     doorbell is written but not committed.
//
// Mutations killed: a claim that restarts an abandoned run from its first
// step calls the webhook a second time; a step whose statements are not one
// transaction (the doorbell committed on its own before the fenced
// transition) is caught with no uncommitted doorbell when A is killed; a
// claim that ignores expired leases never lets B resume the run.
func TestKilledRelayProcessRunIsCompletedByAnother(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	bin := buildRelay(t)
	databaseURL := dbtest.URL(t)
	pool := observerPool(t, databaseURL)
	gateConn := func() *pgx.Conn {
		conn, err := pgx.Connect(ctx, withAppName(t, databaseURL, "test-gate"))
		require.NoError(t, err)
		t.Cleanup(func() { conn.Close(context.Background()) })
		return conn
	}
	stepGate, rowGate := gateConn(), gateConn()

	var calls atomic.Int32
	stepGateTaken := make(chan pgx.Tx, 1)
	hook := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if calls.Add(1) == 1 {
			tx, err := stepGate.Begin(ctx)
			if err == nil {
				_, err = tx.Exec(ctx, "LOCK TABLE workflows IN ACCESS EXCLUSIVE MODE")
			}
			if err != nil {
				t.Errorf("webhook handler: take the step gate: %v", err)
				w.WriteHeader(http.StatusInternalServerError)
				return
			}
			stepGateTaken <- tx
		}
		_, _ = io.WriteString(w, "pong")
	}))
	t.Cleanup(hook.Close)
	// The relay trusts the server's certificate and may reach loopback
	// because the operator listed it.
	certFile := writeCertFile(t, hook)
	env := func(name string) map[string]string {
		return map[string]string{
			"BUZZ_DATABASE_URL":                  withAppName(t, databaseURL, name),
			"BUZZ_WORKFLOW_RUN_LEASE":            "3s",
			"BUZZ_WORKFLOW_POLL":                 "100ms",
			"BUZZ_WORKFLOW_WEBHOOK_ALLOWED_NETS": "127.0.0.1/32",
			"SSL_CERT_FILE":                      certFile,
		}
	}

	a := startRelayProcess(t, bin, "relay-a", env("relay-a"))
	owner := a.client(t, nil)
	channel := newChannel(t, owner, "deploys")
	wf := saveWorkflow(t, owner, channel, "name: Deploy\ntrigger: {on: message_posted}\nsteps:\n"+
		"  - {id: hook, action: call_webhook, url: '"+hook.URL+"/deploy', body: '{{trigger.text}}'}\n"+
		"  - {id: say, action: send_message, text: 'deployed: {{steps.hook.output.status}} {{steps.hook.output.body}}'}\n")
	ok := owner.Publish(owner.Sign(9, "ship it", nostr.Tags{{"h", channel}}, 0))
	require.True(t, ok.OK, ok.Msg)

	var run uuid.UUID
	require.Eventually(t, func() bool {
		return pool.QueryRow(ctx, `SELECT id FROM workflow_runs WHERE workflow_id = $1 AND current_step = 1`, wf).Scan(&run) == nil
	}, 60*time.Second, 20*time.Millisecond, "A records the webhook outcome and moves to step 1")
	require.EqualValues(t, 1, calls.Load())
	stepGateTx := <-stepGateTaken

	rowGateTx, err := rowGate.Begin(ctx)
	require.NoError(t, err)
	_, err = rowGateTx.Exec(ctx, `SELECT FROM workflow_runs WHERE id = $1 FOR UPDATE`, run)
	require.NoError(t, err)
	require.NoError(t, stepGateTx.Rollback(ctx))

	// A's step transaction waits on the run row to record the step (the
	// run's last, so the statement is WorkflowRunFinish, named in its text),
	// with the doorbell already stored in it (a row lock on events).
	var backend int
	require.Eventually(t, func() bool {
		return pool.QueryRow(ctx, `
			SELECT pid FROM pg_stat_activity
			WHERE datname = current_database() AND application_name = 'relay-a'
			  AND wait_event_type = 'Lock' AND query LIKE '%WorkflowRunFinish%'`).Scan(&backend) == nil
	}, 60*time.Second, 20*time.Millisecond, "A waits to record the send_message step")
	var holdsDoorbell bool
	require.NoError(t, pool.QueryRow(ctx, `
		SELECT EXISTS (SELECT FROM pg_locks WHERE pid = $1 AND granted
		               AND relation = 'events'::regclass AND mode = 'RowExclusiveLock')`, backend).Scan(&holdsDoorbell))
	require.True(t, holdsDoorbell, "the doorbell is stored in the step's transaction, not committed before it")

	a.kill()
	require.NoError(t, rowGateTx.Rollback(ctx))
	b := startRelayProcess(t, bin, "relay-b", env("relay-b"))

	type traceEntry struct {
		StepID string `json:"step_id"`
		Status string `json:"status"`
	}
	type runRow struct {
		status    string
		errorCode *string
		attempts  int
		trace     []traceEntry
	}
	var final runRow
	require.Eventually(t, func() bool {
		err := pool.QueryRow(ctx, `SELECT status, error_code, attempts, execution_trace FROM workflow_runs WHERE id = $1`, run).
			Scan(&final.status, &final.errorCode, &final.attempts, &final.trace)
		return err == nil && final.status != "running" && final.status != "pending"
	}, 60*time.Second, 20*time.Millisecond, "B resumes the run after A's lease")
	require.Equal(t, "completed", final.status, "error_code %v", final.errorCode)
	require.Nil(t, final.errorCode)
	require.Equal(t, 2, final.attempts, "claimed by A, then by B after A's lease")
	require.Equal(t, []traceEntry{{"hook", "started"}, {"hook", "completed"}, {"say", "completed"}}, final.trace,
		"the webhook started once, its outcome recorded before the kill, the doorbell step once")
	require.EqualValues(t, 1, calls.Load(), "the webhook is called once")

	var doorbells []*nostr.Event
	for _, ev := range b.client(t, owner.Key).Req("bells", map[string]any{"kinds": []int{9}, "#h": []string{channel}}) {
		if ev.Tags.Values("workflow-run") != nil && ev.Tags.Values("workflow-run")[0] == run.String() {
			doorbells = append(doorbells, ev)
		}
	}
	require.Len(t, doorbells, 1, "the doorbell exists once")
	require.Equal(t, "deployed: 200 pong", doorbells[0].Content, "B used the outcome A recorded")
}

// Three relay processes tick the same every-second schedule on one
// database; one of them is SIGKILLed half way. Each slot between the
// first and the last fired has exactly one run: none twice, none lost.
//
// Mutation killed: a scheduler that remembers fired slots in its own
// process instead of claiming them in scheduled_workflow_fires fires a slot
// once per process.
func TestScheduleSlotFiresOnceAcrossRelayProcesses(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	bin := buildRelay(t)
	databaseURL := dbtest.URL(t)
	pool, err := pgxpool.New(ctx, databaseURL)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	env := func(name string) map[string]string {
		return map[string]string{
			"BUZZ_DATABASE_URL":                   withAppName(t, databaseURL, name),
			"BUZZ_WORKFLOW_POLL":                  "100ms",
			"BUZZ_WORKFLOW_SCHEDULE_CATCH_UP":     "10s",
			"BUZZ_WORKFLOW_MIN_SCHEDULE_INTERVAL": "1s", // a per-second cron
		}
	}
	var relays []*relayProcess
	for _, name := range []string{"relay-1", "relay-2", "relay-3"} {
		relays = append(relays, startRelayProcess(t, bin, name, env(name)))
	}
	owner := relays[0].client(t, nil)
	channel := newChannel(t, owner, "ticks")
	wf := saveWorkflow(t, owner, channel, "name: Tick\ntrigger: {on: schedule, cron: '* * * * * *'}\n"+
		"steps: [{id: tick, action: send_message, text: tick}]\n")

	fired := func() int {
		var n int
		require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM scheduled_workflow_fires WHERE workflow_id = $1`, wf).Scan(&n))
		return n
	}
	waitFired := func(n int) {
		require.Eventually(t, func() bool { return fired() >= n }, 60*time.Second, 50*time.Millisecond, "%d slots fired", n)
	}
	waitFired(4)
	relays[0].kill()
	waitFired(fired() + 4)
	relays[1].stop(t)
	relays[2].stop(t)

	rows, err := pool.Query(ctx, `
		SELECT (trigger_context->'cause'->>'ref')::bigint AS slot, count(*)
		FROM workflow_runs WHERE workflow_id = $1 GROUP BY 1 ORDER BY 1`, wf)
	require.NoError(t, err)
	runsPerSlot := map[int64]int{}
	var first, last int64
	for rows.Next() {
		var slot int64
		var n int
		require.NoError(t, rows.Scan(&slot, &n))
		runsPerSlot[slot] = n
		if first == 0 {
			first = slot
		}
		last = slot
	}
	require.NoError(t, rows.Err())
	require.GreaterOrEqual(t, last-first, int64(7), "at least 8 slots fired")
	for slot := first; slot <= last; slot++ {
		require.Equal(t, 1, runsPerSlot[slot], "runs of slot %d (first %d, last %d): %v", slot, first, last, runsPerSlot)
	}
	var unlinked, claims int
	require.NoError(t, pool.QueryRow(ctx, `
		SELECT count(*) FILTER (WHERE f.workflow_run_id IS NULL OR r.id IS NULL), count(*)
		FROM scheduled_workflow_fires f
		LEFT JOIN workflow_runs r ON r.community_id = f.community_id AND r.id = f.workflow_run_id
		WHERE f.workflow_id = $1`, wf).Scan(&unlinked, &claims))
	require.Zero(t, unlinked, "every claimed slot links its run")
	require.Equal(t, len(runsPerSlot), claims, "one claim per slot with a run")
}

// writeCertFile stores srv's certificate where a relay process trusts it
// through SSL_CERT_FILE, which Go reads on Linux.
func writeCertFile(t *testing.T, srv *httptest.Server) string {
	t.Helper()
	file := filepath.Join(t.TempDir(), "webhook-ca.pem")
	require.NoError(t, os.WriteFile(file, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw}), 0o600))
	return file
}

// The call_webhook client's settings, read from the environment of a real
// relay process: a trusted network is reached and no other private
// address; a longer response than BUZZ_WORKFLOW_WEBHOOK_RESPONSE_BYTES and
// a server slower than BUZZ_WORKFLOW_WEBHOOK_TIMEOUT fail the step with
// webhook_failed. Mutations killed: leaving any of the three out of the
// client the relay builds (the defaults refuse loopback, keep 1 MiB and
// wait 10 s).
func TestWebhookClientSettingsReachTheRelayProcess(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	bin := buildRelay(t)
	databaseURL := dbtest.URL(t)
	pool, err := pgxpool.New(ctx, databaseURL)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	// The slow endpoint never answers while the test runs. It used to
	// answer once its request's context ended, meant as "when the client
	// gives up"; in one loaded fresh-clone run the relay got that answer,
	// a 200, before its own timeout, and the step completed.
	release := make(chan struct{})
	hook := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/slow":
			<-release
		case "/long":
			_, _ = io.WriteString(w, "12345")
		default:
			_, _ = io.WriteString(w, "1234")
		}
	}))
	t.Cleanup(hook.Close)
	t.Cleanup(func() { close(release) }) // first: Close waits for handlers
	relay := startRelayProcess(t, bin, "relay", map[string]string{
		"BUZZ_DATABASE_URL":                    databaseURL,
		"BUZZ_WORKFLOW_POLL":                   "100ms",
		"BUZZ_WORKFLOW_WEBHOOK_ALLOWED_NETS":   "127.0.0.1/32",
		"BUZZ_WORKFLOW_WEBHOOK_TIMEOUT":        "5s", // the default is 10s; less would fail "fits" on a loaded machine
		"BUZZ_WORKFLOW_WEBHOOK_RESPONSE_BYTES": "4",
		"SSL_CERT_FILE":                        writeCertFile(t, hook),
	})
	owner := relay.client(t, nil)
	channel := newChannel(t, owner, "hooks")
	untrusted := strings.Replace(hook.URL, "127.0.0.1", "127.0.0.2", 1)
	workflows := map[string]uuid.UUID{}
	for name, url := range map[string]string{
		"fits": hook.URL + "/fits", "long": hook.URL + "/long", "slow": hook.URL + "/slow", "untrusted": untrusted + "/fits",
	} {
		workflows[name] = saveWorkflow(t, owner, channel, "name: "+name+"\ntrigger: {on: message_posted}\n"+
			"steps: [{id: hook, action: call_webhook, url: '"+url+"'}]\n")
	}
	ok := owner.Publish(owner.Sign(9, "go", nostr.Tags{{"h", channel}}, 0))
	require.True(t, ok.OK, ok.Msg)

	type outcome struct{ status, code, detail string }
	ended := func(wf uuid.UUID) outcome {
		t.Helper()
		var o outcome
		require.Eventually(t, func() bool {
			err := pool.QueryRow(ctx, `SELECT status, coalesce(error_code, ''), coalesce(error_message, '') FROM workflow_runs WHERE workflow_id = $1`, wf).
				Scan(&o.status, &o.code, &o.detail)
			return err == nil && o.status != "pending" && o.status != "running"
		}, 60*time.Second, 20*time.Millisecond, "the run of workflow %s ends", wf)
		return o
	}
	require.Equal(t, outcome{status: "completed"}, ended(workflows["fits"]))
	for name, want := range map[string]string{
		"long":      "response body exceeds 4 bytes",
		"slow":      "no complete response within 5s",
		"untrusted": "127.0.0.2 is not a public address",
	} {
		o := ended(workflows[name])
		require.Equal(t, "failed", o.status, name)
		require.Equal(t, "webhook_failed", o.code, name)
		require.Contains(t, o.detail, want, name)
	}
}

// A step that takes its relay process down every time (here each process
// is SIGKILLed while the step waits on a lock the test holds) is not
// resumed for ever: after three processes died in it, the next process's
// claim ends the run with step_abandoned, and the step's doorbell, never
// committed, does not exist. Each process keeps renewing the lease while
// its step waits, so a run is taken from a process only once it is dead.
//
// Mutation killed: the engine ignoring workflow_runs.expired_leases has
// the fourth process run the step (it waits on the gate like the others,
// and the run never ends).
func TestRelayProcessesKilledInAStepAbandonTheRun(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	bin := buildRelay(t)
	databaseURL := dbtest.URL(t)
	pool := observerPool(t, databaseURL)
	env := func(name string) map[string]string {
		return map[string]string{
			"BUZZ_DATABASE_URL":       withAppName(t, databaseURL, name),
			"BUZZ_WORKFLOW_RUN_LEASE": "2s",
			"BUZZ_WORKFLOW_POLL":      "100ms",
		}
	}
	first := startRelayProcess(t, bin, "relay-1", env("relay-1"))
	owner := first.client(t, nil)
	channel := newChannel(t, owner, "poison")
	wf := saveWorkflow(t, owner, channel, "name: Poison\ntrigger: {on: message_posted}\nsteps:\n"+
		"  - {id: say, action: send_message, text: hello}\n")

	// The doorbell's mention row (it p-tags the owner) waits for this lock;
	// the trigger message, which tags nobody, does not.
	gateConn, err := pgx.Connect(ctx, withAppName(t, databaseURL, "test-gate"))
	require.NoError(t, err)
	t.Cleanup(func() { gateConn.Close(context.Background()) })
	gate, err := gateConn.Begin(ctx)
	require.NoError(t, err)
	_, err = gate.Exec(ctx, "LOCK TABLE event_mentions IN SHARE MODE")
	require.NoError(t, err)

	ok := owner.Publish(owner.Sign(9, "go", nostr.Tags{{"h", channel}}, 0))
	require.True(t, ok.OK, ok.Msg)
	var run uuid.UUID
	require.NoError(t, pool.QueryRow(ctx, `SELECT id FROM workflow_runs WHERE workflow_id = $1`, wf).Scan(&run))

	waitsInStep := func(name string) {
		t.Helper()
		require.Eventually(t, func() bool {
			var n int
			require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
				WHERE datname = current_database() AND application_name = $1 AND wait_event_type = 'Lock'`, name).Scan(&n))
			return n > 0
		}, 60*time.Second, 20*time.Millisecond, "%s runs the step and waits on the gate", name)
	}
	waitsInStep("relay-1")
	first.kill()
	for _, name := range []string{"relay-2", "relay-3"} {
		p := startRelayProcess(t, bin, name, env(name))
		waitsInStep(name)
		p.kill()
	}

	last := startRelayProcess(t, bin, "relay-4", env("relay-4"))
	var status, code string
	var expired, attempts int
	require.Eventually(t, func() bool {
		err := pool.QueryRow(ctx, `SELECT status, coalesce(error_code, ''), expired_leases, attempts FROM workflow_runs WHERE id = $1`, run).
			Scan(&status, &code, &expired, &attempts)
		require.NoError(t, err)
		return status == "failed"
	}, 60*time.Second, 20*time.Millisecond, "relay-4 ends the run")
	require.Equal(t, "step_abandoned", code)
	require.Equal(t, 3, expired, "three leases expired at the step")
	require.Equal(t, 4, attempts, "claimed by each process once")
	require.NoError(t, gate.Rollback(ctx))

	require.Never(t, func() bool {
		var n int
		require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM events WHERE kind = 9 AND content = 'hello'`).Scan(&n))
		return n > 0
	}, time.Second, 50*time.Millisecond, "no doorbell: every try of the step rolled back")
	last.stop(t)
}
