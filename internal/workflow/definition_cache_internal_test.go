package workflow

import (
	"crypto/sha256"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// An event's definition is parsed once and then shared; other content
// under the same id (which a stored event cannot have) is parsed afresh,
// and a definition that does not parse is not kept.
// Mutations killed: parse without the cache (a second, different
// pointer); the cache without its content check (the first definition is
// answered for the second text).
func TestDefinitionCacheParsesAnEventOnce(t *testing.T) {
	t.Parallel()
	c := newDefinitionCache()
	const text = "name: A\ntrigger: {on: message_posted}\nsteps: [{id: one, action: send_message, text: hi}]"
	id := sha256.Sum256([]byte(text))
	first, err := c.parse(id[:], text)
	require.NoError(t, err)
	again, err := c.parse(id[:], text)
	require.NoError(t, err)
	require.Same(t, first, again, "parsed once")

	other, err := c.parse(id[:], "name: B\ntrigger: {on: message_posted}\nsteps: [{id: one, action: send_message, text: hi}]")
	require.NoError(t, err)
	require.Equal(t, "B", other.Name)

	bad := sha256.Sum256([]byte("x"))
	for range 2 {
		_, err = c.parse(bad[:], "name: [")
		require.Error(t, err)
	}
	require.Len(t, c.parsed, 1)

	require.Equal(t, 1, c.hits)

	large := "description: " + strings.Repeat("x", 64<<10) + "\n" + text
	for i := range maxCachedDefinitionBytes/len(large) + 10 {
		key := sha256.Sum256([]byte{byte(i), byte(i >> 8)})
		_, err := c.parse(key[:], large)
		require.NoError(t, err)
		require.LessOrEqual(t, c.bytes, maxCachedDefinitionBytes, "bounded")
	}
	total := 0
	for _, kept := range c.parsed {
		total += len(kept.content)
	}
	require.Equal(t, total, c.bytes)
}
