package main

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/buzzrelay/buzz/internal/db"
	"github.com/buzzrelay/buzz/internal/dbtest"
	"github.com/buzzrelay/buzz/internal/nostr"
	"github.com/buzzrelay/buzz/internal/pgcluster"
	"github.com/buzzrelay/buzz/internal/relaytest"
)

// sentEvent is one event a publisher sent to a relay that was then killed,
// and the answer it got, if any.
type sentEvent struct {
	ev       *nostr.Event
	answered bool
	ok       bool
	msg      string
}

// publishUntilDead sends events from c, one at a time, each after the
// previous one's OK, until the connection fails; it records every event
// sent and its answer.
func publishUntilDead(c *relaytest.Client, next func(i int) *nostr.Event) []*sentEvent {
	var sent []*sentEvent
	for i := 0; ; i++ {
		ev := next(i)
		s := &sentEvent{ev: ev}
		frame, _ := json.Marshal([]any{"EVENT", ev})
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		err := c.WS.Write(ctx, websocket.MessageText, frame)
		cancel()
		if err != nil {
			return sent
		}
		sent = append(sent, s)
		for {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			_, data, err := c.WS.Read(ctx)
			cancel()
			if err != nil {
				return sent
			}
			var parts []json.RawMessage
			if json.Unmarshal(data, &parts) != nil || len(parts) < 4 || string(parts[0]) != `"OK"` {
				continue
			}
			var id string
			_ = json.Unmarshal(parts[1], &id)
			if id != ev.ID {
				continue
			}
			s.answered = true
			_ = json.Unmarshal(parts[2], &s.ok)
			_ = json.Unmarshal(parts[3], &s.msg)
			break
		}
	}
}

