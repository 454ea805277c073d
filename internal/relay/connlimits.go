package relay

import (
	"fmt"
	"math"
	"net/http"
	"net/netip"
	"time"

	"github.com/buzzrelay/buzz/internal/config"
)

// admit reserves a WebSocket connection for a client at addr, or says why
// not: 503 when the relay holds MaxConnections, 429 when addr alone holds
// MaxConnectionsPerAddr, 429 with a retry when addr opened connections
// faster than its handshake bucket allows. Refusing before the upgrade
// costs the relay no goroutine, buffer or challenge. Every admitted
// connection is released exactly once (release, or forget once tracked).
func (s *Server) admit(addr string) (status int, reason string, retry time.Duration) {
	addr = addressBucket(addr)
	s.mu.Lock()
	defer s.mu.Unlock()
	if status, reason := s.connectionCapLocked(addr); status != 0 {
		return status, reason, 0
	}
	// Last, so that only a handshake about to happen takes a token.
	if ok, retry := s.handshakes.Allow(addressCommunity, addr, s.now()); !ok {
		return s.handshakeRateRefusal(retry)
	}
	s.admitted.add(addr)
	return 0, "", 0
}

// wouldAdmit says why admit would refuse addr now, taking no token and
// reserving nothing: it is asked before the request's host is looked up,
// so that an address past its bucket or its connections is refused for the
// price of reading its headers, not of a database read. An upgrade it lets
// through is still admitted (or refused) by admit after the lookup, and a
// request the lookup refuses (an unknown host) never reaches admit, so it
// spends no token: the bucket counts handshakes, and such a request costs
// what any plain HTTP request costs.
func (s *Server) wouldAdmit(addr string) (status int, reason string, retry time.Duration) {
	addr = addressBucket(addr)
	s.mu.Lock()
	defer s.mu.Unlock()
	if status, reason := s.connectionCapLocked(addr); status != 0 {
		return status, reason, 0
	}
	if ok, retry := s.handshakes.Peek(addressCommunity, addr, s.now()); !ok {
		return s.handshakeRateRefusal(retry)
	}
	return 0, "", 0
}

// connectionCapLocked says why addr may not hold one more connection: the
// relay is shutting down or holds MaxConnections, or addr holds
// MaxConnectionsPerAddr. The caller holds s.mu.
func (s *Server) connectionCapLocked(addr string) (status int, reason string) {
	switch {
	case s.closing:
		return http.StatusServiceUnavailable, "error: relay shutting down"
	case s.admitted.total >= s.cfg.MaxConnections:
		s.metrics.ConnsRefused.WithLabelValues("total").Inc()
		return http.StatusServiceUnavailable, fmt.Sprintf("error: relay is at its limit of %d connections; try again later", s.cfg.MaxConnections)
	case s.admitted.byAddr[addr] >= s.cfg.MaxConnectionsPerAddr:
		s.metrics.ConnsRefused.WithLabelValues("address").Inc()
		return http.StatusTooManyRequests, fmt.Sprintf("rate-limited: at most %d connections per client address", s.cfg.MaxConnectionsPerAddr)
	}
	return 0, ""
}

func (s *Server) handshakeRateRefusal(retry time.Duration) (status int, reason string, _ time.Duration) {
	s.metrics.ConnsRefused.WithLabelValues("handshake_rate").Inc()
	return http.StatusTooManyRequests, fmt.Sprintf("rate-limited: too many new connections from this client address; try again in %s", retry), retry
}

// refuseAdmission answers an upgrade admit or wouldAdmit refused.
func refuseAdmission(w http.ResponseWriter, status int, reason string, retry time.Duration) {
	if retry > 0 {
		w.Header().Set("Retry-After", retryAfterSeconds(retry))
	}
	writeJSON(w, status, map[string]string{"error": reason})
}

// handshakeAddrs bounds the handshake buckets kept; a bucket is forgotten
// anyway once refilled, at most MaxConnectionsPerAddr/HandshakesPerSecond
// after its address's last new connection (5 s by default), so only more addresses
// than this opening connections within that time push one out early,
// which hands that address a full bucket again.
const handshakeAddrs = 10_000

// newHandshakeBuckets bounds the new WebSocket connections of each client
// address: MaxConnectionsPerAddr at once, so every connection an address
// may hold can be opened again together (a relay restart, a network
// change), then HandshakesPerSecond. Each new connection costs the relay an
// upgrade, a challenge and a connection's state, and starts with full
// buckets of messages, pings and AUTH checks: unbounded, a client that
// reconnected in a loop bought those again as fast as it could handshake.
// A rate too large to count a minute of (an operator's "no limit") counts
// as the largest that is: multiplied unbounded, it wrapped negative and
// the buckets never refilled.
func newHandshakeBuckets(cfg config.Config) *TokenBuckets {
	perMinute := min(cfg.HandshakesPerSecond, math.MaxInt/60) * 60
	return NewTokenBuckets(perMinute, cfg.MaxConnectionsPerAddr, handshakeAddrs)
}

