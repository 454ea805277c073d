package nostr

import (
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"
)

func naivePlainPrefix(s []byte) (int, bool) {
	ascii := true
	for i, c := range s {
		if c < 0x20 || c == '"' || c == '\\' {
			return i, ascii
		}
		if c >= 0x80 {
			ascii = false
		}
	}
	return len(s), ascii
}

func TestPlainPrefixExhaustive(t *testing.T) {
	// Every byte value at every position of a word, over fillers chosen to
	// provoke borrows in the bit tricks.
	for _, fill := range []byte{'a', 0x20, 0x21, 0x23, 0x5b, 0x5d, 0x7f, 0x80, 0xa2, 0xdc, 0xff} {
		for pos := 0; pos < 8; pos++ {
			for b := 0; b < 256; b++ {
				s := []byte{fill, fill, fill, fill, fill, fill, fill, fill, 'x', 'y'}
				s[pos] = byte(b)
				n, ascii := plainPrefix(s)
				wn, wascii := naivePlainPrefix(s)
				require.Equal(t, wn, n, "fill %#x pos %d byte %#x", fill, pos, b)
				require.Equal(t, wascii, ascii, "fill %#x pos %d byte %#x", fill, pos, b)
				sn, _ := plainPrefix(string(s))
				require.Equal(t, wn, sn)
			}
		}
	}
}

func TestPlainPrefixRandom(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	alphabet := []byte{'a', 'z', ' ', '"', '\\', 0, 0x1f, 0x7f, 0x80, 0xc3, 0xa9, 0xff, '<'}
	for range 20000 {
		s := make([]byte, r.IntN(40))
		for i := range s {
			if r.IntN(8) == 0 {
				s[i] = alphabet[r.IntN(len(alphabet))]
			} else {
				s[i] = byte('a' + r.IntN(26))
			}
		}
		n, ascii := plainPrefix(s)
		wn, wascii := naivePlainPrefix(s)
		require.Equal(t, wn, n, "%q", s)
		require.Equal(t, wascii, ascii, "%q", s)
	}
}
