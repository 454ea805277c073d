package relay_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"
	"github.com/stretchr/testify/require"

	"github.com/buzzrelay/buzz/internal/clock"
	"github.com/buzzrelay/buzz/internal/config"
	"github.com/buzzrelay/buzz/internal/dbtest"
	"github.com/buzzrelay/buzz/internal/relay"
	"github.com/buzzrelay/buzz/internal/relaytest"
)

// upgrade opens a WebSocket to r's home community from the loopback
// address local, as client (an X-Forwarded-For value; "" sends none), and
// closes it as soon as the relay's AUTH challenge came: a client that
// reconnects in a loop. Refused, it returns the relay's answer.
func upgrade(t *testing.T, r *relaytest.Relay, local, client string) (refused *http.Response, body string) {
	t.Helper()
	return upgradeAt(t, r, r.Host, local, client)
}

// upgradeAt is upgrade to host, which may be one no community is served at.
func upgradeAt(t *testing.T, r *relaytest.Relay, host, local, client string) (refused *http.Response, body string) {
	t.Helper()
	var header http.Header
	if client != "" {
		header = http.Header{"X-Forwarded-For": {client}}
	}
	dialer := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(local)}}
	httpClient := &http.Client{Transport: &http.Transport{DialContext: dialer.DialContext, DisableKeepAlives: true}}
	ctx, cancel := context.WithTimeout(context.Background(), relaytest.Patience)
	defer cancel()
	ws, resp, err := websocket.Dial(ctx, r.URL, &websocket.DialOptions{Host: host, HTTPClient: httpClient, HTTPHeader: header})
	if err != nil {
		require.NotNil(t, resp, "no HTTP answer: %v", err)
		raw, _ := io.ReadAll(resp.Body)
		return resp, string(raw)
	}
	defer ws.CloseNow()
	_, msg, err := ws.Read(ctx)
	require.NoError(t, err)
	require.Contains(t, string(msg), `["AUTH"`)
	return nil, ""
}

// handshakeRefusal is the start of the answer past an address's bucket.
const handshakeRefusal = "rate-limited: too many new connections from this client address"

// refusedForRate requires a refusal by the handshake bucket: 429, a
// Retry-After that the next token (a second away at one a second) comes
// within, rounded up to the whole second and one more as the publish
// limit's, the JSON error body of every HTTP refusal.
func refusedForRate(t *testing.T, resp *http.Response, body, what string) {
	t.Helper()
	require.NotNil(t, resp, "%s: admitted", what)
	require.Equal(t, http.StatusTooManyRequests, resp.StatusCode, "%s: %s", what, body)
	require.Equal(t, "2", resp.Header.Get("Retry-After"), what)
	require.Equal(t, "application/json", resp.Header.Get("Content-Type"), what)
	var reply map[string]string
	require.NoError(t, json.Unmarshal([]byte(body), &reply), body)
	require.Equal(t, map[string]string{"error": handshakeRefusal + "; try again in 2s"}, reply, what)
}

// waitForNoConnections waits until the relay has forgotten every closed
// connection, so a refusal that follows is the handshake bucket's, not the
// per-address connection cap's.
func waitForNoConnections(t *testing.T, r *relaytest.Relay) {
	t.Helper()
	require.Eventually(t, func() bool { return connections(r) == 0 }, relaytest.Patience, 5*time.Millisecond)
}

