package interop

import (
	"strings"
	"testing"

	"github.com/nbd-wtf/go-nostr"
	"github.com/stretchr/testify/require"

	"github.com/buzzrelay/buzz/internal/relaytest"
)

// TestGoNostrMalformedIDIsAnsweredWithOK: an event whose id is not 64
// lowercase hex characters (written in uppercase, cut short) is refused with
// the OK go-nostr's Publish waits for, under the id as it was sent, not a
// NOTICE that leaves Publish waiting until its deadline.
func TestGoNostrMalformedIDIsAnsweredWithOK(t *testing.T) {
	t.Parallel()
	r := relaytest.Start(t)
	c := connectGo(t, r)

	for name, spoil := range map[string]func(string) string{
		"uppercase": strings.ToUpper,
		"short":     func(id string) string { return id[:63] },
	} {
		ev := c.sign(1, "id "+name, nil, nostr.Now())
		ev.ID = spoil(ev.ID)
		require.ErrorContains(t, c.send(ev), "invalid: id must be 64-char lowercase hex", name)
	}

	note := c.publish(1, "after the malformed ids", nil, nostr.Now())
	require.Equal(t, []string{note.ID}, ids(c.fetch(nostr.Filter{IDs: []string{note.ID}})))
}
