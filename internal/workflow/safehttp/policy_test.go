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
