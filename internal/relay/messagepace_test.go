package relay_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/buzzrelay/buzz/internal/clock"
	"github.com/buzzrelay/buzz/internal/config"
	"github.com/buzzrelay/buzz/internal/dbtest"
	"github.com/buzzrelay/buzz/internal/relay"
	"github.com/buzzrelay/buzz/internal/relaytest"
)

// A connection's messages are read at MessagesPerSecond, MessageBurstSeconds'
// worth at once: past them the next one waits in the socket, unread and unanswered,
// until the bucket refills, while another connection of the same address
// is answered as before. The clock stands still, so the bucket refills
// only when the test moves it. Mutations killed: the read loop not pacing
// (every CLOSE answered at once: no wait counted, and the last answered);
// a burst smaller than the one documented (its last CLOSEs never answered);
// the bucket refilling to less than the burst after an idle spell.
func TestMessagesPerConnectionArePaced(t *testing.T) {
	t.Parallel()
	const perSecond = 5
	clk := &stoppedClock{now: time.Now()}
	r := relaytest.StartWith(t, dbtest.Pool(t), []relay.Option{relay.WithClock(clock.Stub(clk.at))}, func(c *config.Config) {
		c.MessagesPerSecond = perSecond
	})
	flooder := r.Dial(t, "")
	// Ten seconds' worth, as README and limits.md promise (1,000 at the
	// default rate).
	require.Equal(t, 10, relay.MessageBurstSeconds)
	const burst = relay.MessageBurstSeconds * perSecond
	for range burst + perSecond {
		flooder.SendRaw(`["CLOSE","x"]`)
	}
	for range burst {
		require.Contains(t, flooder.Expect("NOTICE").Msg, "auth-required: ")
	}
	waitMetric(t, r, "buzz_messages_paced_total", "1")

	member := r.Dial(t, "")
	member.Auth(nil)
	require.True(t, member.Publish(member.Sign(1, "beside the flood", nil, 0)).OK)

	clk.advance(time.Second)
	for range perSecond {
		require.Contains(t, flooder.Expect("NOTICE").Msg, "auth-required: ")
	}
	waitMetric(t, r, "buzz_messages_paced_total", "2")

	// Idle for the burst's seconds, the bucket holds the whole burst again:
	// that many are answered at once, the next waits while the clock
	// stands still.
	clk.advance(relay.MessageBurstSeconds * time.Second)
	for range burst {
		flooder.SendRaw(`["CLOSE","x"]`)
	}
	for range burst {
		require.Contains(t, flooder.Expect("NOTICE").Msg, "auth-required: ")
	}
	flooder.SendRaw(`["CLOSE","x"]`)
	flooder.ExpectSilence(500*time.Millisecond, "a message past the bucket was answered while the clock stood still")
}
