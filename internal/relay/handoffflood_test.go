package relay_test

import (
	"context"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/buzzrelay/buzz/internal/dbtest"
	"github.com/buzzrelay/buzz/internal/nostr"
	"github.com/buzzrelay/buzz/internal/outbox"
	"github.com/buzzrelay/buzz/internal/relaytest"
)

// statementCount counts the statements the relay sends, by sqlc name.
type statementCount struct {
	mu sync.Mutex
	n  map[string]int
}

func (c *statementCount) TraceQueryStart(ctx context.Context, _ *pgx.Conn, data pgx.TraceQueryStartData) context.Context {
	if _, rest, ok := strings.Cut(data.SQL, "-- name: "); ok {
		name, _, _ := strings.Cut(rest, " ")
		c.mu.Lock()
		c.n[name]++
		c.mu.Unlock()
	}
	return ctx
}

func (*statementCount) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

func (c *statementCount) get(name string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n[name]
}

// A flood of mentions from many publishers at once, so their events share
// commit groups, each event mentioning three registered targets, to a
// listener that takes a few milliseconds per POST. The rows the events of a
// group claim at insert never add up to more than the hand-off has room for:
// no claimed row is dropped at the hand-off and released again (an UPDATE
// each), no transaction claims more than the hand-off holds, and every row
// is delivered exactly once.
//
// Mutation killed: Enqueue sizing its claim by the hand-off's free room
// alone (every event of a group sees the room none of their commits has
// taken yet; reserveRoom without subtracting w.reserved): rows are dropped
// at the hand-off, and a group's transaction claims more than ten.
func TestFloodOfMentionsClaimsNoMoreThanTheHandOffTakes(t *testing.T) {
	t.Parallel()
	statements := &statementCount{n: map[string]int{}}
	pool := dbtest.PoolOn(t, dbtest.URL(t), 0, func(c *pgxpool.Config) { c.ConnConfig.Tracer = statements })
	r := relaytest.StartOn(t, pool)
	ctx := context.Background()

	// Every row claimed at insert, by the transaction that claimed it (a
	// rolled-back transaction's rows vanish with it).
	_, err := pool.Exec(ctx, `
		CREATE TABLE test_claimed_at_insert (xid xid8 NOT NULL, id uuid NOT NULL);
		CREATE FUNCTION test_record_claim_at_insert() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN
			INSERT INTO test_claimed_at_insert VALUES (pg_current_xact_id(), NEW.id);
			RETURN NULL;
		END $$;
		CREATE TRIGGER test_record_claim_at_insert AFTER INSERT ON operator_listener_outbox
			FOR EACH ROW WHEN (NEW.state = 'sending') EXECUTE FUNCTION test_record_claim_at_insert();`)
	require.NoError(t, err)

	type delivery struct{ event, target string }
	var mu sync.Mutex
	delivered := map[delivery]int{}
	listener := httpsListener(t, func(got map[string]any) {
		time.Sleep(3 * time.Millisecond) // a listener busy enough to fill the slots
		mu.Lock()
		delivered[delivery{fmt.Sprint(got["event_id"]), fmt.Sprint(got["pubkey"])}]++
		mu.Unlock()
	})
	listenerKey := relaytest.NewKey(t)
	cfg := outbox.Config{
		Listeners: outbox.Routes{listenerKey.PublicKeyHex(): listener.url},
		Timeout:   5 * time.Second,
		APIOrigin: r.HTTPURL,
		IdlePoll:  200 * time.Millisecond, // the rows left to the poll go soon
	}
	wctx, cancel := context.WithCancel(ctx)
	t.Cleanup(cancel)
	require.NoError(t, r.Server.StartOperatorListeners(wctx, cfg, r.CommunityID, outbox.WithRootCAs(listener.roots)))

	var targets []string
	for range 3 {
		targets = append(targets, relaytest.NewKey(t).PublicKeyHex())
	}
	body := []byte(`{"pubkeys":["` + strings.Join(targets, `","`) + `"]}`)
	reply := operatorRequest(t, r, http.MethodPost, "", body,
		nip98(t, listenerKey, "POST", r.HTTPURL+outbox.RegistrationPath, body, nil))
	require.Equal(t, http.StatusOK, reply.Status, reply.Raw)

	owner := r.Dial(t, "")
	owner.Auth(nil)
	ch := createChannel(t, owner, "agents", false)
	mentionTags := nostr.Tags{{"h", ch}}
	for _, target := range targets {
		mentionTags = append(mentionTags, nostr.Tag{"p", target})
	}

	const publishers, perPublisher = 12, 24
	clients := make([]*relaytest.Client, publishers)
	for i := range clients {
		clients[i] = r.Dial(t, "")
		clients[i].Auth(nil)
	}
	var wg sync.WaitGroup
	start := time.Now()
	for i, c := range clients {
		events := make([]*nostr.Event, perPublisher)
		for n := range events {
			events[n] = c.Sign(9, fmt.Sprintf("mention %d/%d", i, n), mentionTags, 0)
		}
		wg.Go(func() {
			// All sent, then the answers read: the events of all the
			// publishers wait for writers together and share groups.
			for _, ev := range events {
				c.Send("EVENT", ev)
			}
			for range events {
				if reply := c.NextReply(); !reply.OK {
					t.Errorf("refused: %s", reply.Msg)
				}
			}
		})
	}
	wg.Wait()
	waitForEmptyOutbox(t, r, time.Minute, "every row is delivered")
	drained := time.Since(start)

	var claimedAtInsert, transactions, mostInOneTransaction int
	require.NoError(t, pool.QueryRow(ctx, `
		SELECT coalesce(sum(n), 0), count(*), coalesce(max(n), 0)
		FROM (SELECT count(*) AS n FROM test_claimed_at_insert GROUP BY xid) per_transaction`).
		Scan(&claimedAtInsert, &transactions, &mostInOneTransaction))
	dropped := counterValue(t, r, "buzz_operator_listener_handoff_dropped_total")
	rows := publishers * perPublisher * len(targets)
	t.Logf("%d rows: %d claimed at insert by %d transactions (at most %d by one), %.0f dropped at the hand-off, "+
		"%d releases, %d polls; drained in %s",
		rows, claimedAtInsert, transactions, mostInOneTransaction, dropped,
		statements.get("OutboxRelease"), statements.get("OutboxClaimDue"), drained.Round(time.Millisecond))

	mu.Lock()
	require.Len(t, delivered, rows, "every (event, target) is delivered")
	for d, n := range delivered {
		require.Equal(t, 1, n, "delivered %d times: %v", n, d)
	}
	mu.Unlock()
	require.Zero(t, dropped, "a claimed row did not fit in the hand-off")
	require.LessOrEqual(t, mostInOneTransaction, 10, "a transaction claimed more than the hand-off holds")
	require.Positive(t, claimedAtInsert, "rows were handed off at all")
}

