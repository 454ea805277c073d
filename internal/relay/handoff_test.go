package relay_test

import (
	"context"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/buzzrelay/buzz/internal/dbtest"
	"github.com/buzzrelay/buzz/internal/nostr"
	"github.com/buzzrelay/buzz/internal/outbox"
	"github.com/buzzrelay/buzz/internal/relaytest"
)

// claimWatch records the outbox worker's statements as the database sees
// them: how many polls ran, and the ids of the rows whose delivery was
// completed.
type claimWatch struct {
	mu        sync.Mutex
	polls     int
	completed []uuid.UUID
}

func (w *claimWatch) TraceQueryStart(ctx context.Context, _ *pgx.Conn, data pgx.TraceQueryStartData) context.Context {
	w.mu.Lock()
	defer w.mu.Unlock()
	switch {
	case strings.Contains(data.SQL, "-- name: OutboxClaimDue "):
		w.polls++
	case strings.Contains(data.SQL, "-- name: OutboxComplete "):
		for _, arg := range data.Args[:1] {
			if id, ok := arg.(uuid.UUID); ok {
				w.completed = append(w.completed, id)
			}
		}
	}
	return ctx
}

func (*claimWatch) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

func (w *claimWatch) snapshot() (polls int, completed []uuid.UUID) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.polls, append([]uuid.UUID(nil), w.completed...)
}

// handoffRelay is a relay whose outbox worker polls an idle outbox only every
// few minutes, so within a test only the post-commit hand-off delivers, with
// a registered agent and an authenticated client in an open channel.
type handoffRelay struct {
	*relaytest.Relay
	watch      *claimWatch
	deliveries chan map[string]any
	agent      *nostr.SecretKey
	// listenerKey is the listener's own key, which signs its registrations.
	listenerKey *nostr.SecretKey
	client      *relaytest.Client
	channel     string
}