// A client address opens at most MaxConnectionsPerAddr connections at
// once and then HandshakesPerSecond, each closed as soon as it is open:
// the burst is admitted even when its dials race, the next is refused
// before the upgrade with 429, Retry-After and the JSON error; another
// address, behind the same trusted proxy, is not; an IPv6 client counts by
// its /64; a direct client cannot pick a new address with
// X-Forwarded-For; a second of the relay's clock lets exactly one more
// in; and a refusal by the connection cap spends no token. The clock
// stands still otherwise, so nothing refills meanwhile.
// Mutations killed: no handshake bucket (the racing dialers never
// refused); one bucket for every address (the second address refused);
// the bucket keyed by the whole IPv6 address (its /64 neighbour admitted);
// X-Forwarded-For believed from any peer (the direct client's sixth
// admitted); the bucket refilled by the wall clock (a second on the
// relay's clock admits none) or never (no Retry-After to name); no
// Retry-After; the token taken before the connection caps (the cap's
// refusal spends it, and the connection after is refused).
func TestNewConnectionsPerAddressAreBounded(t *testing.T) {
	t.Parallel()
	const burst = 5
	clk := &stoppedClock{now: time.Now()}
	r := relaytest.StartWith(t, dbtest.Pool(t), []relay.Option{relay.WithClock(clock.Stub(clk.at))}, func(c *config.Config) {
		c.MaxConnectionsPerAddr = burst
		c.HandshakesPerSecond = 1
		c.TrustedProxies = mustPrefixes(t, "127.0.0.1")
	})
	const client = "203.0.113.1"

	// Ten clients behind one address dial at once until the bucket refuses
	// them; a refusal by the connection cap (a slot not yet given back by
	// a closed connection) is dialled again.
	var mu sync.Mutex
	admitted := 0
	var wg sync.WaitGroup
	for range 10 {
		wg.Go(func() {
			for range 50 {
				resp, body := upgrade(t, r, "127.0.0.1", client)
				if resp == nil {
					mu.Lock()
					admitted++
					mu.Unlock()
					continue
				}
				if !strings.Contains(body, "connections per client address") {
					require.Contains(t, body, handshakeRefusal)
					return
				}
			}
			t.Errorf("never refused for the rate")
		})
	}
	wg.Wait()
	require.Equal(t, burst, admitted, "connections admitted at once")

	waitForNoConnections(t, r)
	resp, body := upgrade(t, r, "127.0.0.1", client)
	refusedForRate(t, resp, body, "past the burst")

	resp, body = upgrade(t, r, "127.0.0.1", "203.0.113.2")
	require.Nil(t, resp, "another address: %s", body)

	for i := range burst {
		resp, body = upgrade(t, r, "127.0.0.1", fmt.Sprintf("2001:db8:7:7::%x", i+1))
		require.Nil(t, resp, "IPv6 connection %d: %s", i, body)
	}
	waitForNoConnections(t, r)
	resp, body = upgrade(t, r, "127.0.0.1", "2001:db8:7:7:ffff::1")
	refusedForRate(t, resp, body, "another address of the same /64")

	// 127.0.0.2 is not a trusted proxy: its header names nobody.
	for i := range burst {
		resp, body = upgrade(t, r, "127.0.0.2", fmt.Sprintf("198.51.100.%d", i+1))
		require.Nil(t, resp, "direct connection %d: %s", i, body)
	}
	waitForNoConnections(t, r)
	resp, body = upgrade(t, r, "127.0.0.2", "198.51.100.99")
	refusedForRate(t, resp, body, "a direct client naming a new address")

	clk.advance(time.Second)
	resp, body = upgrade(t, r, "127.0.0.1", client)
	require.Nil(t, resp, "a second later: %s", body)
	waitForNoConnections(t, r)
	resp, body = upgrade(t, r, "127.0.0.1", client)
	refusedForRate(t, resp, body, "one more, and no more")

	// A connection refused by the per-address cap spends no token: the
	// address holds all five of its connections when a token comes. (The
	// racing dialers above may have met the cap too.)
	refusals := r.Server.Metrics().ConnsRefused
	capRefusals := testutil.ToFloat64(refusals.WithLabelValues("address"))
	clk.advance(burst * time.Second)
	var held []*websocket.Conn
	for range burst {
		ws, err := dialFrom(t, r, "127.0.0.1", http.Header{"X-Forwarded-For": {client}})
		require.NoError(t, err)
		held = append(held, ws)
	}
	clk.advance(time.Second)
	resp, body = upgrade(t, r, "127.0.0.1", client)
	require.NotNil(t, resp)
	require.Contains(t, body, "rate-limited: at most 5 connections per client address")
	held[0].CloseNow()
	require.Eventually(t, func() bool { return connections(r) == burst-1 }, relaytest.Patience, 5*time.Millisecond)
	resp, body = upgrade(t, r, "127.0.0.1", client)
	require.Nil(t, resp, "the token the cap's refusal left: %s", body)

	require.Equal(t, 4.0+10, testutil.ToFloat64(refusals.WithLabelValues("handshake_rate")), "the ten racing dialers' refusals and four more")
	require.Equal(t, capRefusals+1, testutil.ToFloat64(refusals.WithLabelValues("address")))
}

