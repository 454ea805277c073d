package interop

import (
	"strconv"
	"testing"
	"time"

	"github.com/nbd-wtf/go-nostr"
	"github.com/stretchr/testify/require"

	"github.com/buzzrelay/buzz/internal/relaytest"
)

// TestGoNostrExpiration (NIP-40): an event whose expiration has passed is
// refused on arrival; one stored before its expiration is served and
// counted until then, and neither once it passes; a malformed expiration
// is refused.
func TestGoNostrExpiration(t *testing.T) {
	t.Parallel()
	r := relaytest.Start(t)
	c := connectGo(t, r)
	now := nostr.Now()
	exp := func(at nostr.Timestamp) nostr.Tags {
		return nostr.Tags{{"expiration", strconv.FormatInt(int64(at), 10)}}
	}

	require.ErrorContains(t, c.send(c.sign(1, "already gone", exp(now-1), now-10)), "invalid:")
	require.ErrorContains(t, c.send(c.sign(1, "bad", nostr.Tags{{"expiration", "soon"}}, now)), "invalid:")

	// Expires five seconds from now (whole seconds: at least four from
	// now), so that a loaded machine publishes and reads the four events
	// before it expires; at two, one second was all it had.
	soon := c.publish(1, "short-lived", exp(nostr.Now()+5), now)
	later := c.publish(1, "long-lived", exp(now+3600), now)
	forever := c.publish(1, "forever", nil, now)
	far := c.publish(1, "far future", exp(1<<62), now)
	mine := nostr.Filter{Authors: []string{c.pk}}
	require.ElementsMatch(t, []string{soon.ID, later.ID, forever.ID, far.ID}, ids(c.fetch(mine)))

	deadline := time.Now().Add(time.Minute)
	for {
		got := ids(c.fetch(mine))
		if len(got) == 3 {
			require.ElementsMatch(t, []string{later.ID, forever.ID, far.ID}, got)
			break
		}
		require.True(t, time.Now().Before(deadline), "the expired event is still served")
		time.Sleep(200 * time.Millisecond)
	}
	require.EqualValues(t, 3, c.count(mine))
	require.Empty(t, c.fetch(nostr.Filter{IDs: []string{soon.ID}}))
	require.Empty(t, c.fetch(nostr.Filter{Search: "short-lived"}))
}