// Relay processes are SIGKILLed while many publishers write through group
// commits (plain notes, and channel messages under savepoints). After
// each kill, on a fresh process: every event answered OK true is stored,
// and every event sent is answered OK true when sent again, as a
// duplicate exactly when it was stored, whether or not the dead process
// answered it.
func TestKilledRelayMidGroupCommitKeepsEveryAcknowledgedEvent(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	bin := buildRelay(t)
	databaseURL := dbtest.URL(t)
	pool := observerPool(t, databaseURL)
	env := func(name string) map[string]string {
		return map[string]string{
			"BUZZ_DATABASE_URL":        withAppName(t, databaseURL, name),
			"BUZZ_PUBLISH_BURST":       "100000",
			"BUZZ_PUBLISH_PER_MINUTE":  "100000",
			"BUZZ_MESSAGES_PER_SECOND": "100000",
		}
	}
	const publishers = 24
	keys := make([]*nostr.SecretKey, publishers)
	for i := range keys {
		keys[i] = relaytest.NewKey(t)
	}
	first := startRelayProcess(t, bin, "setup", env("setup"))
	owner := first.client(t, nil)
	channel := newChannel(t, owner, "crash")
	// Every publisher joins before the kills: a join still unanswered at the
	// first kill would have its later channel messages refused.
	for _, k := range keys {
		c := first.client(t, k)
		require.True(t, c.Publish(c.Sign(9021, "", nostr.Tags{{"h", channel}}, 0)).OK)
	}
	first.stop(t)

	var all []*sentEvent
	for round := range 6 {
		p := startRelayProcess(t, bin, fmt.Sprintf("round%d", round), env(fmt.Sprintf("round%d", round)))
		clients := make([]*relaytest.Client, publishers)
		for i := range clients {
			clients[i] = p.client(t, keys[i])
		}
		var mu sync.Mutex
		var wg sync.WaitGroup
		for i, c := range clients {
			wg.Go(func() {
				sent := publishUntilDead(c, func(n int) *nostr.Event {
					ev := &nostr.Event{CreatedAt: time.Now().Unix(), Tags: nostr.Tags{}}
					switch {
					case n%3 == 0:
						ev.Kind, ev.Content = 1, fmt.Sprintf("note %d/%d/%d", round, i, n)
					case n%3 == 1:
						ev.Kind, ev.Content, ev.Tags = 9, fmt.Sprintf("msg %d/%d/%d", round, i, n), nostr.Tags{{"h", channel}, {"p", owner.Key.PublicKeyHex()}}
					default:
						ev.Kind, ev.Content, ev.Tags = 1, fmt.Sprintf("mention %d/%d/%d", round, i, n), nostr.Tags{{"p", owner.Key.PublicKeyHex()}}
					}
					if err := ev.Sign(keys[i]); err != nil {
						panic(err)
					}
					return ev
				})
				mu.Lock()
				all = append(all, sent...)
				mu.Unlock()
			})
		}
		time.Sleep(time.Duration(300+round*97) * time.Millisecond)
		p.kill()
		wg.Wait()
	}

	// A killed process's backends may still be finishing a COMMIT they had
	// received (PostgreSQL notices the dead client only afterwards): read
	// what is stored once they are gone, or a late commit makes an event
	// "not stored" here and a duplicate when resent.
	require.Eventually(t, func() bool {
		var n int
		err := pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND application_name LIKE 'round%'`).Scan(&n)
		return err == nil && n == 0
	}, 30*time.Second, 20*time.Millisecond, "the killed processes' backends never ended")
	ids := make([][]byte, len(all))
	for i, s := range all {
		ids[i], _ = hex.DecodeString(s.ev.ID)
	}
	rows, err := pool.Query(ctx, "SELECT encode(id, 'hex') FROM events WHERE id = ANY($1)", ids)
	require.NoError(t, err)
	stored := map[string]bool{}
	for rows.Next() {
		var id string
		require.NoError(t, rows.Scan(&id))
		stored[id] = true
	}
	require.NoError(t, rows.Err())

	var acked, unanswered, storedUnanswered int
	for _, s := range all {
		if s.answered && s.ok {
			acked++
			require.True(t, stored[s.ev.ID], "event %s (kind %d) was answered OK %q but is not stored", s.ev.ID, s.ev.Kind, s.msg)
		}
		if s.answered && !s.ok {
			t.Errorf("event %s (kind %d) refused before the kill: %s", s.ev.ID, s.ev.Kind, s.msg)
		}
		if !s.answered {
			unanswered++
			if stored[s.ev.ID] {
				storedUnanswered++
			}
		}
	}
	t.Logf("%d events sent, %d acknowledged, %d unanswered (%d of them stored)", len(all), acked, unanswered, storedUnanswered)

	last := startRelayProcess(t, bin, "last", env("last"))
	clients := map[string]*relaytest.Client{}
	for _, k := range keys {
		clients[k.PublicKeyHex()] = last.client(t, k)
	}
	for _, s := range all {
		r := clients[s.ev.PubKey].Publish(s.ev)
		require.True(t, r.OK, "event %s (kind %d, stored %v, answered %v) resent: %s", s.ev.ID, s.ev.Kind, stored[s.ev.ID], s.answered, r.Msg)
		require.Equal(t, stored[s.ev.ID], strings.HasPrefix(r.Msg, "duplicate:"), "event %s (kind %d, stored %v) resent: %q", s.ev.ID, s.ev.Kind, stored[s.ev.ID], r.Msg)
	}
}

// A running relay process outlives a PostgreSQL restart: a publish while
// the database is down is answered (not left hanging), and once it is back
// the same connection publishes again, a live subscriber receives it, new
// connections are served, the workflow worker runs runs again, and the
// community-closing listener is listening again (an archive after the restart closes the sockets at once, though
// the sweep is an hour away).
func TestRelayProcessRecoversAfterPostgresRestart(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	bin := buildRelay(t)
	cluster, err := pgcluster.StartTemp(ctx, nil)
	require.NoError(t, err)
	t.Cleanup(func() { _ = cluster.Close() })
	admin, err := pgx.Connect(ctx, cluster.URL("postgres"))
	require.NoError(t, err)
	_, err = admin.Exec(ctx, "CREATE DATABASE buzz")
	require.NoError(t, err)
	admin.Close(ctx)
	databaseURL := cluster.URL("buzz")
	migrateCmd := exec.Command(bin, "migrate")
	migrateCmd.Env = []string{"PATH=" + os.Getenv("PATH"), "BUZZ_DATABASE_URL=" + databaseURL}
	out, err := migrateCmd.CombinedOutput()
	require.NoError(t, err, "migrate: %s", out)

	p := startRelayProcess(t, bin, "survivor", map[string]string{
		"BUZZ_DATABASE_URL":           withAppName(t, databaseURL, "survivor"),
		"BUZZ_CLOSED_COMMUNITY_SWEEP": "1h",
	})
	pub, sub := p.client(t, nil), p.client(t, nil)
	sub.Send("REQ", "live", map[string]any{"authors": []string{pub.Key.PublicKeyHex()}, "limit": 0})
	sub.Expect("EOSE")
	before := pub.Sign(1, "before the restart", nil, 0)
	require.True(t, pub.Publish(before).OK)
	require.Equal(t, before.ID, sub.Expect("EVENT").Event.ID)
	channel := newChannel(t, pub, "echo")
	saveWorkflow(t, pub, channel, "name: Echo\ntrigger: {on: message_posted}\nsteps:\n"+
		"  - {id: say, action: send_message, text: 'echo {{trigger.text}}'}\n")

	require.NoError(t, cluster.Stop())
	down := pub.Sign(1, "while the database is down", nil, 0)
	pub.Send("EVENT", down)
	r := pub.Expect("OK")
	require.False(t, r.OK, "a publish while the database is down: %s", r.Msg)
	t.Logf("answer while down: %s", r.Msg)

	restarted, err := pgcluster.Start(ctx, pgcluster.Options{DataDir: cluster.DataDir(), Port: cluster.Port()})
	require.NoError(t, err)
	require.False(t, restarted.Adopted())

	var after *nostr.Event
	require.Eventually(t, func() bool {
		after = pub.Sign(1, "after the restart", nil, 0)
		r := pub.Publish(after)
		if !r.OK {
			t.Logf("publish after restart: %s", r.Msg)
		}
		return r.OK
	}, 30*time.Second, 200*time.Millisecond, "the relay never wrote again after PostgreSQL came back")
	require.Equal(t, after.ID, sub.Expect("EVENT").Event.ID)
	fresh := p.client(t, nil)
	require.True(t, fresh.Publish(fresh.Sign(1, "new connection", nil, 0)).OK)

	pool, err := pgxpool.New(ctx, databaseURL)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	// The workflow worker runs again: a message after the restart is echoed.
	require.True(t, pub.Publish(pub.Sign(9, "after", nostr.Tags{{"h", channel}}, 0)).OK)
	require.Eventually(t, func() bool {
		var n int
		err := pool.QueryRow(ctx, `SELECT count(*) FROM events WHERE kind = 9 AND content = 'echo after'`).Scan(&n)
		return err == nil && n == 1
	}, 30*time.Second, 100*time.Millisecond, "the workflow worker never ran a run after the restart")
	require.Eventually(t, func() bool {
		var n int
		err := pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE application_name = 'survivor' AND query ILIKE 'LISTEN%'`).Scan(&n)
		return err == nil && n == 1
	}, 30*time.Second, 100*time.Millisecond, "the closing listener never listened again")
	_, err = db.New(pool).CommunityArchive(ctx, db.CommunityArchiveParams{Host: processHost})
	require.NoError(t, err)
	for _, c := range []*relaytest.Client{pub, sub, fresh} {
		_, err := c.TryNext(relaytest.Patience)
		require.Error(t, err)
		require.Equal(t, websocket.StatusPolicyViolation, websocket.CloseStatus(err), "%v", err)
	}
}