// An address's bucket is forgotten once it has refilled: a hundred
// addresses that each opened a connection are remembered until their
// buckets are full again (a second later, at one a second), then the
// next new connection finds only the buckets not yet full. (The buckets
// are also bounded in number, least recently used out first:
// TestHandshakeBucketsAreBoundedInNumber.)
// Mutations killed: buckets forgotten only past the bound (102 kept, not
// 2); a bucket forgotten before it is full (1 kept, not 101).
func TestHandshakeBucketsAreForgottenOnceRefilled(t *testing.T) {
	t.Parallel()
	clk := &stoppedClock{now: time.Now()}
	r := relaytest.StartWith(t, dbtest.Pool(t), []relay.Option{relay.WithClock(clock.Stub(clk.at))}, func(c *config.Config) {
		c.MaxConnectionsPerAddr = 2
		c.HandshakesPerSecond = 1
		c.TrustedProxies = mustPrefixes(t, "127.0.0.1")
	})
	for i := range 100 {
		resp, body := upgrade(t, r, "127.0.0.1", fmt.Sprintf("203.0.113.%d", i+1))
		require.Nil(t, resp, body)
	}
	require.Equal(t, 100, r.Server.HandshakeAddresses())

	clk.advance(time.Second / 2)
	resp, body := upgrade(t, r, "127.0.0.1", "198.51.100.1")
	require.Nil(t, resp, body)
	require.Equal(t, 101, r.Server.HandshakeAddresses(), "buckets half refilled are kept")

	clk.advance(time.Second / 2)
	resp, body = upgrade(t, r, "127.0.0.1", "198.51.100.2")
	require.Nil(t, resp, body)
	require.Equal(t, 2, r.Server.HandshakeAddresses(), "the hundred full buckets are gone; the last two are kept")
}

