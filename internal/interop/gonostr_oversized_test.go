package interop

import (
	"strings"
	"testing"

	"github.com/nbd-wtf/go-nostr"
	"github.com/stretchr/testify/require"

	"github.com/buzzrelay/buzz/internal/config"
	"github.com/buzzrelay/buzz/internal/relaytest"
)

// TestGoNostrOversizedEventIsAnsweredWithOK: content within the advertised
// max_content_length (characters) can exceed max_message_length (bytes).
// Such an EVENT is refused with the OK go-nostr's Publish waits for, naming
// the limit, not a NOTICE that leaves Publish waiting until its deadline;
// a REQ too large gets its CLOSED; the connection stays usable.
func TestGoNostrOversizedEventIsAnsweredWithOK(t *testing.T) {
	t.Parallel()
	r := relaytest.Start(t)
	c := connectGo(t, r)
	limits := config.Default()

	article := c.sign(30023, strings.Repeat("😀", limits.MaxContentLength), nostr.Tags{{"d", "long"}}, nostr.Now())
	require.ErrorContains(t, c.send(article), "invalid: message of ")

	reason := c.reqClosedReasonFor(nostr.Filter{Tags: nostr.TagMap{"t": {strings.Repeat("x", limits.MaxMessageBytes)}}})
	require.True(t, strings.HasPrefix(reason, "invalid: message of "), "CLOSED %q", reason)

	note := c.publish(1, "after the oversized ones", nil, nostr.Now())
	require.Equal(t, []string{note.ID}, ids(c.fetch(nostr.Filter{IDs: []string{note.ID}})))
}