// testHTTPSListener is an operator listener's endpoint that passes every
// delivery's body to handle, which may take its time (deliveries run
// concurrently), and answers 200.
type testHTTPSListener struct {
	url   string
	roots *x509.CertPool
}

func httpsListener(t *testing.T, handle func(got map[string]any)) testHTTPSListener {
	t.Helper()
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		if req.Method != http.MethodPost {
			return // the keep-alive HEAD
		}
		raw, _ := io.ReadAll(req.Body)
		var got map[string]any
		if err := json.Unmarshal(raw, &got); err != nil {
			t.Errorf("delivery body: %v", err)
		}
		handle(got)
	}))
	t.Cleanup(srv.Close)
	roots := x509.NewCertPool()
	roots.AddCert(srv.Certificate())
	return testHTTPSListener{url: srv.URL + "/wake", roots: roots}
}

// counterValue is the value of the relay's counter name (0 if unregistered).
func counterValue(t *testing.T, r *relaytest.Relay, name string) float64 {
	t.Helper()
	families, err := r.Server.Metrics().Registry.Gather()
	require.NoError(t, err)
	for _, f := range families {
		if f.GetName() == name {
			var sum float64
			for _, m := range f.GetMetric() {
				sum += m.GetCounter().GetValue()
			}
			return sum
		}
	}
	return 0
}