// Two relay processes deliver one listener's mentions. Process A claims a
// mention as it stores it and is SIGKILLed while its POST is in flight
// (the listener never answers it); B, which routes the same listener,
// delivers the row once A's lease has expired, and the row is then gone:
// the listener answered exactly one delivery.
func TestKilledRelayProcessMentionIsDeliveredByAnotherAfterTheLease(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	bin := buildRelay(t)
	databaseURL := dbtest.URL(t)
	pool := observerPool(t, databaseURL)

	var posts atomic.Int32
	firstArrived, release := make(chan struct{}), make(chan struct{})
	answered := make(chan string, 4)
	listener := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost {
			return
		}
		body, _ := io.ReadAll(r.Body)
		if posts.Add(1) == 1 {
			close(firstArrived)
			<-release // A dies with this request open
			return
		}
		answered <- string(body)
	}))
	t.Cleanup(listener.Close)
	t.Cleanup(func() { close(release) })
	listenerKey := relaytest.NewKey(t)
	env := func(name string) map[string]string {
		e := listenerEnv(t, databaseURL, name, listenerKey, listener)
		e["BUZZ_OPERATOR_LISTENER_POLL_MS"] = "500"
		return e
	}
	a := startRelayProcess(t, bin, "a", env("a"))
	b := startRelayProcess(t, bin, "b", env("b"))
	target := registerTarget(t, pool, listenerKey)

	author := a.client(t, nil)
	channel := newChannel(t, author, "paged")
	msg := author.Sign(9, "wake up", nostr.Tags{{"h", channel}, {"p", target.PublicKeyHex()}}, 0)
	require.True(t, author.Publish(msg).OK)
	select {
	case <-firstArrived:
	case <-time.After(time.Minute):
		t.Fatal("A never posted the mention")
	}
	a.kill()
	killed := time.Now()

	select {
	case body := <-answered:
		require.Contains(t, body, msg.ID)
		t.Logf("B delivered %s after A was killed", time.Since(killed).Round(time.Second))
	case <-time.After(60 * time.Second):
		t.Fatal("the mention A held was never delivered by B")
	}
	require.Eventually(t, func() bool {
		var n int
		return pool.QueryRow(ctx, "SELECT count(*) FROM operator_listener_outbox").Scan(&n) == nil && n == 0
	}, time.Minute, 50*time.Millisecond, "the delivered row is removed")
	select {
	case body := <-answered:
		t.Fatalf("a second delivery: %s", body)
	case <-time.After(2 * time.Second):
	}
	require.EqualValues(t, 2, posts.Load(), "one POST cut off by the kill, one answered")
	_ = b
}

