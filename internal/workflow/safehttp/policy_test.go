package safehttp

import (
	"net/netip"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestPublicAddr(t *testing.T) {
	t.Parallel()
	cases := []struct {
		addr   string
		public bool
	}{
		{"93.184.215.14", true},
		{"8.8.8.8", true},
		{"1.1.1.1", true},
		{"2606:4700:4700::1111", true},
		{"2a00:1450:4001:82f::200e", true},
		{"::ffff:8.8.8.8", true}, // mapped public stays public

		{"127.0.0.1", false},
		{"127.255.255.254", false},
		{"10.1.2.3", false},
		{"172.16.0.1", false},
		{"172.31.255.255", false},
		{"192.168.1.1", false},
		{"169.254.169.254", false}, // cloud metadata
		{"169.254.0.1", false},
		{"100.64.0.1", false}, // carrier-grade NAT
		{"100.127.255.255", false},
		{"0.0.0.0", false},
		{"0.1.2.3", false},
		{"224.0.0.1", false},
		{"239.255.255.250", false},
		{"255.255.255.255", false},
		{"240.0.0.1", false},
		{"192.0.0.8", false},
		{"192.0.2.1", false},
		{"198.18.0.1", false},
		{"198.51.100.1", false},
		{"203.0.113.1", false},
		{"::1", false},
		{"::", false},
		{"::127.0.0.1", false}, // IPv4-compatible form
		{"::ffff:127.0.0.1", false},
		{"::ffff:169.254.169.254", false},
		{"::ffff:10.0.0.1", false},
		{"fc00::1", false},
		{"fd12:3456:789a::1", false}, // unique local
		{"fe80::1", false},
		{"fe80::1%eth0", false},
		{"fec0::1", false},
		{"ff02::1", false},
		{"64:ff9b::a9fe:a9fe", false}, // NAT64 of 169.254.169.254
		{"2001::1", false},            // Teredo
		{"2002:7f00:1::1", false},     // 6to4 of 127.0.0.1
		{"2001:db8::1", false},
		{"100::1", false},
		{"4000::1", false}, // outside global unicast
	}
	for _, tc := range cases {
		t.Run(tc.addr, func(t *testing.T) {
			t.Parallel()
			require.Equal(t, tc.public, PublicAddr(netip.MustParseAddr(tc.addr)))
		})
	}
	require.False(t, PublicAddr(netip.Addr{}), "the zero address is not public")
}

// Networks the operator trusts admit their addresses and nothing else; a
// cloud metadata address needs an entry naming exactly it. Mutations
// killed: dropping the metadata rule lets 169.254.169.254 through a trusted
// 169.254.0.0/16 or 0.0.0.0/0; matching trusted nets before unmapping
// misses ::ffff:10.0.0.1.
func TestAllowedWithTrustedNets(t *testing.T) {
	t.Parallel()
	nets := func(ss ...string) []netip.Prefix {
		var out []netip.Prefix
		for _, s := range ss {
			out = append(out, netip.MustParsePrefix(s))
		}
		return normalizePrefixes(out)
	}
	cases := []struct {
		trusted []netip.Prefix
		addr    string
		allowed bool
	}{
		{nil, "8.8.8.8", true},
		{nil, "127.0.0.1", false},
		{nets("10.1.0.0/16"), "10.1.2.3", true},
		{nets("10.1.0.0/16"), "::ffff:10.1.2.3", true},
		{nets("10.1.0.0/16"), "10.2.0.1", false},
		{nets("10.1.0.0/16"), "127.0.0.1", false},
		{nets("10.1.0.0/16"), "8.8.8.8", true}, // public stays allowed
		{nets("::ffff:10.0.0.0/104"), "10.0.0.1", true},
		{nets("127.0.0.1/32"), "127.0.0.1", true},
		{nets("127.0.0.1/32"), "127.0.0.2", false},
		{nets("fd00::/8"), "fd12::1", true},
		{nets("169.254.0.0/16"), "169.254.1.1", true},
		{nets("169.254.0.0/16"), "169.254.169.254", false},
		{nets("0.0.0.0/0"), "169.254.169.254", false},
		{nets("0.0.0.0/0"), "::ffff:169.254.169.254", false},
		{nets("0.0.0.0/0"), "100.100.100.200", false},
		{nets("::/0"), "fd00:ec2::254", false},
		{nets("169.254.169.254/32"), "169.254.169.254", true},
		{nets("169.254.169.254/32"), "169.254.170.2", false},
		{nets("fd00:ec2::254/128"), "fd00:ec2::254", true},
	}
	for _, tc := range cases {
		require.Equal(t, tc.allowed, Allowed(netip.MustParseAddr(tc.addr), tc.trusted), "%s with trusted %v", tc.addr, tc.trusted)
	}
	require.False(t, Allowed(netip.Addr{}, nets("0.0.0.0/0")), "the zero address is never allowed")
	client := New(Options{AllowedNets: nets("10.1.0.0/16")})
	require.NoError(t, client.checkDialedAddress("tcp4", "10.1.0.9:443", nil))
	require.Error(t, client.checkDialedAddress("tcp4", "10.2.0.9:443", nil))
}