// An address past its handshake bucket, or holding all its connections,
// is refused before its request's host is looked up: the lookup, a
// database read, was most of what a refusal cost the relay, and a client
// reconnecting in a loop made one per attempt. A request the lookup
// refuses (no community at its host) spends no token: the bucket counts
// handshakes. The lookups are counted by the statement timer, which times
// each one's statement; the clock stands still, so nothing refills.
// Mutations killed: no look at the bucket before the lookup (the refused
// upgrade looks its host up); a look at the bucket alone, not the
// connection caps (the upgrade refused by the per-address cap looks its
// host up); the look taking a token, whether admit takes one again or
// not (the unknown hosts spend the burst: the third is refused, not
// answered 404).
func TestRefusedHandshakesAreNotLookedUp(t *testing.T) {
	t.Parallel()
	const burst = 2
	clk := &stoppedClock{now: time.Now()}
	pool := dbtest.PoolOn(t, dbtest.URL(t), 0, func(c *pgxpool.Config) { c.ConnConfig.Tracer = relay.NewStatementTimer() })
	r := relaytest.StartWith(t, pool, []relay.Option{relay.WithClock(clock.Stub(clk.at))}, func(c *config.Config) {
		c.MaxConnectionsPerAddr = burst
		c.HandshakesPerSecond = 1
		c.TrustedProxies = mustPrefixes(t, "127.0.0.1")
	})
	lookups := func() uint64 {
		var m dto.Metric
		require.NoError(t, r.Server.Metrics().DBQuery.WithLabelValues("CommunityResolveServing").(prometheus.Metric).Write(&m))
		return m.GetHistogram().GetSampleCount()
	}
	const client = "203.0.113.1"

	before := lookups()
	for range burst + 1 {
		resp, body := upgradeAt(t, r, "nobody.example", "127.0.0.1", client)
		require.NotNil(t, resp, "admitted at a host no community is served at")
		require.Equal(t, http.StatusNotFound, resp.StatusCode, body)
	}
	require.Equal(t, before+burst+1, lookups(), "each unknown host looked up")

	for i := range burst {
		resp, body := upgrade(t, r, "127.0.0.1", client)
		require.Nil(t, resp, "connection %d of the burst the unknown hosts left whole: %s", i, body)
	}
	waitForNoConnections(t, r)
	looked := lookups()
	resp, body := upgrade(t, r, "127.0.0.1", client)
	refusedForRate(t, resp, body, "past the burst")
	require.Equal(t, looked, lookups(), "a refused upgrade looked up")
	resp, body = upgradeAt(t, r, "nobody.example", "127.0.0.1", client)
	refusedForRate(t, resp, body, "past the burst, at an unknown host")
	require.Equal(t, looked, lookups(), "a refused upgrade looked up")

	// Every connection the address may hold, then a token to spare: the
	// per-address cap refuses, before the lookup too.
	clk.advance(burst * time.Second)
	for range burst {
		_, err := dialFrom(t, r, "127.0.0.1", http.Header{"X-Forwarded-For": {client}})
		require.NoError(t, err)
	}
	clk.advance(time.Second)
	looked = lookups()
	resp, body = upgrade(t, r, "127.0.0.1", client)
	require.NotNil(t, resp, "admitted past the connection cap")
	require.Equal(t, http.StatusTooManyRequests, resp.StatusCode, body)
	require.Contains(t, body, "rate-limited: at most 2 connections per client address")
	require.Equal(t, looked, lookups(), "an upgrade refused by the connection cap looked up")
}

// Upgrades from one address that race each other may all pass the look at
// its bucket and its connections before any of them is admitted: here
// each waits in its host lookup, held, until all six have looked. The
// look is a shortcut for the refusals, never the bound: admit, which
// takes the token and counts the connection under one lock, lets in one
// for the one token left, then, with tokens to spare, one for the one
// connection left. The clock stands still, so nothing refills meanwhile.
// Mutations killed: admit trusting the look on the bucket (Allow's
// refusal ignored: more than one of the six admitted on one token);
// admit trusting the look on the connections (the per-address cap not
// checked again: three of the six admitted, one per token, past the cap).
func TestUpgradesRacingPastTheLookAreStillBounded(t *testing.T) {
	t.Parallel()
	const perAddr, racing = 3, 6
	clk := &stoppedClock{now: time.Now()}
	held, r, _ := relayWithHeldStatement(t, "CommunityResolveServing", []relay.Option{relay.WithClock(clock.Stub(clk.at))}, func(c *config.Config) {
		c.MaxConnectionsPerAddr = perAddr
		c.HandshakesPerSecond = 1
	})
	const client = "203.0.113.9"
	others := connections(r) // the publisher's
	// race sends racing upgrades from client at once, holds the host
	// lookup until every one has looked at the bucket and joined it, and
	// returns the connections admitted (kept open) and the refusals' bodies.
	race := func() (admitted int, refusals []string) {
		t.Helper()
		joined := r.Server.HostLookupsJoined()
		release := held.start(t)
		var mu sync.Mutex
		var wg sync.WaitGroup
		for range racing {
			wg.Go(func() {
				ws, body, err := holdFrom(t, r, client)
				mu.Lock()
				defer mu.Unlock()
				if err != nil {
					t.Errorf("no HTTP answer: %v", err)
					return
				}
				if ws != nil {
					admitted++
					return
				}
				refusals = append(refusals, body)
			})
		}
		select {
		case <-held.entered:
		case <-time.After(relaytest.Patience):
			t.Fatal("no lookup reached the database")
		}
		require.Eventually(t, func() bool { return r.Server.HostLookupsJoined() == joined+racing-1 }, relaytest.Patience, 5*time.Millisecond,
			"every racing upgrade past the look, waiting for the lookup")
		release()
		wg.Wait()
		return admitted, refusals
	}

	// The burst spent, then a second: one token.
	for range perAddr {
		resp, body := upgrade(t, r, "127.0.0.1", client)
		require.Nil(t, resp, body)
	}
	require.Eventually(t, func() bool { return connections(r) == others }, relaytest.Patience, 5*time.Millisecond)
	clk.advance(time.Second)
	admitted, refusals := race()
	require.Equal(t, 1, admitted, "upgrades admitted on one token: %q", refusals)
	for _, body := range refusals {
		require.Contains(t, body, handshakeRefusal)
	}

	// The racer admitted holds one of the three connections and one more
	// is opened; then the bucket is full again: one connection left, three
	// tokens.
	clk.advance(perAddr * time.Second)
	ws, body, err := holdFrom(t, r, client)
	require.NoError(t, err)
	require.NotNil(t, ws, body)
	require.Eventually(t, func() bool { return connections(r) == others+perAddr-1 }, relaytest.Patience, 5*time.Millisecond)
	clk.advance(perAddr * time.Second)
	admitted, refusals = race()
	require.Equal(t, 1, admitted, "upgrades admitted for one connection left: %q", refusals)
	for _, body := range refusals {
		require.Contains(t, body, "rate-limited: at most 3 connections per client address")
	}
	require.Eventually(t, func() bool { return connections(r) == others+perAddr }, relaytest.Patience, 5*time.Millisecond)
}