func mustHex(t *testing.T, s string) []byte {
	t.Helper()
	b, err := hex.DecodeString(s)
	require.NoError(t, err)
	return b
}

// SIGTERM while a mention's POST is in flight: the process waits for the
// listener's answer and records the delivery before it exits, so the row
// is gone and nobody posts it again after the lease. Before, serve
// returned once the WebSockets had closed and the process exited with the
// delivery unrecorded, its row leased for 30 s and then delivered again.
// Mutation killed: serve not waiting for the workers (WaitForWorkers).
func TestStoppedRelayProcessRecordsTheDeliveryInFlight(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	bin := buildRelay(t)
	databaseURL := dbtest.URL(t)
	pool := observerPool(t, databaseURL)

	var posts atomic.Int32
	arrived := make(chan struct{}, 1)
	listener := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost {
			return
		}
		posts.Add(1)
		select {
		case arrived <- struct{}{}:
		default:
		}
		time.Sleep(time.Second) // answered after the relay was told to stop
	}))
	t.Cleanup(listener.Close)
	listenerKey := relaytest.NewKey(t)
	p := startRelayProcess(t, bin, "stopping", listenerEnv(t, databaseURL, "stopping", listenerKey, listener))
	target := registerTarget(t, pool, listenerKey)
	author := p.client(t, nil)
	channel := newChannel(t, author, "paged")
	require.True(t, author.Publish(author.Sign(9, "wake up", nostr.Tags{{"h", channel}, {"p", target.PublicKeyHex()}}, 0)).OK)
	select {
	case <-arrived:
	case <-time.After(time.Minute):
		t.Fatal("the relay never posted the mention")
	}
	author.WS.CloseNow() // nothing else holds the shutdown up
	stopping := time.Now()
	p.stop(t)
	t.Logf("stopped in %s", time.Since(stopping).Round(time.Millisecond))

	var left int
	require.NoError(t, pool.QueryRow(ctx, "SELECT count(*) FROM operator_listener_outbox").Scan(&left))
	require.Zero(t, left, "the delivery answered during shutdown was not recorded:\n%s", p.logs.String())
	require.EqualValues(t, 1, posts.Load())
}

