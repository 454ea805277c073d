package relay

import (
	"net"
	"net/http"
	"net/netip"
	"strings"
)

// clientAddr is the address a request came from, as far as this relay can
// tell: the TCP peer, unless that peer is a configured proxy, in which case
// the nearest X-Forwarded-For hop that is not itself a trusted proxy. A
// client that connects directly cannot choose its own address by sending the
// header, so per-address limits cannot be dodged with it.
func (s *Server) clientAddr(r *http.Request) string {
	peer := peerAddr(r)
	if !s.trustedProxy(peer) {
		return addrString(peer, r.RemoteAddr)
	}
	hops := strings.Split(strings.Join(r.Header.Values("X-Forwarded-For"), ","), ",")
	for i := len(hops) - 1; i >= 0; i-- {
		hop, err := netip.ParseAddr(strings.TrimSpace(hops[i]))
		if err != nil {
			break // a malformed hop: trust nothing before it
		}
		hop = hop.Unmap()
		if !s.trustedProxy(hop) {
			return hop.String()
		}
		peer = hop
	}
	return addrString(peer, r.RemoteAddr)
}

// forwardedProto is the scheme a TLS-terminating proxy says the client used,
// or "" when the request did not come through a trusted proxy.
func (s *Server) forwardedProto(r *http.Request) string {
	if !s.trustedProxy(peerAddr(r)) {
		return ""
	}
	first, _, _ := strings.Cut(r.Header.Get("X-Forwarded-Proto"), ",")
	return strings.ToLower(strings.TrimSpace(first))
}

func (s *Server) trustedProxy(addr netip.Addr) bool {
	if !addr.IsValid() {
		return false
	}
	for _, p := range s.cfg.TrustedProxies {
		if p.Contains(addr) {
			return true
		}
	}
	return false
}

// peerAddr is the TCP peer of r (invalid when RemoteAddr is not ip:port).
func peerAddr(r *http.Request) netip.Addr {
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		host = r.RemoteAddr
	}
	addr, err := netip.ParseAddr(host)
	if err != nil {
		return netip.Addr{}
	}
	return addr.Unmap()
}

func addrString(addr netip.Addr, fallback string) string {
	if addr.IsValid() {
		return addr.String()
	}
	return fallback
}