// An event whose mention the relay could not claim at insert (its worker's
// hand-off was full) wakes the worker's poll after its commit, through the
// relay's write path: the row is posted once the listener answers the
// deliveries ahead of it, not at the idle poll's timer (an hour here, so a
// missing wake-up fails the test rather than slowing it).
//
// Mutation killed: the relay registering its after-commit hand-off only
// for events that claimed a row (claimed.Len() == 0 instead of
// claimed.Empty()): the event that claimed nothing never wakes the poll.
func TestMentionTheHandOffHadNoRoomForWakesThePoll(t *testing.T) {
	t.Parallel()
	statements := &statementCount{n: map[string]int{}}
	pool := dbtest.PoolOn(t, dbtest.URL(t), 0, func(c *pgxpool.Config) { c.ConnConfig.Tracer = statements })
	r := relaytest.StartOn(t, pool)
	ctx := context.Background()

	gate, posted := make(chan struct{}), make(chan string, 100)
	listener := httpsListener(t, func(got map[string]any) {
		posted <- fmt.Sprint(got["event_id"])
		<-gate
	})
	var once sync.Once
	open := func() { once.Do(func() { close(gate) }) }
	t.Cleanup(open)
	listenerKey := relaytest.NewKey(t)
	cfg := outbox.Config{
		Listeners: outbox.Routes{listenerKey.PublicKeyHex(): listener.url},
		Timeout:   5 * time.Second,
		APIOrigin: r.HTTPURL,
		IdlePoll:  time.Hour,
	}
	wctx, cancel := context.WithCancel(ctx)
	t.Cleanup(cancel)
	require.NoError(t, r.Server.StartOperatorListeners(wctx, cfg, r.CommunityID, outbox.WithRootCAs(listener.roots)))
	require.Eventually(t, func() bool { return statements.get("OutboxClaimDue") > 0 }, time.Minute, 10*time.Millisecond,
		"the worker's first poll, which finds nothing and backs off")

	target := relaytest.NewKey(t).PublicKeyHex()
	body := []byte(`{"pubkeys":["` + target + `"]}`)
	reply := operatorRequest(t, r, http.MethodPost, "", body,
		nip98(t, listenerKey, "POST", r.HTTPURL+outbox.RegistrationPath, body, nil))
	require.Equal(t, http.StatusOK, reply.Status, reply.Raw)
	owner := r.Dial(t, "")
	owner.Auth(nil)
	ch := createChannel(t, owner, "agents", false)
	mention := func(text string) *nostr.Event {
		ev := owner.Sign(9, text, nostr.Tags{{"h", ch}, {"p", target}}, 0)
		require.True(t, owner.Publish(ev).OK)
		return ev
	}
	// Ten deliveries hang at the listener, ten claimed rows wait in the
	// hand-off: the next mention has no room to be claimed.
	for i := range 10 {
		mention(fmt.Sprintf("in flight %d", i))
	}
	for range 10 {
		select {
		case <-posted:
		case <-time.After(time.Minute):
			t.Fatal("the first ten POSTs")
		}
	}
	for i := range 10 {
		mention(fmt.Sprintf("handed off %d", i))
	}
	late := mention("late")
	var state string
	require.NoError(t, pool.QueryRow(ctx, `SELECT state FROM operator_listener_outbox WHERE encode(event_id, 'hex') = $1`, late.ID).Scan(&state))
	require.Equal(t, "pending", state, "the late mention was not claimed at insert")

	open()
	deadline := time.After(time.Minute)
	for {
		select {
		case id := <-posted:
			if id == late.ID {
				waitForEmptyOutbox(t, r, time.Minute, "every row is delivered")
				return
			}
		case <-deadline:
			t.Fatal("the mention the hand-off had no room for is posted once it frees (not at the idle poll's timer)")
		}
	}
}