// holdFrom opens a WebSocket to r's home community as client behind the
// trusted loopback proxy and keeps it open until the test ends; refused,
// it returns the relay's answer instead.
func holdFrom(t *testing.T, r *relaytest.Relay, client string) (ws *websocket.Conn, refusal string, err error) {
	httpClient := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
	ctx, cancel := context.WithTimeout(context.Background(), relaytest.Patience)
	defer cancel()
	ws, resp, err := websocket.Dial(ctx, r.URL, &websocket.DialOptions{Host: r.Host, HTTPClient: httpClient, HTTPHeader: http.Header{"X-Forwarded-For": {client}}})
	if err == nil {
		t.Cleanup(func() { ws.CloseNow() })
		return ws, "", nil
	}
	if resp == nil {
		return nil, "", err
	}
	raw, _ := io.ReadAll(resp.Body)
	return nil, string(raw), nil
}

// relayWithAHandshakeBucketOfOne is a relay behind a proxy at 127.0.0.1
// that lets each address one connection and one handshake a second, on a
// clock that stands still, so a spent handshake token never comes back.
func relayWithAHandshakeBucketOfOne(t *testing.T) *relaytest.Relay {
	t.Helper()
	clk := &stoppedClock{now: time.Now()}
	return relaytest.StartWith(t, dbtest.Pool(t), []relay.Option{relay.WithClock(clock.Stub(clk.at))}, func(c *config.Config) {
		c.MaxConnectionsPerAddr = 1
		c.HandshakesPerSecond = 1
		c.TrustedProxies = mustPrefixes(t, "127.0.0.1")
	})
}

// upgradeRequest is a method request to r's WebSocket path asking to
// upgrade ("Upgrade: websocket"), forwarded by the proxy for client; the
// caller adds the rest of the handshake's headers.
func upgradeRequest(t *testing.T, r *relaytest.Relay, method, client string) *http.Request {
	t.Helper()
	req, err := http.NewRequest(method, "http"+strings.TrimPrefix(r.URL, "ws"), nil)
	require.NoError(t, err)
	req.Host = r.Host
	req.Header.Set("X-Forwarded-For", client)
	req.Header.Set("Upgrade", "websocket")
	return req
}

