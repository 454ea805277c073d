//go:build !race

package relay_test

import (
	"runtime"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/buzzrelay/buzz/internal/relaytest"
)

// The goroutine that waits for a connection's next message keeps a shallow
// stack, however deep handling its messages went: handling runs on a
// goroutine of its own. Measured as the stack memory the process holds per
// idle connection after garbage collection (which is when the runtime
// shrinks stacks). Not parallel: it reads process-wide stack memory, which
// parallel tests would move. Not under the race detector either, which
// enlarges every frame: the reader alone then needs a 16 KB stack.
// This guards the figure; whether messages are handled off the reading
// goroutine is checked exactly by TestMessageHandledOffTheReadingGoroutine
// (handling them on it, the stack measured here rises to 10-14 KB, too
// close to tell apart reliably).
func TestIdleConnectionStackStaysShallow(t *testing.T) {
	r := relaytest.Start(t)
	stack := func() uint64 {
		runtime.GC()
		runtime.GC()
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		return ms.StackInuse
	}
	require.Eventually(t, func() bool { relayConn, _ := connectionGoroutines(); return relayConn == 0 }, 30*time.Second, 10*time.Millisecond)
	before := stack()
	const n = 100
	openSubscribers(t, r, n)
	require.Eventually(t, func() bool { relayConn, _ := connectionGoroutines(); return relayConn == n+1 }, 30*time.Second, 10*time.Millisecond)
	perConn := (int64(stack()) - int64(before)) / (n + 1)
	t.Logf("stack per idle connection: %d bytes", perConn)
	require.LessOrEqual(t, perConn, int64(11<<10), "stack held per idle connection")
}
