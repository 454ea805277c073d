package relay_test

import (
	"bytes"
	"context"
	"crypto/x509"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/buzzrelay/buzz/internal/nostr"
	"github.com/buzzrelay/buzz/internal/outbox"
	"github.com/buzzrelay/buzz/internal/relaytest"
)

// End to end: a listener registers a target over the NIP-98
// operator API; a channel message mentioning the target is delivered to the
// listener's HTTPS endpoint through the post-commit hand-off, signed by the
// relay key that NIP-11 advertises.
func TestOperatorListenerDeliveryEndToEnd(t *testing.T) {
	t.Parallel()
	r := relaytest.Start(t)
	deliveries := make(chan map[string]any, 4)
	listenerURL, roots := startListenerEndpoint(t, deliveries)

	listenerKey := relaytest.NewKey(t)
	cfg := outbox.Config{
		Listeners: outbox.Routes{listenerKey.PublicKeyHex(): listenerURL},
		Timeout:   5 * time.Second,
		APIOrigin: r.HTTPURL,
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	require.NoError(t, r.Server.StartOperatorListeners(ctx, cfg, r.CommunityID, outbox.WithRootCAs(roots)))

	agent := relaytest.NewKey(t)
	body := []byte(`{"pubkeys":["` + agent.PublicKeyHex() + `"]}`)
	auth := authHeader(nip98(t, listenerKey, "POST", r.HTTPURL+outbox.RegistrationPath, body, nil))
	register := func() int {
		req, err := http.NewRequest(http.MethodPost, r.HTTPURL+outbox.RegistrationPath, bytes.NewReader(body))
		require.NoError(t, err)
		req.Header.Set("Authorization", auth)
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		resp.Body.Close()
		return resp.StatusCode
	}
	require.Equal(t, http.StatusOK, register())
	require.Equal(t, http.StatusUnauthorized, register(), "a replayed auth event is refused")

	c := r.Dial(t, "")
	c.Auth(nil)
	ch := createChannel(t, c, "agents", false)
	msg := c.Sign(9, "hey agent, wake up", nostr.Tags{{"h", ch}, {"p", agent.PublicKeyHex()}}, 0)
	require.True(t, c.Publish(msg).OK)

	select {
	case got := <-deliveries:
		require.Equal(t, msg.ID, got["event_id"])
		require.Equal(t, agent.PublicKeyHex(), got["pubkey"])
		require.Equal(t, r.Host, got["community_host"])
		require.EqualValues(t, 9, got["event_kind"])
		require.Contains(t, got["authorization"], "Nostr ")
	case <-time.After(10 * time.Second):
		t.Fatal("the listener was not called")
	}

	// A kind 1 mentioning the agent is not a message kind: nothing is queued.
	require.True(t, c.Publish(c.Sign(1, "not a message", nostr.Tags{{"p", agent.PublicKeyHex()}}, 0)).OK)
	// The worker deletes the delivered row once the listener has answered.
	waitForEmptyOutbox(t, r, time.Minute, "the delivered row is gone")
	select {
	case got := <-deliveries:
		t.Fatalf("kind 1 is not a message kind, yet the listener got %v", got)
	case <-time.After(300 * time.Millisecond):
	}
}

// waitForEmptyOutbox waits until r's outbox holds no row: every row was
// delivered, failed or withdrawn.
func waitForEmptyOutbox(t *testing.T, r *relaytest.Relay, within time.Duration, why string) {
	t.Helper()
	require.Eventually(t, func() bool {
		var queued int
		require.NoError(t, r.Pool.QueryRow(context.Background(), "SELECT count(*) FROM operator_listener_outbox").Scan(&queued))
		return queued == 0
	}, within, 20*time.Millisecond, why)
}

// startListenerEndpoint runs an operator listener's HTTPS endpoint that
// passes every delivery on to deliveries (the JSON body, plus its
// Authorization header under "authorization"), and returns the URL a
// listener route names and the root a relay needs to trust it. It answers
// the first deliveries with statuses, in order, and the rest with 200.
func startListenerEndpoint(t *testing.T, deliveries chan<- map[string]any, statuses ...int) (string, *x509.CertPool) {
	t.Helper()
	var mu sync.Mutex
	listener := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		body, _ := io.ReadAll(req.Body)
		var got map[string]any
		_ = json.Unmarshal(body, &got)
		got["authorization"] = req.Header.Get("Authorization")
		deliveries <- got
		mu.Lock()
		defer mu.Unlock()
		if len(statuses) > 0 {
			w.WriteHeader(statuses[0])
			statuses = statuses[1:]
		}
	}))
	t.Cleanup(listener.Close)
	roots := x509.NewCertPool()
	roots.AddCert(listener.Certificate())
	return listener.URL + "/wake", roots
}

