package relay

import (
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/buzzrelay/buzz/internal/nostr"
)

// A client that reads nothing and sends tiny requests cannot make the
// relay queue more replies than the reply budget holds at what each costs:
// a queue entry and an allocation besides its bytes, about 84 bytes for a
// 12-byte EOSE (measured). Weighed by their bytes alone, 87,000 EOSEs fit
// in the default 1 MiB budget and held 6.6 MiB of heap per connection.
// Mutation killed: replyWeight without replyOverhead (78,311 replies were
// left waiting behind the stalled writer, against at most 10,485 here).
func TestTinyRepliesWeighWhatTheyCost(t *testing.T) {
	t.Parallel()
	c, _ := acceptTestConn(t) // the client never reads
	capSendBuffer(t, c, 4096)
	budget := float64(c.srv.cfg.ReplyQueueBytes)
	var sent atomic.Int64
	go func() {
		for range 200_000 {
			if c.send(nostr.EncodeEOSE("s")) != nil {
				return // the test ended
			}
			sent.Add(1)
		}
	}()
	eose := int64(len(nostr.EncodeEOSE("s")))
	require.Eventually(t, func() bool {
		return testutil.ToFloat64(c.srv.metrics.ReplyQueueBytes) > budget-float64(c.replyWeight(nostr.EncodeEOSE("s")))
	}, 30*time.Second, 5*time.Millisecond, "the reply budget fills (%d sent)", sent.Load())
	c.out.mu.Lock()
	waiting := len(c.out.pending)
	c.out.mu.Unlock()
	require.LessOrEqual(t, waiting, int(budget)/100,
		"replies waiting behind the stalled writer (%d-byte EOSEs, %d sent)", eose, sent.Load())
}
