package relay_test

import (
	"bytes"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/buzzrelay/buzz/internal/config"
	"github.com/buzzrelay/buzz/internal/nostr"
	"github.com/buzzrelay/buzz/internal/relaytest"
)

// withoutPayload drops the payload tag from a NIP-98 event before signing.
func withoutPayload(ev *nostr.Event) {
	kept := nostr.Tags{}
	for _, tag := range ev.Tags {
		if tag[0] != "payload" {
			kept = append(kept, tag)
		}
	}
	ev.Tags = kept
}

// A request with a body must sign the body's hash: without the payload tag
// a captured Authorization header could carry any other body.
func TestHTTPBridgeRequiresPayloadTagWithABody(t *testing.T) {
	t.Parallel()
	r := relaytest.Start(t)
	key := relaytest.NewKey(t)
	ev := relaytest.SignEvent(t, key, 1, "unbound body", nil, 0)
	for path, body := range map[string][]byte{
		"/events": encodeBody(t, ev),
		"/query":  encodeBody(t, query(map[string]any{"kinds": []int{1}})),
		"/count":  encodeBody(t, query(map[string]any{"kinds": []int{1}})),
	} {
		auth := nip98(t, key, "POST", r.HTTPURL+path, body, withoutPayload)
		got := send(t, r, "", path, authHeader(auth), body)
		require.Equal(t, http.StatusUnauthorized, got.Status, "%s: %s", path, got.Raw)
		require.Contains(t, got.Error, "payload tag", path)
	}
	// Nothing was stored by the refused submission.
	got := post(t, r, key, "/query", query(map[string]any{"ids": []string{ev.ID}}))
	require.Equal(t, http.StatusOK, got.Status, got.Raw)
	require.Empty(t, got.Events)
}

// X-Forwarded-Proto sets the scheme a NIP-98 u tag must name only when the
// request came through a configured proxy.
func TestForwardedProtoOnlyFromTrustedProxies(t *testing.T) {
	t.Parallel()
	viaProxy := func(r *relaytest.Relay) int {
		key := relaytest.NewKey(t)
		body := encodeBody(t, query(map[string]any{"kinds": []int{1}}))
		url := r.HTTPURL + "/count"
		ev := nip98(t, key, "POST", strings.Replace(url, "http://", "https://", 1), body, nil)
		req, err := http.NewRequest(http.MethodPost, url, bytes.NewReader(body))
		require.NoError(t, err)
		req.Header.Set("Authorization", authHeader(ev))
		req.Header.Set("X-Forwarded-Proto", "https")
		resp, err := bridgeHTTP.Do(req)
		require.NoError(t, err)
		resp.Body.Close()
		return resp.StatusCode
	}
	require.Equal(t, http.StatusUnauthorized, viaProxy(relaytest.Start(t)), "nobody is trusted by default")
	trusting := relaytest.Start(t, func(c *config.Config) { c.TrustedProxies = mustPrefixes(t, "127.0.0.0/8,::1") })
	require.Equal(t, http.StatusOK, viaProxy(trusting))
}

// One pubkey's publishing is rate limited per community, on WebSocket and
// the HTTP bridge alike, with rate-limited: and the connection survives;
// other pubkeys are unaffected.
func TestPublishRateLimitPerPubkey(t *testing.T) {
	t.Parallel()
	r := relaytest.Start(t, func(c *config.Config) { c.PublishPerMinute = 1; c.PublishBurst = 3 })
	c := r.Dial(t, "")
	key := c.Auth(nil)
	for i := range 3 {
		require.True(t, c.Publish(c.Sign(1, fmt.Sprint("burst ", i), nil, 0)).OK)
	}
	limited := c.Sign(1, "one too many", nil, 0)
	ok := c.Publish(limited)
	require.False(t, ok.OK)
	require.True(t, strings.HasPrefix(ok.Msg, "rate-limited: "), ok.Msg)
	require.Empty(t, c.Req("q", map[string]any{"ids": []string{limited.ID}}), "refused, not stored; the connection still serves")

	// The bridge shares the bucket.
	got := post(t, r, key, "/events", relaytest.SignEvent(t, key, 1, "via http", nil, 0))
	require.Equal(t, http.StatusTooManyRequests, got.Status, got.Raw)
	require.True(t, strings.HasPrefix(got.Msg, "rate-limited: "), got.Msg)
	require.NotEmpty(t, got.Header.Get("Retry-After"))

	other := r.Dial(t, "")
	other.Auth(nil)
	require.True(t, other.Publish(other.Sign(1, "someone else", nil, 0)).OK)
	require.Equal(t, 2.0, testutil.ToFloat64(r.Server.Metrics().RateLimited))
}

// rawRequest writes a request by hand and returns the connection.
func rawConn(t *testing.T, r *relaytest.Relay) net.Conn {
	t.Helper()
	conn, err := net.Dial("tcp", strings.TrimPrefix(r.HTTPURL, "http://"))
	require.NoError(t, err)
	t.Cleanup(func() { conn.Close() })
	return conn
}

