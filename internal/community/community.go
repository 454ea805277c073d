// Package community binds requests to tenants. A connection's community comes
// from its Host header, resolved once, before any handler runs; the resulting
// Tenant value cannot be built from client input.
package community

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"net/url"
	"strconv"
	"strings"

	"github.com/google/uuid"

	"github.com/buzzrelay/buzz/internal/db"
	"github.com/buzzrelay/buzz/internal/dberr"
)

// ClosedChannel is the PostgreSQL NOTIFY channel on which the database
// announces (with the community's id as payload) that a community's
// deletion fenced it; every relay listens and closes its connections.
const ClosedChannel = "buzz_community_closed"

// ErrUnknownHost is returned for a host that names no serving community:
// unknown, archived, being deleted or deleted. Callers answer 404.
var ErrUnknownHost = errors.New("no community serves this host")

// Tenant is the community a request is bound to. Its fields are private so
// only Resolve (and tests in this package) can make one.
type Tenant struct {
	id   uuid.UUID
	host string
}

// ID is the community's id, the leading key of every tenant table.
func (t Tenant) ID() uuid.UUID { return t.id }

// Host is the community's normalized host.
func (t Tenant) Host() string { return t.host }

// IsZero reports an unbound Tenant.
func (t Tenant) IsZero() bool { return t.id == uuid.Nil }

// FromRow builds a Tenant from a communities row read by a serving lookup.
func FromRow(c db.Community) Tenant { return Tenant{id: c.ID, host: c.Host} }

// Resolve finds the serving community of host, an inbound Host header as
// NormalizeHost returns it. It does not normalize again: NormalizeHost
// drops one trailing dot and one default port, so applied twice it let
// "b.example.." and "b.example:443:443" reach b.example.
func Resolve(ctx context.Context, q *db.Queries, host string) (Tenant, error) {
	if host == "" {
		return Tenant{}, ErrUnknownHost
	}
	row, err := q.CommunityResolveServing(ctx, host)
	if dberr.IsNotFound(err) {
		return Tenant{}, ErrUnknownHost
	}
	if err != nil {
		return Tenant{}, err
	}
	return FromRow(row), nil
}

// Ensure returns the community at host, creating it if needed (start-up
// seeding). When another process inserts the same host at the same moment,
// CommunityEnsure waits for that insert, does nothing, and its select, on
// the statement's older snapshot, finds nothing; a second statement sees
// the committed row.
func Ensure(ctx context.Context, q *db.Queries, host string) (db.CommunityEnsureRow, error) {
	row, err := q.CommunityEnsure(ctx, host)
	if dberr.IsNotFound(err) {
		row, err = q.CommunityEnsure(ctx, host)
	}
	return row, err
}

// NormalizeHost is the one normalization used both when storing
// communities.host and when resolving an inbound Host, so both sides agree:
// trim and lowercase; drop a :443 or :80 suffix (other ports select a
// distinct tenant) and one trailing dot, after the port or before it; collapse the loopback literals
// 127.0.0.1 and [::1] to localhost, keeping any port.
func NormalizeHost(raw string) string {
	h := strings.ToLower(strings.TrimSpace(raw))
	// One dot goes, after the port ("x.example:443.") or before it
	// ("x.example.:443"), so both name "x.example", as "x.example:443" does.
	dotted := strings.HasSuffix(h, ".")
	h = strings.TrimSuffix(h, ".")
	for _, port := range []string{":443", ":80"} {
		if strings.HasSuffix(h, port) {
			h = strings.TrimSuffix(h, port)
			break
		}
	}
	if !dotted {
		h = strings.TrimSuffix(h, ".")
	}
	for _, loopback := range []string{"127.0.0.1", "[::1]"} {
		if h == loopback || strings.HasPrefix(h, loopback+":") {
			h = "localhost" + h[len(loopback):]
			break
		}
	}
	return h
}

// CheckHost says why a normalized host (NormalizeHost's output) is not one
// an HTTP request can carry in its Host header: a DNS name or an IP
// literal (IPv6 in brackets), with an optional port. A community stored
// under anything else could never be reached, yet would keep its host
// reserved for good: an operator who pasted a URL ("https://x.example/")
// or a typo gets the reason instead.
func CheckHost(host string) error {
	if normal := NormalizeHost(host); normal != host {
		// "x.example:443:443" normalizes to "x.example:443", which a request
		// naming it reaches as "x.example": stored, it would be reached only
		// through such spellings.
		return fmt.Errorf("host %q: a request naming it reaches %q; give the host as clients name it (no trailing dot, at most one port)", host, normal)
	}
	if strings.Contains(host, "/") {
		return fmt.Errorf("host %q: want the host alone, such as relay.example.com or relay.example.com:8443, not a URL", host)
	}
	name, port := host, ""
	if i := strings.LastIndexByte(host, ':'); i >= 0 && !strings.HasSuffix(host, "]") {
		name, port = host[:i], host[i+1:]
		if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 || port != strconv.Itoa(n) {
			return fmt.Errorf("host %q: want a port from 1 to 65535 after the colon", host)
		}
	}
	if strings.HasPrefix(name, "[") && strings.HasSuffix(name, "]") {
		if addr, err := netip.ParseAddr(name[1 : len(name)-1]); err != nil || !addr.Is6() {
			return fmt.Errorf("host %q: want an IPv6 address between the brackets", host)
		}
		return nil
	}
	if len(name) == 0 || len(name) > 253 {
		return fmt.Errorf("host %q: want a DNS name or an IP address, such as relay.example.com or relay.example.com:8443", host)
	}
	for _, label := range strings.Split(name, ".") {
		if len(label) == 0 || len(label) > 63 || label[0] == '-' || label[len(label)-1] == '-' ||
			strings.IndexFunc(label, func(r rune) bool { return !(r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '-' || r == '_') }) >= 0 {
			return fmt.Errorf("host %q: want a DNS name or an IP address, such as relay.example.com or relay.example.com:8443 (no scheme, path or spaces)", host)
		}
	}
	return nil
}

// RelayURLAuthority derives the normalized authority of a relay URL such as
// BUZZ_RELAY_URL ("wss://relay.example.com" → "relay.example.com"). It
// returns "" when the URL has no host, and callers treat that as an error.
func RelayURLAuthority(relayURL string) string {
	u, err := url.Parse(strings.TrimSpace(relayURL))
	if err != nil || u.Host == "" {
		return ""
	}
	return NormalizeHost(u.Host)
}
