package nostr

import (
	"encoding/hex"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// The NIP-19 example decodes; a changed character, another prefix, mixed
// case or the wrong length is refused.
func TestDecodeNpub(t *testing.T) {
	t.Parallel()
	const npub = "npub10elfcs4fr0l0r8af98jlmgdh9c8tcxjvz9qkw038js35mp4dma8qzvjptg"
	const want = "7e7e9c42a91bfef19fa929e5fda1b72e0ebc1a4c1141673e2794234d86addf4e"
	key, err := DecodeNpub(npub)
	require.NoError(t, err)
	require.Equal(t, want, hex.EncodeToString(key[:]))
	key, err = DecodeNpub(strings.ToUpper(npub))
	require.NoError(t, err)
	require.Equal(t, want, hex.EncodeToString(key[:]))

	for _, bad := range []string{
		"", "npub", "npub1", npub[:len(npub)-1] + "q", "nsec" + npub[4:],
		"Npub" + npub[4:], npub[:20] + npub[21:], npub + "q", want,
		"npub1" + strings.Repeat("b", 58), // wrong character set
	} {
		_, err := DecodeNpub(bad)
		require.Error(t, err, bad)
	}
}