// A private channel's owner mentions a registered member and a registered
// outsider in one message: only the member's listener is paged. The
// outsider can read neither the message nor its #p, and a POST would tell
// its listener the message's id, kind, time and community anyway.
// Mutation killed: the relay enqueueing without the event's channel
// (Enqueue given nil, so every registered target counts as a reader).
func TestPrivateChannelMentionPagesOnlyTargetsThatAreMembers(t *testing.T) {
	t.Parallel()
	r := relaytest.Start(t)
	deliveries := make(chan map[string]any, 4)
	listenerURL, roots := startListenerEndpoint(t, deliveries)
	listenerKey := relaytest.NewKey(t)
	cfg := outbox.Config{Listeners: outbox.Routes{listenerKey.PublicKeyHex(): listenerURL}, Timeout: 5 * time.Second, APIOrigin: r.HTTPURL}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	require.NoError(t, r.Server.StartOperatorListeners(ctx, cfg, r.CommunityID, outbox.WithRootCAs(roots)))

	member, outsider := relaytest.NewKey(t), relaytest.NewKey(t)
	for _, target := range []*nostr.SecretKey{member, outsider} {
		_, err := r.Pool.Exec(ctx, `INSERT INTO operator_listener_pubkeys (listener_pubkey, target_pubkey) VALUES (decode($1, 'hex'), decode($2, 'hex'))`,
			listenerKey.PublicKeyHex(), target.PublicKeyHex())
		require.NoError(t, err)
	}

	owner := r.Dial(t, "")
	owner.Auth(nil)
	ch := createChannel(t, owner, "secret", true)
	require.True(t, owner.Publish(owner.Sign(9000, "", nostr.Tags{{"h", ch}, {"p", member.PublicKeyHex()}}, 0)).OK)
	msg := owner.Sign(9, "plans about the outsider", nostr.Tags{{"h", ch}, {"p", member.PublicKeyHex()}, {"p", outsider.PublicKeyHex()}}, 0)
	require.True(t, owner.Publish(msg).OK)

	o := r.Dial(t, "")
	o.Auth(outsider)
	require.Empty(t, o.Req("ids", map[string]any{"ids": []string{msg.ID}}), "the outsider reads the private message")
	require.Empty(t, o.Req("p", map[string]any{"#p": []string{outsider.PublicKeyHex()}}), "the outsider reads it by #p")

	paged := map[string]bool{}
	select {
	case got := <-deliveries:
		require.Equal(t, msg.ID, got["event_id"])
		paged[got["pubkey"].(string)] = true
	case <-time.After(10 * time.Second):
		t.Fatal("no listener was called")
	}
	// A row is deleted only after its POST was answered, and the endpoint
	// passes a POST on before answering it: once the outbox is empty, every
	// POST of the message is in deliveries.
	waitForEmptyOutbox(t, r, time.Minute, "the outbox is empty")
	for len(deliveries) > 0 {
		paged[(<-deliveries)["pubkey"].(string)] = true
	}
	require.Equal(t, map[string]bool{member.PublicKeyHex(): true}, paged, "only the member is paged, never the outsider")
}

// A message its author deletes while its notification waits for a retry
// (the listener answered 503) is not delivered again: the next poll
// withdraws the row instead of sending it.
// Mutation killed: the outbox claim without its check that the event is
// still live (the retry POSTs the deleted message's notification).
func TestDeletedMentionIsNotRedeliveredAfterARetry(t *testing.T) {
	t.Parallel()
	r := relaytest.Start(t)
	deliveries := make(chan map[string]any, 4)
	listenerURL, roots := startListenerEndpoint(t, deliveries, http.StatusServiceUnavailable)
	listenerKey, agent := relaytest.NewKey(t), relaytest.NewKey(t)
	cfg := outbox.Config{
		Listeners: outbox.Routes{listenerKey.PublicKeyHex(): listenerURL},
		Timeout:   5 * time.Second, IdlePoll: 200 * time.Millisecond, APIOrigin: r.HTTPURL,
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	require.NoError(t, r.Server.StartOperatorListeners(ctx, cfg, r.CommunityID, outbox.WithRootCAs(roots)))
	_, err := r.Pool.Exec(ctx, `INSERT INTO operator_listener_pubkeys (listener_pubkey, target_pubkey) VALUES (decode($1, 'hex'), decode($2, 'hex'))`,
		listenerKey.PublicKeyHex(), agent.PublicKeyHex())
	require.NoError(t, err)

	c := r.Dial(t, "")
	c.Auth(nil)
	ch := createChannel(t, c, "agents", false)
	msg := c.Sign(9, "hey agent, ignore this", nostr.Tags{{"h", ch}, {"p", agent.PublicKeyHex()}}, 0)
	require.True(t, c.Publish(msg).OK)
	select {
	case got := <-deliveries:
		require.Equal(t, msg.ID, got["event_id"], "the first attempt, refused by the listener")
	case <-time.After(10 * time.Second):
		t.Fatal("the listener was not called")
	}
	require.True(t, c.Publish(c.Sign(5, "", nostr.Tags{{"e", msg.ID}}, 0)).OK)

	// The retry is due a second after the 503; the poll runs every 200 ms.
	waitForEmptyOutbox(t, r, time.Minute, "the retry is withdrawn")
	select {
	case got := <-deliveries:
		t.Fatalf("the deleted message's notification was sent again: %v", got)
	default:
	}
}