// SIGTERM while a workflow's webhook call is in flight: the process waits
// for the answer and records the step, so the run is completed rather than
// resumed after the lease with the call's outcome unknown.
// Mutation killed: the workflow worker started outside the workers serve
// waits for.
func TestStoppedRelayProcessFinishesTheWorkflowStepInFlight(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	bin := buildRelay(t)
	databaseURL := dbtest.URL(t)
	pool := observerPool(t, databaseURL)

	arrived := make(chan struct{}, 1)
	hook := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case arrived <- struct{}{}:
		default:
		}
		time.Sleep(time.Second) // answered after the relay was told to stop
		_, _ = io.WriteString(w, "pong")
	}))
	t.Cleanup(hook.Close)
	p := startRelayProcess(t, bin, "stopping", map[string]string{
		"BUZZ_DATABASE_URL":                  withAppName(t, databaseURL, "stopping"),
		"BUZZ_WORKFLOW_WEBHOOK_ALLOWED_NETS": "127.0.0.1/32",
		"SSL_CERT_FILE":                      writeCertFile(t, hook),
	})
	owner := p.client(t, nil)
	channel := newChannel(t, owner, "deploys")
	wf := saveWorkflow(t, owner, channel, "name: Deploy\ntrigger: {on: message_posted}\nsteps:\n"+
		"  - {id: hook, action: call_webhook, url: '"+hook.URL+"/deploy', body: 'x'}\n")
	require.True(t, owner.Publish(owner.Sign(9, "ship it", nostr.Tags{{"h", channel}}, 0)).OK)
	select {
	case <-arrived:
	case <-time.After(time.Minute):
		t.Fatal("the relay never called the webhook")
	}
	owner.WS.CloseNow() // nothing else holds the shutdown up
	p.stop(t)

	var status string
	require.NoError(t, pool.QueryRow(ctx, `SELECT status FROM workflow_runs WHERE workflow_id = $1`, wf).Scan(&status))
	require.Equal(t, "completed", status, "the step in flight at SIGTERM was not recorded:\n%s", p.logs.String())
}

// listenerEnv is a relay process's environment on databaseURL that
// delivers mentions to listener, a test HTTPS server, as key.
func listenerEnv(t *testing.T, databaseURL, name string, key *nostr.SecretKey, listener *httptest.Server) map[string]string {
	return map[string]string{
		"BUZZ_DATABASE_URL":                   withAppName(t, databaseURL, name),
		"BUZZ_OPERATOR_LISTENERS":             key.PublicKeyHex() + ":" + listener.URL + "/wake",
		"BUZZ_OPERATOR_LISTENER_KEEPALIVE_MS": "0",
		"SSL_CERT_FILE":                       writeCertFile(t, listener),
	}
}

// registerTarget registers a new key as a target of the listener signing
// as listenerKey, and returns it.
func registerTarget(t *testing.T, pool *pgxpool.Pool, listenerKey *nostr.SecretKey) *nostr.SecretKey {
	t.Helper()
	target := relaytest.NewKey(t)
	_, err := db.New(pool).ListenerRegistrationsUpsert(context.Background(), db.ListenerRegistrationsUpsertParams{
		Listener: mustHex(t, listenerKey.PublicKeyHex()), Targets: [][]byte{mustHex(t, target.PublicKeyHex())},
	})
	require.NoError(t, err)
	return target
}

// stopBackends SIGSTOPs every PostgreSQL backend of application app (a
// stalled server: its sockets stay open and nothing answers) and resumes
// them when the test ends.
func stopBackends(t *testing.T, pool *pgxpool.Pool, app string) {
	t.Helper()
	rows, err := pool.Query(context.Background(), `SELECT pid FROM pg_stat_activity WHERE application_name = $1`, app)
	require.NoError(t, err)
	pids, err := pgx.CollectRows(rows, pgx.RowTo[int32])
	require.NoError(t, err)
	require.NotEmpty(t, pids)
	t.Cleanup(func() {
		for _, pid := range pids {
			_ = syscall.Kill(int(pid), syscall.SIGCONT)
		}
	})
	for _, pid := range pids {
		require.NoError(t, syscall.Kill(int(pid), syscall.SIGSTOP))
	}
}

