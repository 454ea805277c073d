package relay_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/buzzrelay/buzz/internal/dbtest"
	"github.com/buzzrelay/buzz/internal/relaytest"
)

// A publisher on B goes on publishing while Redis is killed (SIGKILL)
// and started again, without waiting for either relay to notice: before
// the kill, in the instant after it, during the outage, while the relays
// resubscribe, and after. A subscriber on A gets every event exactly once
// (live, or replayed from the database), and one on B, the publisher's
// own relay, every event once too.
// Mutation killed: no catch-up on resubscribing (A never gets the events
// published from the kill until A resubscribed).
func TestCrossRelayStreamThroughARedisRestartArrivesOnce(t *testing.T) {
	t.Parallel()
	redis := dbtest.RedisServer(t)
	relays := relaysOnRedis(t, redis.URL(), 2)
	a, b := relays[0], relays[1]

	onA := a.Dial(t, a.Host)
	onA.Auth(nil)
	onB := b.Dial(t, a.Host)
	onB.Auth(nil)
	publisher := b.Dial(t, a.Host)
	author := publisher.Auth(nil)
	filter := map[string]any{"authors": []string{author.PublicKeyHex()}, "limit": 0}
	for _, c := range []*relaytest.Client{onA, onB} {
		c.Send("REQ", "live", filter)
		c.Expect("EOSE")
	}
	var want []string
	publish := func(phase string, n int) {
		for i := range n {
			ev := publisher.Sign(1, fmt.Sprintf("%s %d", phase, i), nil, 0)
			require.True(t, publisher.Publish(ev).OK)
			want = append(want, ev.ID)
		}
	}
	publish("before", 10)
	redis.Kill()
	publish("at the kill", 10)
	waitRedis(t, "degraded", a, b)
	publish("during", 10)
	require.NoError(t, redis.Restart(t.Context()))
	publish("at the restart", 10)
	waitRedis(t, "connected", a, b)
	publish("after", 10)

	for name, c := range map[string]*relaytest.Client{"subscriber on A": onA, "subscriber on B": onB} {
		got := map[string]int{}
		for range want {
			got[c.Expect("EVENT").Event.ID]++
		}
		c.ExpectSilence(500*time.Millisecond, name+": nothing more")
		for _, id := range want {
			require.Equal(t, 1, got[id], "%s: event %s", name, id)
		}
	}
}
