package relay

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/buzzrelay/buzz/internal/config"
)

// However many addresses open connections at once (IPv6 /64s, a botnet),
// the relay keeps at most handshakeAddrs handshake buckets: the least
// recently used goes first.
// Mutation killed: the relay's handshake buckets built without a bound
// (handshakeAddrs+1 kept).
func TestHandshakeBucketsAreBoundedInNumber(t *testing.T) {
	buckets := newHandshakeBuckets(config.Default())
	now := time.Now()
	for i := range handshakeAddrs + 1 {
		ok, _ := buckets.Allow(addressCommunity, fmt.Sprintf("addr-%d", i), now)
		require.True(t, ok)
	}
	require.Equal(t, handshakeAddrs, buckets.Len())
}