// SIGTERM while PostgreSQL is stalled under a publish: the process still
// exits. The publish's statement never returns (a stopped backend's socket
// stays open, so not even TCP gives up), and closing the pool waited for
// that connection forever after the shutdown budget had run out.
// Mutation killed: serve closing the pool with a plain deferred
// pool.Close() again.
func TestStoppedRelayProcessExitsWhileTheDatabaseStalls(t *testing.T) {
	t.Parallel()
	bin := buildRelay(t)
	databaseURL := dbtest.URL(t)
	pool := observerPool(t, databaseURL)
	p := startRelayProcess(t, bin, "stalled", map[string]string{
		"BUZZ_DATABASE_URL": withAppName(t, databaseURL, "stalled"),
	})
	pub := p.client(t, nil)
	require.True(t, pub.Publish(pub.Sign(1, "before the stall", nil, 0)).OK)

	stopBackends(t, pool, "stalled")
	pub.Send("EVENT", pub.Sign(1, "during the stall", nil, 0))
	_, err := pub.TryNext(2 * time.Second)
	require.Error(t, err, "the publish was answered although every backend of the relay is stopped")

	p.stop(t)
	_, warned := p.logs.find("database connections still in use at exit; leaving them to the server", "msg")
	require.True(t, warned, "%s", p.logs.String())
}

// A publish while PostgreSQL is stalled is answered: the group writer's
// transaction is bounded (BUZZ_INGEST_WRITE_TIMEOUT), so the event runs
// alone, under the same bound, and gets an answer; once a fresh connection
// is made (the postmaster still answers), publishing works again without a
// restart. Before, the group writer waited on the stopped backend forever:
// the publish was never answered, and every later event of a lightly loaded
// relay queued behind it (a second writer starts only for a whole group).
// Mutation killed: the group's transaction under context.Background()
// again (no answer to the publish).
func TestRelayProcessAnswersPublishesWhileTheDatabaseStalls(t *testing.T) {
	t.Parallel()
	bin := buildRelay(t)
	databaseURL := dbtest.URL(t)
	pool := observerPool(t, databaseURL)
	p := startRelayProcess(t, bin, "stalling", map[string]string{
		"BUZZ_DATABASE_URL":         withAppName(t, databaseURL, "stalling"),
		"BUZZ_INGEST_WRITE_TIMEOUT": "1s",
	})
	pub := p.client(t, nil)
	require.True(t, pub.Publish(pub.Sign(1, "before the stall", nil, 0)).OK)

	stopBackends(t, pool, "stalling")
	during := pub.Sign(1, "during the stall", nil, 0)
	pub.Send("EVENT", during)
	var answer []json.RawMessage
	for {
		msg, err := pub.TryNext(20 * time.Second)
		require.NoError(t, err, "a publish while PostgreSQL is stalled was never answered")
		if string(msg[0]) == `"OK"` && len(msg) == 4 {
			answer = msg
			break
		}
	}
	var id, text string
	var ok bool
	require.NoError(t, json.Unmarshal(answer[1], &id))
	require.NoError(t, json.Unmarshal(answer[2], &ok))
	require.NoError(t, json.Unmarshal(answer[3], &text))
	require.Equal(t, during.ID, id)
	t.Logf("answer while stalled: %v %q", ok, text)
	if !ok {
		require.True(t, strings.HasPrefix(text, "error:"), "%q", text)
	}

	require.Eventually(t, func() bool {
		return pub.Publish(pub.Sign(1, "after the stall", nil, 0)).OK
	}, 60*time.Second, 100*time.Millisecond, "the relay never wrote again on a fresh connection")
}

