package relay_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/buzzrelay/buzz/internal/config"
	"github.com/buzzrelay/buzz/internal/relaytest"
)

// dialFrom opens a WebSocket to r's home community from the loopback
// address local (any of 127.0.0.0/8), with extra request headers.
func dialFrom(t testing.TB, r *relaytest.Relay, local string, header http.Header) (*websocket.Conn, error) {
	t.Helper()
	dialer := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(local)}}
	client := &http.Client{Transport: &http.Transport{DialContext: dialer.DialContext, DisableKeepAlives: true}}
	ctx, cancel := context.WithTimeout(context.Background(), relaytest.Patience)
	defer cancel()
	ws, _, err := websocket.Dial(ctx, r.URL, &websocket.DialOptions{Host: r.Host, HTTPClient: client, HTTPHeader: header})
	if err == nil {
		t.Cleanup(func() { ws.CloseNow() })
	}
	return ws, err
}

// readUntilClosed reads and discards frames until the relay closes ws, and
// returns the close error (a deadline error if it never does).
func readUntilClosed(ws *websocket.Conn, wait time.Duration) error {
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	for {
		if _, _, err := ws.Read(ctx); err != nil {
			return err
		}
	}
}

func connections(r *relaytest.Relay) float64 {
	return testutil.ToFloat64(r.Server.Metrics().Connections)
}

// A socket that never authenticates is closed at the AUTH deadline (1008,
// auth-required); an authenticated one on the same relay is not.
func TestUnauthenticatedConnectionIsClosedAtTheAuthDeadline(t *testing.T) {
	t.Parallel()
	// 10 s, not less: the other connection must dial and authenticate
	// within it, or it too is closed at the deadline.
	r := relaytest.Start(t, func(c *config.Config) { c.AuthTimeout = 10 * time.Second })
	authed := r.Dial(t, "")
	authed.Auth(nil)
	idle := r.Dial(t, "")

	err := readUntilClosed(idle.WS, 60*time.Second)
	require.Equal(t, websocket.StatusPolicyViolation, websocket.CloseStatus(err), "got %v", err)
	var ce websocket.CloseError
	require.ErrorAs(t, err, &ce)
	require.True(t, strings.HasPrefix(ce.Reason, "auth-required: "), ce.Reason)
	require.Equal(t, 1.0, testutil.ToFloat64(r.Server.Metrics().AuthTimeouts))

	// The authenticated connection outlived the deadline and still works.
	require.True(t, authed.Publish(authed.Sign(1, "still here", nil, 0)).OK)
}

// Connections are capped per client address (429) and in total (503),
// before the upgrade; a closed connection frees its slot.
func TestConnectionCapsPerAddressAndTotal(t *testing.T) {
	t.Parallel()
	r := relaytest.Start(t, func(c *config.Config) { c.MaxConnections = 3; c.MaxConnectionsPerAddr = 2 })
	first, err := dialFrom(t, r, "127.0.0.1", nil)
	require.NoError(t, err)
	_, err = dialFrom(t, r, "127.0.0.1", nil)
	require.NoError(t, err)
	_, err = dialFrom(t, r, "127.0.0.1", nil)
	require.ErrorContains(t, err, "429", "a third connection from one address")
	_, err = dialFrom(t, r, "127.0.0.2", nil)
	require.NoError(t, err, "another address still gets in")
	_, err = dialFrom(t, r, "127.0.0.3", nil)
	require.ErrorContains(t, err, "503", "the relay is full")
	require.Equal(t, 1.0, testutil.ToFloat64(r.Server.Metrics().ConnsRefused.WithLabelValues("address")))
	require.Equal(t, 1.0, testutil.ToFloat64(r.Server.Metrics().ConnsRefused.WithLabelValues("total")))

	first.CloseNow()
	require.Eventually(t, func() bool { return connections(r) == 2 }, 30*time.Second, 10*time.Millisecond)
	_, err = dialFrom(t, r, "127.0.0.1", nil)
	require.NoError(t, err, "a freed slot is reusable")
}