// release returns a connection reserved by admit.
func (s *Server) release(addr string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.releaseLocked(addr)
}

func (s *Server) releaseLocked(addr string) {
	s.admitted.remove(addressBucket(addr))
}

// admitUpload reserves one of the uploads the relay receives at once for a
// client at addr, or says why not: 503 when MediaMaxUploads are being
// received, 429 when addr alone sends MediaMaxUploadsPerAddr. Each upload
// spools up to MediaMaxBytes to disk while it is hashed, and the publish
// rate limit counts requests, not bytes or time: without this bound, keys
// that cost nothing could fill the spool directory in parallel. The caller
// calls the release it gets exactly once.
func (s *Server) admitUpload(addr string) (release func(), status int, reason string) {
	return s.admitCounted(&s.uploading, addr, s.cfg.MediaMaxUploads, s.cfg.MediaMaxUploadsPerAddr, "receiving", "uploads")
}

// admitBridge reserves one of the HTTP bridge requests the relay answers at
// once for a client at addr, or says why not: 503 when MaxConnections are
// being answered, 429 when addr alone has MaxConnectionsPerAddr. Any key
// signs a valid request, and each holds its body (up to MaxMessageBytes)
// while it arrives and a /query up to a MiB of answer while the client
// reads it, both for as long as the HTTP timeouts allow: without a count, one
// address could hold as many as it opened. They are counted apart from the
// WebSocket connections, with the same caps, so a client's sockets do not
// take its bridge requests' places. The caller calls the release it gets
// exactly once.
func (s *Server) admitBridge(addr string) (release func(), status int, reason string) {
	return s.admitCounted(&s.bridging, addr, s.cfg.MaxConnections, s.cfg.MaxConnectionsPerAddr, "answering", "bridge requests")
}

// admitWebhook reserves one of the workflow webhook calls the relay
// answers at once for a client at addr, or says why not: 503 when
// MaxConnections are being answered, 429 when addr alone has
// MaxConnectionsPerAddr. A call needs no key and reads a body (up to
// WebhookMaxBytes) before any check, for as long as the HTTP timeouts
// allow, so it is counted like a bridge request, with the same caps, but
// in a count of its own: the integrations that call webhooks often send
// from a few shared addresses, and sharing the bridge's count let them and
// the bridge clients behind those addresses refuse each other. The caller
// calls the release it gets exactly once.
func (s *Server) admitWebhook(addr string) (release func(), status int, reason string) {
	release, status, reason = s.admitCounted(&s.webhookCalls, addr, s.cfg.MaxConnections, s.cfg.MaxConnectionsPerAddr, "answering", "webhook calls")
	switch status {
	case http.StatusServiceUnavailable:
		s.metrics.WebhookCallsRefused.WithLabelValues("total").Inc()
	case http.StatusTooManyRequests:
		s.metrics.WebhookCallsRefused.WithLabelValues("address").Inc()
	}
	return release, status, reason
}

// admitCounted reserves one place in counts for a client at addr, or says
// why not: 503 when limit places are held in all, 429 when addr alone
// holds perAddr. what names the places in the refusal ("the relay is
// <doing> its limit of N <what>").
func (s *Server) admitCounted(counts *addressCounts, addr string, limit, perAddr int, doing, what string) (release func(), status int, reason string) {
	addr = addressBucket(addr)
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case counts.total >= limit:
		return nil, http.StatusServiceUnavailable, fmt.Sprintf("error: the relay is %s its limit of %d %s; try again shortly", doing, limit, what)
	case counts.byAddr[addr] >= perAddr:
		return nil, http.StatusTooManyRequests, fmt.Sprintf("rate-limited: at most %d %s at once per client address; wait for one to finish", perAddr, what)
	}
	counts.add(addr)
	return func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		counts.remove(addr)
	}, 0, ""
}

// addressCounts counts things held (connections, uploads) in all and per
// address bucket; the Server's mu guards it.
type addressCounts struct {
	total  int
	byAddr map[string]int
}

func (c *addressCounts) add(addr string) {
	if c.byAddr == nil {
		c.byAddr = map[string]int{}
	}
	c.total++
	c.byAddr[addr]++
}

// remove drops addr's entry at zero, so a long-lived relay does not keep
// every address it ever saw.
func (c *addressCounts) remove(addr string) {
	c.total--
	if n := c.byAddr[addr] - 1; n > 0 {
		c.byAddr[addr] = n
	} else {
		delete(c.byAddr, addr)
	}
}

// addressBucket is what the per-address cap counts: an IPv4 address, or the
// /64 prefix of an IPv6 one. A single IPv6 subscriber is routinely given a
// whole /64 and can pick any address in it for each connection, so counting
// exact IPv6 addresses would not bound one client at all.
func addressBucket(addr string) string {
	ip, err := netip.ParseAddr(addr)
	if err != nil || !ip.Is6() || ip.Is4In6() {
		return addr
	}
	prefix, _ := ip.Prefix(64)
	return prefix.String()
}