// The workflow worker outlives a stalled PostgreSQL: its poll's claim is
// bounded by the run lease, so a claim stuck on a stopped backend gives
// up and the worker claims and runs new runs on a fresh connection. Before,
// the worker's loop waited for that claim forever and this process ran no
// run again until it was restarted (hand-offs included: the loop no longer
// read them).
// Mutation killed: claimContext returning ctx without the lease's deadline
// (the message is stored, its echo never is).
func TestRelayProcessWorkflowWorkerOutlivesAStalledDatabase(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	bin := buildRelay(t)
	databaseURL := dbtest.URL(t)
	pool := observerPool(t, databaseURL)
	p := startRelayProcess(t, bin, "stalled-worker", map[string]string{
		"BUZZ_DATABASE_URL":         withAppName(t, databaseURL, "stalled-worker"),
		"BUZZ_INGEST_WRITE_TIMEOUT": "1s",
		"BUZZ_WORKFLOW_RUN_LEASE":   "3s",
	})
	pub := p.client(t, nil)
	channel := newChannel(t, pub, "echo")
	saveWorkflow(t, pub, channel, "name: Echo\ntrigger: {on: message_posted}\nsteps:\n"+
		"  - {id: say, action: send_message, text: 'echo {{trigger.text}}'}\n")
	time.Sleep(2 * time.Second) // the pool's connections go idle; the worker polls every second

	stopBackends(t, pool, "stalled-worker")
	time.Sleep(2 * time.Second) // the worker's poll is waiting on a stopped backend
	require.Eventually(t, func() bool {
		return pub.Publish(pub.Sign(9, "after the stall", nostr.Tags{{"h", channel}}, 0)).OK
	}, 60*time.Second, 100*time.Millisecond, "the relay never wrote again on a fresh connection")
	require.Eventually(t, func() bool {
		var n int
		err := pool.QueryRow(ctx, `SELECT count(*) FROM events WHERE kind = 9 AND content = 'echo after the stall'`).Scan(&n)
		return err == nil && n >= 1
	}, 60*time.Second, 200*time.Millisecond, "the workflow worker never ran a run after the stall")
}

// The operator-listener worker outlives a stalled PostgreSQL: its poll's
// claim is bounded by the 30 s lease, so a claim stuck on a stopped backend
// gives up, and a mention saved afterwards on a fresh connection is
// delivered. Before, the worker's loop waited for that claim forever and
// the pod delivered nothing again, hand-offs included, until restarted.
// Mutation killed: claimDue without the lease's deadline (no POST).
func TestRelayProcessListenerWorkerOutlivesAStalledDatabase(t *testing.T) {
	t.Parallel()
	bin := buildRelay(t)
	databaseURL := dbtest.URL(t)
	pool := observerPool(t, databaseURL)
	var posts atomic.Int32
	listener := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPost {
			posts.Add(1)
		}
	}))
	t.Cleanup(listener.Close)
	listenerKey := relaytest.NewKey(t)
	env := listenerEnv(t, databaseURL, "stalled-listener", listenerKey, listener)
	env["BUZZ_INGEST_WRITE_TIMEOUT"] = "1s"
	env["BUZZ_OPERATOR_LISTENER_POLL_MS"] = "200"
	p := startRelayProcess(t, bin, "stalled-listener", env)
	target := registerTarget(t, pool, listenerKey)
	author := p.client(t, nil)
	channel := newChannel(t, author, "paged")
	time.Sleep(2 * time.Second) // the pool's connections go idle; the worker polls every 200 ms

	stopBackends(t, pool, "stalled-listener")
	time.Sleep(time.Second) // the worker's poll is waiting on a stopped backend
	require.Eventually(t, func() bool {
		return author.Publish(author.Sign(9, "wake up", nostr.Tags{{"h", channel}, {"p", target.PublicKeyHex()}}, 0)).OK
	}, 60*time.Second, 100*time.Millisecond, "the relay never wrote again on a fresh connection")
	require.Eventually(t, func() bool { return posts.Load() > 0 },
		120*time.Second, 100*time.Millisecond, "the listener worker never delivered after the stall")
}