// X-Forwarded-For names the client only when the peer is a configured
// proxy: a direct client cannot dodge the per-address cap with it, and
// clients behind a trusted proxy are told apart.
func TestForwardedForOnlyFromTrustedProxies(t *testing.T) {
	t.Parallel()
	from := func(addr string) http.Header { return http.Header{"X-Forwarded-For": {addr}} }

	direct := relaytest.Start(t, func(c *config.Config) { c.MaxConnectionsPerAddr = 1 })
	_, err := dialFrom(t, direct, "127.0.0.1", from("198.51.100.1"))
	require.NoError(t, err)
	_, err = dialFrom(t, direct, "127.0.0.1", from("198.51.100.2"))
	require.ErrorContains(t, err, "429", "an untrusted peer's X-Forwarded-For is ignored")

	proxied := relaytest.Start(t, func(c *config.Config) {
		c.MaxConnectionsPerAddr = 1
		c.TrustedProxies = mustPrefixes(t, "127.0.0.1")
	})
	_, err = dialFrom(t, proxied, "127.0.0.1", from("198.51.100.1"))
	require.NoError(t, err)
	_, err = dialFrom(t, proxied, "127.0.0.1", from("203.0.113.9, 198.51.100.2"))
	require.NoError(t, err, "a second client behind the proxy")
	_, err = dialFrom(t, proxied, "127.0.0.1", from("198.51.100.1"))
	require.ErrorContains(t, err, "429", "the first client again")
}

// The per-address cap counts an IPv6 client by its /64: addresses in one
// subscriber's prefix are free to pick, so each must not be a new client.
func TestPerAddressCapCountsIPv6ByItsSlash64(t *testing.T) {
	t.Parallel()
	from := func(addr string) http.Header { return http.Header{"X-Forwarded-For": {addr}} }
	r := relaytest.Start(t, func(c *config.Config) {
		c.MaxConnectionsPerAddr = 1
		c.TrustedProxies = mustPrefixes(t, "127.0.0.1")
	})
	_, err := dialFrom(t, r, "127.0.0.1", from("2001:db8:1:2::1"))
	require.NoError(t, err)
	_, err = dialFrom(t, r, "127.0.0.1", from("2001:db8:1:2:ffff:ffff:ffff:fffe"))
	require.ErrorContains(t, err, "429", "another address in the same /64")
	_, err = dialFrom(t, r, "127.0.0.1", from("2001:db8:1:3::1"))
	require.NoError(t, err, "the next /64 is another client")
	_, err = dialFrom(t, r, "127.0.0.1", from("198.51.100.1"))
	require.NoError(t, err, "IPv4 clients are still told apart by address")
	_, err = dialFrom(t, r, "127.0.0.1", from("198.51.100.2"))
	require.NoError(t, err)
}

func mustPrefixes(t *testing.T, list string) []netip.Prefix {
	t.Helper()
	c, err := config.FromEnv(func(k string) string {
		if k == "BUZZ_TRUSTED_PROXIES" {
			return list
		}
		return ""
	})
	require.NoError(t, err)
	return c.TrustedProxies
}

func randomHex(t *testing.T, n int) []string {
	out := make([]string, n)
	for i := range out {
		var b [32]byte
		_, _ = rand.Read(b[:])
		out[i] = hex.EncodeToString(b[:])
	}
	return out
}

// The filter values held by one connection's open subscriptions are
// budgeted: a REQ that would exceed the budget is CLOSED with
// rate-limited (replacing its id even so), and closing a subscription
// gives its share back.
func TestFilterValueBudgetPerConnection(t *testing.T) {
	t.Parallel()
	r := relaytest.Start(t, func(c *config.Config) { c.MaxFilterValues = 100 })
	c := r.Dial(t, "")
	c.Auth(nil)
	authors := randomHex(t, 100)
	req := func(id string, n int) relaytest.Reply {
		c.Send("REQ", id, map[string]any{"authors": authors[:n], "kinds": []int{1}})
		return c.NextReply()
	}
	require.Equal(t, "EOSE", req("a", 59).Verb) // 59 authors + 1 kind
	over := req("b", 50)
	require.Equal(t, "CLOSED", over.Verb)
	require.True(t, strings.HasPrefix(over.Msg, "rate-limited: "), over.Msg)
	require.Equal(t, "EOSE", req("b", 39).Verb)
	// Replacing a with more than the rest of the budget closes a.
	require.Equal(t, "CLOSED", req("a", 61).Verb)
	require.Equal(t, "EOSE", req("c", 59).Verb, "a's share came back")
	c.Send("CLOSE", "b")
	c.Send("CLOSE", "c")
	require.Equal(t, "EOSE", req("d", 99).Verb)
}