// readToEOF reads until the relay closes conn; a read that waits past the
// generous deadline fails the test.
func readToEOF(t *testing.T, conn net.Conn) string {
	t.Helper()
	require.NoError(t, conn.SetReadDeadline(time.Now().Add(60*time.Second)))
	got, err := io.ReadAll(conn)
	require.NoError(t, err, "the relay kept the connection open")
	return string(got)
}

// A body that never finishes arriving is cut off at the read timeout.
func TestHTTPServerDropsASlowRequestBody(t *testing.T) {
	t.Parallel()
	r := relaytest.Start(t, func(c *config.Config) { c.HTTPReadTimeout = time.Second })
	key := relaytest.NewKey(t)
	body := encodeBody(t, relaytest.SignEvent(t, key, 1, "sent slowly", nil, 0))
	auth := authHeader(nip98(t, key, "POST", r.HTTPURL+"/events", body, nil))
	conn := rawConn(t, r)
	_, err := fmt.Fprintf(conn, "POST /events HTTP/1.1\r\nHost: %s\r\nAuthorization: %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s",
		r.Host, auth, len(body), body[:10])
	require.NoError(t, err)
	readToEOF(t, conn) // and nothing more is ever read from this client
}

// An idle keep-alive connection is closed after the idle timeout, even when
// the per-request read budget is long.
func TestHTTPServerClosesIdleKeepAlives(t *testing.T) {
	t.Parallel()
	r := relaytest.Start(t, func(c *config.Config) { c.HTTPReadTimeout = 10 * time.Minute; c.HTTPIdleTimeout = time.Second })
	conn := rawConn(t, r)
	_, err := fmt.Fprintf(conn, "GET /health HTTP/1.1\r\nHost: %s\r\n\r\n", r.Host)
	require.NoError(t, err)
	require.Contains(t, readToEOF(t, conn), `"ok"`)
}

// Bridge requests in flight from one address are capped like its WebSocket
// connections: each holds its body (up to the message limit) and a /query
// up to a MiB of answer for as long as the client takes to send or read,
// and any key signs a valid request. Three requests trickling their bodies
// hold the address's three places: a fourth is refused with 429 and JSON
// before anything is read, a WebSocket from the address still connects (its
// own count), and once the three are gone the address is served again.
// Mutation killed: the bridge routes without admitBridge (the fourth request
// was answered 200, and a hundred stalled /query downloads from one address
// held 49 MiB of heap).
func TestBridgeRequestsInFlightPerAddressAreCapped(t *testing.T) {
	t.Parallel()
	r := relaytest.Start(t, func(c *config.Config) { c.MaxConnectionsPerAddr = 3; c.HTTPReadTimeout = 10 * time.Minute })
	key := relaytest.NewKey(t)
	var held []net.Conn
	for range 3 {
		held = append(held, trickleBridgeQuery(t, r, key))
	}
	require.Eventually(t, func() bool { return r.Server.BridgeRequestsAnswering() == 3 },
		relaytest.Patience, 10*time.Millisecond, "the three trickling requests never held their places")
	got := post(t, r, key, "/query", query(map[string]any{"kinds": []int{1}}))
	require.Equal(t, http.StatusTooManyRequests, got.Status, got.Raw)
	require.Equal(t, "rate-limited: at most 3 bridge requests at once per client address; wait for one to finish", got.Error)
	r.Dial(t, "").Auth(nil)

	for _, conn := range held {
		require.NoError(t, conn.Close())
	}
	require.Eventually(t, func() bool {
		return post(t, r, key, "/count", query(map[string]any{"kinds": []int{1}})).Status == http.StatusOK
	}, relaytest.Patience, 20*time.Millisecond, "the address's places were not given back")
}

// trickleWebhookCall starts a call to hook whose body never finishes
// arriving, so it holds its place until the connection closes.
func trickleWebhookCall(t *testing.T, r *relaytest.Relay, hook string) net.Conn {
	t.Helper()
	conn := rawConn(t, r)
	_, err := fmt.Fprintf(conn, "POST %s HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n{\"a\":", hook, r.Host)
	require.NoError(t, err)
	return conn
}

// trickleBridgeQuery starts a signed /query whose body never finishes
// arriving, so it holds its place until the connection closes.
func trickleBridgeQuery(t *testing.T, r *relaytest.Relay, key *nostr.SecretKey) net.Conn {
	t.Helper()
	body := encodeBody(t, query(map[string]any{"kinds": []int{1}}))
	conn := rawConn(t, r)
	auth := authHeader(nip98(t, key, "POST", r.HTTPURL+"/query", body, nil))
	_, err := fmt.Fprintf(conn, "POST /query HTTP/1.1\r\nHost: %s\r\nAuthorization: %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s",
		r.Host, auth, len(body), body[:5])
	require.NoError(t, err)
	return conn
}

// callWebhook sends hook an empty JSON body and returns the answer's
// status, Retry-After and body.
func callWebhook(t *testing.T, r *relaytest.Relay, hook string) (status int, retryAfter, body string) {
	t.Helper()
	resp, err := http.Post(r.HTTPURL+hook, "application/json", strings.NewReader(`{}`))
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, resp.Header.Get("Retry-After"), string(b)
}