// Only a GET can upgrade to a WebSocket. A HEAD or a POST asking to is
// refused with 405, Allow: GET and the JSON error, before it is admitted:
// it took a handshake token before, then failed in the upgrade, so at a
// bucket of one such a request refused the next real client's upgrade.
// The clock stands still, so nothing refills.
// Mutation killed: wantsWebSocket taking every method but OPTIONS, as it
// did (the HEAD spends the one token: the real client is refused for the
// rate).
func TestOnlyAGETSpendsAHandshakeToken(t *testing.T) {
	t.Parallel()
	r := relayWithAHandshakeBucketOfOne(t)
	const client = "203.0.113.7"
	type answer struct {
		method, body string
		resp         *http.Response
	}
	var answers []answer
	for _, method := range []string{http.MethodHead, http.MethodPost, http.MethodPut} {
		req := upgradeRequest(t, r, method, client)
		req.Header.Set("Connection", "Upgrade")
		req.Header.Set("Sec-WebSocket-Version", "13")
		req.Header.Set("Sec-WebSocket-Key", "dGhlIHNhbXBsZSBub25jZQ==")
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		raw, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		answers = append(answers, answer{method, string(raw), resp})
	}
	resp, body := upgrade(t, r, "127.0.0.1", client)
	require.Nil(t, resp, "the real client's upgrade after the HEAD, the POST and the PUT: %s", body)
	require.Zero(t, testutil.ToFloat64(r.Server.Metrics().ConnsRefused.WithLabelValues("handshake_rate")))

	for _, a := range answers {
		require.Equal(t, http.StatusMethodNotAllowed, a.resp.StatusCode, "%s: %s", a.method, a.body)
		require.Equal(t, "GET", a.resp.Header.Get("Allow"), a.method)
		require.Equal(t, "application/json", a.resp.Header.Get("Content-Type"), a.method)
		if a.method != http.MethodHead {
			require.JSONEq(t, `{"error":"invalid: a WebSocket upgrade must be a GET request"}`, a.body, a.method)
		}
	}

	waitForNoConnections(t, r)
	resp, body = upgrade(t, r, "127.0.0.1", client)
	refusedForRate(t, resp, body, "the bucket of one, spent by the real client")
}

// A GET asking to upgrade that the WebSocket handshake cannot complete (no
// Sec-WebSocket-Key, a key that is not 16 bytes, another protocol version,
// no Connection: Upgrade) is refused with 400 and the JSON error naming
// what is missing, before its address's bucket is touched: it took a
// handshake token before, then the library refused it, so at a bucket of
// one such a request refused the next real client's upgrade. The clock
// stands still, so nothing refills.
// Mutation killed: refusingUnadmittable without its handshakeFault check
// (each broken upgrade is admitted, spends the one token and is refused by
// the library: the real client is refused for the rate, and the answers
// are the library's plain-text ones).
func TestAnUpgradeThatCannotCompleteSpendsNoHandshakeToken(t *testing.T) {
	t.Parallel()
	r := relayWithAHandshakeBucketOfOne(t)
	const client = "203.0.113.8"
	const goodKey = "dGhlIHNhbXBsZSBub25jZQ=="
	for _, tc := range []struct {
		name, connection, version, key, reason string
	}{
		{"no key", "Upgrade", "13", "", "invalid: a WebSocket upgrade needs exactly one Sec-WebSocket-Key header"},
		{"short key", "Upgrade", "13", "c2hvcnQ=", "invalid: Sec-WebSocket-Key must be 16 bytes in base64"},
		{"version 8", "Upgrade", "8", goodKey, "invalid: unsupported WebSocket version; only 13 is supported"},
		{"no Connection: Upgrade", "", "13", goodKey, "invalid: a WebSocket upgrade needs a Connection header naming Upgrade"},
	} {
		req := upgradeRequest(t, r, http.MethodGet, client)
		for header, value := range map[string]string{"Connection": tc.connection, "Sec-WebSocket-Version": tc.version, "Sec-WebSocket-Key": tc.key} {
			if value != "" {
				req.Header.Set(header, value)
			}
		}
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		raw, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		require.Equal(t, http.StatusBadRequest, resp.StatusCode, "%s: %s", tc.name, raw)
		require.Equal(t, "application/json", resp.Header.Get("Content-Type"), tc.name)
		require.Equal(t, "13", resp.Header.Get("Sec-WebSocket-Version"), tc.name)
		require.JSONEq(t, fmt.Sprintf(`{"error":%q}`, tc.reason), string(raw), tc.name)
	}
	resp, body := upgrade(t, r, "127.0.0.1", client)
	require.Nil(t, resp, "the real client's upgrade after the broken ones: %s", body)
	require.Zero(t, testutil.ToFloat64(r.Server.Metrics().ConnsRefused.WithLabelValues("handshake_rate")))

	waitForNoConnections(t, r)
	resp, body = upgrade(t, r, "127.0.0.1", client)
	refusedForRate(t, resp, body, "the bucket of one, spent by the real client")
}

