//go:build !race

package relay

import (
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// A live event written to an idle connection where it is published
// allocates nothing: fan-out to 1,000 subscribers would otherwise allocate
// a thousand times per event. The client reads nothing meanwhile: the
// deliveries measured fit in its socket's buffer, so every one is written
// on the spot. (Not under -race, which allocates on its own.)
// Mutation killed: the socket write handed a closure made per call (three
// allocations per delivery: it and the two results it sets).
func TestLiveEventToAnIdleConnectionAllocatesNothing(t *testing.T) {
	c, _ := acceptRawClient(t)
	ev := fmt.Appendf(nil, `{"id":"%064d","content":"%s"}`, 1, strings.Repeat("lorem ", 20))
	require.True(t, c.EnqueueEvent("live", ev), "warm: the pools hold a buffer")
	before := c.sock.socketWrites()
	allocs := testing.AllocsPerRun(20, func() {
		if !c.EnqueueEvent("live", ev) {
			t.Fatal("not queued")
		}
	})
	require.Equal(t, 21, c.sock.socketWrites()-before, "each written on the spot (AllocsPerRun runs once more to warm)")
	require.Zero(t, allocs, "allocations per delivery")
}
