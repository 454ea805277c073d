package nostr

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// RawEventID finds the id both event encoders lead with, and nothing in
// JSON they did not write.
func TestRawEventID(t *testing.T) {
	id := strings.Repeat("ab", 32)
	ev := &Event{ID: id, PubKey: strings.Repeat("cd", 32), Kind: 1, Sig: strings.Repeat("ef", 64)}
	require.Equal(t, id, string(RawEventID(ev.AppendJSON(nil))))
	stored := AppendStoredJSON(nil, []byte(strings.Repeat("\xab", 32)), make([]byte, 32), 1, 1, []byte("[]"), nil, make([]byte, 64))
	require.Equal(t, id, string(RawEventID(stored)))
	for _, other := range []string{``, `{"id":"` + id, `{"id":"` + id[:63] + `"}`, `{"pubkey":"` + id + `"}`, `{ "id":"` + id + `"}`} {
		require.Nil(t, RawEventID([]byte(other)), other)
	}
}