// The upgrades real clients send pass handshakeFault as they pass the
// WebSocket library: a browser's "Connection: keep-alive, Upgrade"
// (Firefox), the Connection header split over two lines (as some proxies
// forward it), header names and values in other cases and a key with
// spaces around it. Each is sent as raw bytes on a TCP connection and must
// be answered 101 with the key's Sec-WebSocket-Accept: a check stricter
// than the library's refuses real clients with 400 before they ever reach
// it, and go-nostr and nostr-tools (which send "Connection: Upgrade") would
// not notice.
// Mutation killed: handshakeFault requiring the Connection header to be
// exactly "Upgrade" (strings.EqualFold(r.Header.Get("Connection"),
// "upgrade")): the browser's and the split header's upgrades are refused 400.
func TestUpgradesRealClientsSendPassTheHandshakeCheck(t *testing.T) {
	t.Parallel()
	r := relaytest.Start(t)
	const key = "dGhlIHNhbXBsZSBub25jZQ=="
	const accept = "s3pPLMBiTxaQ9kYGzzhZRbK+xOo=" // RFC 6455 1.3's answer to key
	for _, tc := range []struct{ name, headers string }{
		{"Firefox", "User-Agent: Mozilla/5.0 (X11; Linux x86_64; rv:133.0) Gecko/20100101 Firefox/133.0\r\n" +
			"Accept: */*\r\nSec-WebSocket-Version: 13\r\nOrigin: https://client.example\r\n" +
			"Sec-WebSocket-Extensions: permessage-deflate\r\nSec-WebSocket-Key: " + key + "\r\n" +
			"Connection: keep-alive, Upgrade\r\nUpgrade: websocket\r\n"},
		{"Connection over two lines", "Connection: keep-alive\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n" +
			"Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: " + key + "\r\n"},
		{"other cases, a padded key", "connection: upgrade\r\nupgrade: WebSocket\r\n" +
			"sec-websocket-version: 13\r\nsec-websocket-key:   " + key + "  \r\n"},
	} {
		conn, err := net.Dial("tcp", strings.TrimPrefix(r.URL, "ws://"))
		require.NoError(t, err, tc.name)
		require.NoError(t, conn.SetDeadline(time.Now().Add(relaytest.Patience)))
		_, err = io.WriteString(conn, "GET / HTTP/1.1\r\nHost: "+r.Host+"\r\n"+tc.headers+"\r\n")
		require.NoError(t, err, tc.name)
		resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
		require.NoError(t, err, tc.name)
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		require.Equal(t, http.StatusSwitchingProtocols, resp.StatusCode, "%s: %s", tc.name, body)
		require.Equal(t, accept, resp.Header.Get("Sec-WebSocket-Accept"), tc.name)
		conn.Close()
	}
}
