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

// metadataAddrs are the cloud instance metadata services: they answer with
// credentials to anyone on the host, so a webhook must never reach them,
// even when the operator trusts a network that contains one.
var metadataAddrs = []netip.Addr{
	netip.MustParseAddr("169.254.169.254"), // AWS, GCP, Azure, OpenStack, DigitalOcean ...
	netip.MustParseAddr("169.254.170.2"),   // AWS ECS task credentials
	netip.MustParseAddr("169.254.170.23"),  // AWS EKS pod identity
	netip.MustParseAddr("100.100.100.200"), // Alibaba Cloud
	netip.MustParseAddr("fd00:ec2::254"),   // AWS over IPv6
	netip.MustParseAddr("fd00:ec2::23"),    // AWS EKS pod identity over IPv6
}

// Allowed reports whether a webhook may be sent to addr: a public unicast
// address, or one inside a trusted network. A cloud metadata address is
// allowed only when a trusted entry is exactly that address (a /32 or
// /128): trusting 169.254.0.0/16 for a link-local service, or 0.0.0.0/0,
// never opens the metadata endpoint by accident.
func Allowed(addr netip.Addr, trusted []netip.Prefix) bool {
	if !addr.IsValid() {
		return false
	}
	addr = addr.Unmap().WithZone("")
	for _, m := range metadataAddrs {
		if addr == m {
			for _, p := range trusted {
				if p.IsSingleIP() && p.Addr() == addr {
					return true
				}
			}
			return false
		}
	}
	if PublicAddr(addr) {
		return true
	}
	for _, p := range trusted {
		if p.Contains(addr) {
			return true
		}
	}
	return false
}

// normalizePrefixes unmaps IPv4-mapped prefixes (::ffff:10.0.0.0/104 is
// 10.0.0.0/8), since addresses are unmapped before they are checked.
func normalizePrefixes(in []netip.Prefix) []netip.Prefix {
	out := make([]netip.Prefix, 0, len(in))
	for _, p := range in {
		if p.Addr().Is4In6() && p.Bits() >= 96 {
			p = netip.PrefixFrom(p.Addr().Unmap(), p.Bits()-96)
		}
		out = append(out, p.Masked())
	}
	return out
}
