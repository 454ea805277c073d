package relay

import (
	"fmt"
	"math"
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

// A rate lifted beyond any need (an operator's "no limit",
// BUZZ_HANDSHAKES_PER_SECOND=1000000000000000000 or more) is still a rate:
// turned into handshakes a minute unguarded, it wrapped around to a
// negative rate, and every address past its burst was refused for good.
// Mutation killed: HandshakesPerSecond multiplied by 60 without a bound
// (the second handshake, a second later, refused).
func TestHandshakeRateLiftedBeyondNeedStillRefills(t *testing.T) {
	cfg := config.Default()
	cfg.MaxConnectionsPerAddr = 1
	cfg.HandshakesPerSecond = math.MaxInt / 30
	buckets := newHandshakeBuckets(cfg)
	now := time.Now()
	ok, _ := buckets.Allow(addressCommunity, "addr", now)
	require.True(t, ok)
	ok, retry := buckets.Allow(addressCommunity, "addr", now.Add(time.Second))
	require.True(t, ok, "refused, to retry in %s", retry)
}