// A message over BUZZ_MAX_MESSAGE_BYTES is read and dropped as it arrives,
// not held whole until its last fragment: held, a client sending one just
// under the 4x close limit, slowly or never finishing it, pinned 1 MiB of
// relay heap per connection (measured: 1,176 KiB each, 50 connections from
// one address about 58 MiB), four times what any message the relay accepts
// needs. It is still answered, with a CLOSED for its subscription naming
// its size, and the connection stays usable.
// Mutation killed: conn.readMessage reading the whole message
// (io.ReadAll(r)) before checking its size.
func TestOversizedMessageIsNotHeldWhole(t *testing.T) {
	// Not parallel: it measures the process's heap.
	r := relaytest.Start(t)
	const (
		clients = 20
		chunk   = 64 << 10
		chunks  = 15 // 960 KiB: over the 256 KiB limit, under the 1 MiB close
	)
	limit := config.Default().MaxMessageBytes
	conns := make([]*relaytest.Client, clients)
	for i := range conns {
		conns[i] = r.Dial(t, "")
		conns[i].Auth(nil)
	}
	before := heapInUse()

	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	payload := []byte(`["REQ","big",{"#t":["` + strings.Repeat("v", chunk))
	payload = payload[:chunk]
	writers := make([]io.WriteCloser, clients)
	replies := make([]chan string, clients)
	for i, c := range conns {
		w, err := c.WS.Writer(ctx, websocket.MessageText)
		require.NoError(t, err)
		writers[i] = w
		for range chunks {
			_, err := w.Write(payload) // one fragment each
			require.NoError(t, err)
		}
		// The relay answers a ping only once it has read every fragment
		// sent before it; the pong is read by this goroutine, which then
		// waits for the NOTICE.
		replies[i] = make(chan string, 1)
		go func(c *relaytest.Client, out chan<- string) {
			_, msg, err := c.WS.Read(ctx)
			if err != nil {
				out <- err.Error()
				return
			}
			out <- string(msg)
		}(c, replies[i])
		require.NoError(t, c.WS.Ping(ctx))
	}
	// Every connection is in the middle of its 960 KiB message.
	grown := int64(heapInUse()) - int64(before)
	t.Logf("%d connections, each %d KiB into a message: heap grew %d KiB (%d KiB each)", clients, chunks*chunk>>10, grown>>10, grown/clients>>10)
	require.Less(t, grown, int64(clients*2*limit), "each connection may hold about one message's limit, not the whole oversized message")

	want := fmt.Sprintf(`["CLOSED","big","invalid: message of %d bytes exceeds the %d-byte limit"]`, chunks*chunk, limit)
	for i, w := range writers {
		require.NoError(t, w.Close())
		require.Equal(t, want, <-replies[i])
	}
	for _, c := range conns {
		c.Send("COUNT", "alive", map[string]any{"kinds": []int{1}})
		require.Equal(t, int64(0), c.Expect("COUNT").Count, "the connection stays usable")
	}
}

// The refusals before the upgrade, the relay full and the relay shutting
// down, are 503 with a JSON body whose error carries the error: prefix, so
// a client (the buzz CLI) reports the relay's reason, not a bare status.
//
// Mutations killed: either reason without its prefix.
func TestRefusalsBeforeTheUpgradeAnswerPrefixedJSON(t *testing.T) {
	t.Parallel()
	r := relaytest.Start(t, func(c *config.Config) { c.MaxConnections = 1 })
	upgrade := func() (int, string, map[string]string) {
		t.Helper()
		req, err := http.NewRequest(http.MethodGet, r.HTTPURL, nil)
		require.NoError(t, err)
		req.Host = r.Host
		req.Header.Set("Connection", "Upgrade")
		req.Header.Set("Upgrade", "websocket")
		req.Header.Set("Sec-WebSocket-Version", "13")
		req.Header.Set("Sec-WebSocket-Key", "dGhlIHNhbXBsZSBub25jZQ==")
		resp, err := bridgeHTTP.Do(req)
		require.NoError(t, err)
		defer resp.Body.Close()
		var body map[string]string
		require.NoError(t, json.NewDecoder(resp.Body).Decode(&body))
		return resp.StatusCode, resp.Header.Get("Content-Type"), body
	}

	_, err := dialFrom(t, r, "127.0.0.1", nil)
	require.NoError(t, err)
	status, contentType, body := upgrade()
	require.Equal(t, http.StatusServiceUnavailable, status)
	require.Equal(t, "application/json", contentType)
	require.Equal(t, "error: relay is at its limit of 1 connections; try again later", body["error"])

	ctx, cancel := context.WithTimeout(context.Background(), relaytest.Patience)
	defer cancel()
	require.NoError(t, r.Shutdown(ctx))
	status, contentType, body = upgrade()
	require.Equal(t, http.StatusServiceUnavailable, status)
	require.Equal(t, "application/json", contentType)
	require.Equal(t, "error: relay shutting down", body["error"])
}
