package eventstore

import (
	"bytes"
	"encoding/hex"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestHexStrings(t *testing.T) {
	t.Parallel()
	id, pubkey, sig := bytes.Repeat([]byte{0x01}, 32), bytes.Repeat([]byte{0xab}, 32), bytes.Repeat([]byte{0xfe}, 64)
	sig[63] = 0x07
	gotID, gotPub, gotSig := hexStrings(id, pubkey, sig)
	require.Equal(t, hex.EncodeToString(id), gotID)
	require.Equal(t, hex.EncodeToString(pubkey), gotPub)
	require.Equal(t, hex.EncodeToString(sig), gotSig)
	a, b, c := hexStrings(nil, []byte{1}, nil)
	require.Equal(t, []string{"", "01", ""}, []string{a, b, c})
}
