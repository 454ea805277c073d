package interop

import (
	"context"
	"strings"
	"testing"

	"github.com/nbd-wtf/go-nostr"
	"github.com/nbd-wtf/go-nostr/nip11"
	"github.com/stretchr/testify/require"

	"github.com/buzzrelay/buzz/internal/config"
	"github.com/buzzrelay/buzz/internal/relaytest"
)

// TestGoNostrContentLimitIsInCharacters: NIP-11's max_content_length counts
// characters, and the relay enforces the number it advertises the same
// way: content of that many multi-byte characters is stored, one character
// more is refused, whatever its bytes.
func TestGoNostrContentLimitIsInCharacters(t *testing.T) {
	t.Parallel()
	const limit = 10
	r := relaytest.Start(t, func(c *config.Config) { c.MaxContentLength = limit })
	ctx, cancel := context.WithTimeout(t.Context(), wait)
	defer cancel()
	info, err := nip11.Fetch(ctx, r.URL)
	require.NoError(t, err)
	require.Equal(t, limit, info.Limitation.MaxContentLength)

	c := connectGo(t, r)
	for _, char := range []string{"a", "é", "語", "😀"} {
		c.publish(1, strings.Repeat(char, limit), nil, nostr.Now())
		err := c.send(c.sign(1, strings.Repeat(char, limit+1), nil, nostr.Now()))
		require.ErrorContains(t, err, "invalid: content too long (max 10 characters)", "%d x %q", limit+1, char)
	}
}
