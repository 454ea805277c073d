package safehttp

import "net/netip"

// blockedPrefixes are ranges a webhook must never reach: this host, the
// operator's private networks, cloud metadata services, and addresses that
// are not unicast destinations on the public internet at all.
var blockedPrefixes = mustPrefixes(
	// IPv4
	"0.0.0.0/8",       // "this network", including the unspecified address
	"10.0.0.0/8",      // private
	"100.64.0.0/10",   // carrier-grade NAT, often internal in clouds
	"127.0.0.0/8",     // loopback
	"169.254.0.0/16",  // link-local, including 169.254.169.254 metadata
	"172.16.0.0/12",   // private
	"192.0.0.0/24",    // protocol assignments
	"192.0.2.0/24",    // documentation
	"192.88.99.0/24",  // 6to4 relay anycast
	"192.168.0.0/16",  // private
	"198.18.0.0/15",   // benchmarking
	"198.51.100.0/24", // documentation
	"203.0.113.0/24",  // documentation
	"224.0.0.0/4",     // multicast
	"240.0.0.0/4",     // reserved, including broadcast
	// IPv6 (IPv4-mapped addresses are unmapped before the check)
	"::/96",          // unspecified, loopback and the old IPv4-compatible form
	"64:ff9b::/96",   // NAT64: would reach an IPv4 address chosen by the caller
	"64:ff9b:1::/48", // local-use NAT64
	"100::/64",       // discard
	"2001::/32",      // Teredo, embeds an IPv4 address
	"2001:db8::/32",  // documentation
	"2002::/16",      // 6to4, embeds an IPv4 address
	"fc00::/7",       // unique local (private)
	"fe80::/10",      // link-local
	"fec0::/10",      // old site-local
	"ff00::/8",       // multicast
)

// globalUnicastV6 is the only IPv6 range allocated for public unicast.
var globalUnicastV6 = netip.MustParsePrefix("2000::/3")

func mustPrefixes(ss ...string) []netip.Prefix {
	out := make([]netip.Prefix, len(ss))
	for i, s := range ss {
		out[i] = netip.MustParsePrefix(s)
	}
	return out
}

// PublicAddr reports whether addr is a public unicast address a webhook may
// be sent to.
func PublicAddr(addr netip.Addr) bool {
	if !addr.IsValid() {
		return false
	}
	addr = addr.Unmap().WithZone("")
	if addr.Is6() && !globalUnicastV6.Contains(addr) {
		return false
	}
	for _, p := range blockedPrefixes {
		if p.Contains(addr) {
			return false
		}
	}
	return true
}