func startHandoffRelay(t *testing.T) *handoffRelay {
	t.Helper()
	watch := &claimWatch{}
	pool := dbtest.PoolOn(t, dbtest.URL(t), 0, func(c *pgxpool.Config) { c.ConnConfig.Tracer = watch })
	r := relaytest.StartOn(t, pool)

	h := &handoffRelay{Relay: r, watch: watch, deliveries: make(chan map[string]any, 8), agent: relaytest.NewKey(t)}
	listenerURL, roots := startListenerEndpoint(t, h.deliveries)
	listenerKey := relaytest.NewKey(t)
	h.listenerKey = listenerKey
	cfg := outbox.Config{
		Listeners: outbox.Routes{listenerKey.PublicKeyHex(): listenerURL},
		Timeout:   5 * time.Second,
		APIOrigin: r.HTTPURL,
		// After its first poll (at start) the worker waits 75 s, then
		// longer: far past every deadline below.
		IdlePoll: 10 * time.Minute,
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	require.NoError(t, r.Server.StartOperatorListeners(ctx, cfg, r.CommunityID, outbox.WithRootCAs(roots)))
	// The first poll runs as the worker starts; everything published after
	// it can only be delivered by a hand-off.
	require.Eventually(t, func() bool { polls, _ := watch.snapshot(); return polls >= 1 },
		30*time.Second, 10*time.Millisecond, "the worker's first poll")

	body := []byte(`{"pubkeys":["` + h.agent.PublicKeyHex() + `"]}`)
	reply := operatorRequest(t, r, http.MethodPost, "", body,
		nip98(t, listenerKey, "POST", r.HTTPURL+outbox.RegistrationPath, body, nil))
	require.Equal(t, http.StatusOK, reply.Status, reply.Raw)

	h.client = r.Dial(t, "")
	h.client.Auth(nil)
	h.channel = createChannel(t, h.client, "agents", false)
	return h
}

// mention publishes a channel message that p-tags the agent.
func (h *handoffRelay) mention(t *testing.T, content string) (*nostr.Event, relaytest.Reply) {
	t.Helper()
	msg := h.client.Sign(9, content, nostr.Tags{{"h", h.channel}, {"p", h.agent.PublicKeyHex()}}, 0)
	return msg, h.client.Publish(msg)
}

func (h *handoffRelay) nextDelivery(t *testing.T) map[string]any {
	t.Helper()
	select {
	case got := <-h.deliveries:
		return got
	case <-time.After(30 * time.Second):
		t.Fatal("the listener was not called: only the post-commit hand-off could have delivered in time")
		return nil
	}
}

// A mention saved by this relay reaches the listener through the
// post-commit hand-off of the relay's own wiring (the row claimed at insert
// for this relay's worker → ingest AfterCommit → Worker.Offer), not through
// the poll, which is minutes away.
//
// Mutation killed: removing the hand-off (the AfterCommit in
// enqueueMentions, or Offer's send) leaves the row to a poll that does not
// come: "the listener was not called".
func TestMentionIsDeliveredByTheHandOffNotThePoll(t *testing.T) {
	t.Parallel()
	h := startHandoffRelay(t)

	msg, ok := h.mention(t, "wake up")
	require.True(t, ok.OK, ok.Msg)
	got := h.nextDelivery(t)
	require.Equal(t, msg.ID, got["event_id"])
	require.Eventually(t, func() bool { _, done := h.watch.snapshot(); return len(done) == 1 },
		30*time.Second, 10*time.Millisecond, "the handed-off row's delivery is completed")
	polls, _ := h.watch.snapshot()
	require.Equal(t, 1, polls, "only the start-up poll ran: the hand-off delivered")
}

// An event whose transaction fails at COMMIT (a deferred constraint) hands
// nothing to the worker and is never delivered; the next mention is, by the
// hand-off: the doomed events (as many as the hand-off holds) gave back the
// room their claims at insert reserved.
//
// Mutations killed: running the AfterCommit callbacks inside the
// transaction (before COMMIT), or after a failed commit, hands the doomed
// row to the worker, which delivers it first: the first delivery names the
// refused event. (The doomed row reaches the worker before the good one:
// one connection publishes them in order and the hand-off channel is
// FIFO.) Not giving the room back after a rollback (no OnRollback in
// enqueueMentions; reset or finish not running the rollback steps: the
// group's commit fails, then the event's own): the good row finds no room,
// is left to the poll, and is not delivered in time.
func TestFailedCommitHandsNothingOff(t *testing.T) {
	t.Parallel()
	h := startHandoffRelay(t)
	// A check only COMMIT runs: every statement of the event's transaction
	// succeeds, the outbox row is written, and then the commit fails.
	_, err := h.Pool.Exec(context.Background(), `
		CREATE FUNCTION test_refuse_at_commit() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN
			IF EXISTS (SELECT FROM events WHERE id = NEW.event_id AND content = 'refused at commit') THEN
				RAISE EXCEPTION 'refused at commit' USING ERRCODE = 'P0001';
			END IF;
			RETURN NULL;
		END $$;
		CREATE CONSTRAINT TRIGGER test_refuse_at_commit AFTER INSERT ON operator_listener_outbox
			DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION test_refuse_at_commit();`)
	require.NoError(t, err)

	var doomed *nostr.Event
	for range 10 { // the hand-off's capacity
		var refused relaytest.Reply
		doomed, refused = h.mention(t, "refused at commit")
		require.False(t, refused.OK, "the commit failed, yet the relay accepted the event")
	}
	msg, ok := h.mention(t, "this one commits")
	require.True(t, ok.OK, ok.Msg)

	got := h.nextDelivery(t)
	require.Equal(t, msg.ID, got["event_id"], "only the committed row is handed off")
	require.Eventually(t, func() bool { _, done := h.watch.snapshot(); return len(done) == 1 },
		30*time.Second, 10*time.Millisecond, "the committed row's delivery is completed")

	var stored int
	require.NoError(t, h.Pool.QueryRow(context.Background(),
		`SELECT count(*) FROM events WHERE id = $1`, idBytes(doomed)).Scan(&stored))
	require.Zero(t, stored, "the refused event is not stored")
	select {
	case extra := <-h.deliveries:
		t.Fatalf("a second delivery: %v", extra)
	default:
	}
}
