package localport

import (
	"fmt"
	"net"
	"testing"

	"github.com/stretchr/testify/require"
)

// A port Free returns is below the kernel's ephemeral range, where no
// outgoing connection or 127.0.0.1:0 listener is given it, and free to
// listen on.
// Mutation killed: Free asking the kernel for 127.0.0.1:0 only (a port in
// the ephemeral range).
func TestFreeIsBelowTheEphemeralRangeAndFree(t *testing.T) {
	low, ok := ephemeralLow()
	require.True(t, ok, "Linux (the relay's and CI's machines) names its ephemeral range in /proc/sys/net/ipv4/ip_local_port_range")
	for range 20 {
		port, err := Free()
		require.NoError(t, err)
		require.GreaterOrEqual(t, port, belowEphemeralFrom)
		require.Less(t, port, low, "below the ephemeral range")
		l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", port))
		require.NoError(t, err, "free to listen on")
		l.Close()
	}
}