// The workflow webhook reads a body of up to its limit before any check,
// with no key at all, so its calls in flight are capped per address as
// bridge requests are, in a count of their own and with their own words:
// the integrations calling webhooks from one shared address do not take the
// bridge clients' places there. Mutations killed: the webhook route without
// a place (the trickling calls never held any); the webhook counted in the
// bridge's count (the bridge held the calls, and /count was refused); the
// refusal not counted in buzz_webhook_calls_refused_total{reason="address"}.
func TestWebhookRequestsInFlightPerAddressAreCapped(t *testing.T) {
	t.Parallel()
	r := relaytest.Start(t, func(c *config.Config) { c.MaxConnectionsPerAddr = 3; c.HTTPReadTimeout = 10 * time.Minute })
	key := relaytest.NewKey(t)
	hook := "/hooks/" + uuid.NewString()
	var held []net.Conn
	for range 3 {
		held = append(held, trickleWebhookCall(t, r, hook))
	}
	require.Eventually(t, func() bool { return r.Server.WebhookCallsAnswering() == 3 },
		relaytest.Patience, 10*time.Millisecond, "the three trickling webhook calls never held their places")
	require.Zero(t, r.Server.BridgeRequestsAnswering(), "webhook calls took bridge places")

	status, retryAfter, body := callWebhook(t, r, hook)
	require.Equal(t, http.StatusTooManyRequests, status, body)
	require.Equal(t, "1", retryAfter)
	require.JSONEq(t, `{"error":"rate-limited: at most 3 webhook calls at once per client address; wait for one to finish"}`, body)
	require.Equal(t, 1.0, testutil.ToFloat64(r.Server.Metrics().WebhookCallsRefused.WithLabelValues("address")), "refusals counted")
	require.Zero(t, testutil.ToFloat64(r.Server.Metrics().WebhookCallsRefused.WithLabelValues("total")))

	got := post(t, r, key, "/count", query(map[string]any{"kinds": []int{1}}))
	require.Equal(t, http.StatusOK, got.Status, "a bridge request was refused for the address's webhook calls: %s", got.Raw)

	for _, conn := range held {
		require.NoError(t, conn.Close())
	}
	require.Eventually(t, func() bool {
		status, _, _ := callWebhook(t, r, hook)
		return status == http.StatusUnauthorized
	}, relaytest.Patience, 20*time.Millisecond, "the address's webhook places were not given back")
}

// The other way round: bridge requests filling an address's bridge places
// leave its webhook calls theirs. Mutation killed: the webhook counted in
// the bridge's count (the call was refused with the bridge's 429).
func TestBridgeRequestsInFlightLeaveWebhookCallsTheirPlaces(t *testing.T) {
	t.Parallel()
	r := relaytest.Start(t, func(c *config.Config) { c.MaxConnectionsPerAddr = 3; c.HTTPReadTimeout = 10 * time.Minute })
	key := relaytest.NewKey(t)
	for range 3 {
		trickleBridgeQuery(t, r, key)
	}
	require.Eventually(t, func() bool { return r.Server.BridgeRequestsAnswering() == 3 },
		relaytest.Patience, 10*time.Millisecond, "the three trickling requests never held their places")
	got := post(t, r, key, "/count", query(map[string]any{"kinds": []int{1}}))
	require.Equal(t, http.StatusTooManyRequests, got.Status, got.Raw)

	status, _, body := callWebhook(t, r, "/hooks/"+uuid.NewString())
	require.Equal(t, http.StatusUnauthorized, status, "the webhook call was refused for the address's bridge requests: %s", body)
	require.JSONEq(t, `{"error":"auth-required: authentication failed"}`, body)
}

// Past the relay's cap of webhook calls in flight, from any addresses, a
// call is answered 503 in the webhook's words, before its body, and
// counted. Mutation killed: the refusal not counted
// (buzz_webhook_calls_refused_total{reason="total"} stayed 0).
func TestWebhookRequestsInFlightInAllAreCapped(t *testing.T) {
	t.Parallel()
	r := relaytest.Start(t, func(c *config.Config) {
		c.MaxConnections, c.MaxConnectionsPerAddr = 2, 2
		c.HTTPReadTimeout = 10 * time.Minute
	})
	hook := "/hooks/" + uuid.NewString()
	for range 2 {
		trickleWebhookCall(t, r, hook)
	}
	require.Eventually(t, func() bool { return r.Server.WebhookCallsAnswering() == 2 },
		relaytest.Patience, 10*time.Millisecond, "the two trickling webhook calls never held their places")
	status, retryAfter, body := callWebhook(t, r, hook)
	require.Equal(t, http.StatusServiceUnavailable, status, body)
	require.Equal(t, "1", retryAfter)
	require.JSONEq(t, `{"error":"error: the relay is answering its limit of 2 webhook calls; try again shortly"}`, body)
	require.Equal(t, 1.0, testutil.ToFloat64(r.Server.Metrics().WebhookCallsRefused.WithLabelValues("total")), "refusals counted")
}
