//go:build libsecp256k1 && cgo

package nostr

import (
	"testing"

	"github.com/stretchr/testify/require"
)

func init() { verifiersUnderTest["libsecp256k1"] = verifyNative }

func TestLibsecp256k1IsTheActiveVerifier(t *testing.T) {
	t.Parallel()
	require.Equal(t, "libsecp256k1", SignatureVerifier())
	ev := &Event{Kind: 1, CreatedAt: 1700000000, Content: "native", Tags: Tags{}}
	sk, err := SecretKeyFromHex(testSK1)
	require.NoError(t, err)
	require.NoError(t, ev.Sign(sk))
	require.NoError(t, ev.Verify())
	ev.Content = "tampered"
	require.ErrorIs(t, ev.Verify(), ErrBadID)
	require.ErrorIs(t, ev.VerifySignature(), ErrBadSignature)
}
