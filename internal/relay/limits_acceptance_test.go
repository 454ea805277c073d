package relay_test

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"runtime"
	"syscall"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/buzzrelay/buzz/internal/config"
	"github.com/buzzrelay/buzz/internal/relaytest"
)

func heapInUse() uint64 {
	runtime.GC()
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapInuse
}

// budgetFilters splits values 64-hex authors over filters of at most
// perFilter values, the shape that pins the most memory per value.
func budgetFilters(values, perFilter int) []any {
	var filters []any
	for values > 0 {
		n := min(values, perFilter)
		authors := make([]string, n)
		for i := range authors {
			var b [32]byte
			_, _ = rand.Read(b[:])
			authors[i] = hex.EncodeToString(b[:])
		}
		filters = append(filters, map[string]any{"authors": authors, "limit": 0})
		values -= n
	}
	return filters
}

// BenchmarkConnectionMemory reports the heap one authenticated connection
// holds with the default limits: idle, and with its open subscriptions (32)
// holding the whole filter-value budget. Client and relay share the
// process, so the figure covers both ends of each socket; the difference
// between the two cases is what the subscriptions pin on the relay.
func BenchmarkConnectionMemory(b *testing.B) {
	for _, subscribed := range []bool{false, true} {
		name := "idle"
		if subscribed {
			name = "filter-budget"
		}
		b.Run(name, func(b *testing.B) {
			def := config.Default()
			r := relaytest.Start(b)
			perSub := def.MaxFilterValues / def.MaxSubscriptions
			open := func() {
				c := r.Dial(b, "")
				c.Auth(nil)
				if !subscribed {
					return
				}
				for s := range def.MaxSubscriptions {
					parts := append([]any{"REQ", fmt.Sprint("s", s)}, budgetFilters(perSub, perSub/def.MaxFilters+1)...)
					c.Send(parts...)
					c.Expect("EOSE")
				}
			}
			open() // first use: key tables, pools and caches are not per connection
			before := heapInUse()
			for range b.N {
				open()
			}
			b.ReportMetric(float64(heapInUse()-before)/float64(b.N), "heap-bytes/conn")
			if subscribed {
				b.ReportMetric(float64(perSub*def.MaxSubscriptions), "filter-values/conn")
			}
		})
	}
}

// raiseFileLimit lifts the soft descriptor limit toward want (each socket
// costs two descriptors on loopback) and returns what is available.
func raiseFileLimit(t *testing.T, want uint64) uint64 {
	var lim syscall.Rlimit
	require.NoError(t, syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim))
	if lim.Cur < want {
		lim.Cur = min(want, lim.Max)
		_ = syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim)
		require.NoError(t, syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim))
	}
	return lim.Cur
}

// 2,000 idle unauthenticated sockets from one address: the per-address
// cap refuses most before the upgrade, the AUTH deadline closes the rest,
// and an authenticated client is served throughout.
func TestTwoThousandIdleUnauthenticatedSockets(t *testing.T) {
	const sockets = 2000
	fds := raiseFileLimit(t, 3*sockets+512)
	require.GreaterOrEqual(t, fds, uint64(2*sockets+256), "descriptor limit too low for this test")
	def := config.Default()
	r := relaytest.Start(t, func(c *config.Config) {
		c.MaxConnectionsPerAddr = def.MaxConnectionsPerAddr
		// Longer than the dial loop below takes on a loaded machine (over
		// 3 s seen): a socket closed mid-loop would free a slot and let one
		// more in than the cap.
		c.AuthTimeout = 10 * time.Second
	})
	authed := r.Dial(t, "")
	authed.Auth(nil)

	before := heapInUse()
	admitted, refused := 0, 0
	var idle []*websocket.Conn
	for range sockets {
		ws, err := dialFrom(t, r, "127.0.0.1", nil)
		if err != nil {
			require.ErrorContains(t, err, "429")
			refused++
			continue
		}
		admitted++
		idle = append(idle, ws)
	}
	held := heapInUse()
	t.Logf("2,000 idle sockets: %d admitted, %d refused (cap %d per address); heap %d KiB -> %d KiB while held (%.1f KiB per admitted socket)",
		admitted, refused, def.MaxConnectionsPerAddr, before>>10, held>>10, float64(held-before)/1024/float64(max(admitted, 1)))
	// A loop slower than the AUTH deadline (18 s seen on a loaded machine)
	// sees sockets closed by it, each freeing a slot for one more.
	timedOut := int(testutil.ToFloat64(r.Server.Metrics().AuthTimeouts))
	require.GreaterOrEqual(t, admitted, def.MaxConnectionsPerAddr-1, "the authenticated client holds one slot")
	require.LessOrEqual(t, admitted, def.MaxConnectionsPerAddr-1+timedOut, "admitted past the cap (%d closed by the AUTH deadline meanwhile)", timedOut)
	require.True(t, authed.Publish(authed.Sign(1, "served during the flood", nil, 0)).OK)

	// The AUTH deadline closes every admitted idle socket.
	for _, ws := range idle {
		go func() { _ = readUntilClosed(ws, 2*time.Minute) }()
	}
	require.Eventually(t, func() bool { return connections(r) == 1 }, 2*time.Minute, 20*time.Millisecond)
	t.Logf("after the AUTH deadline: heap %d KiB, %d connection open", heapInUse()>>10, int(connections(r)))

	// The authenticated client was served throughout, and the freed slots
	// take new clients.
	require.True(t, authed.Publish(authed.Sign(1, "served after", nil, 0)).OK)
	c := r.Dial(t, "")
	c.Auth(nil)
	require.True(t, c.Publish(c.Sign(1, "a new client", nil, 0)).OK)
}
