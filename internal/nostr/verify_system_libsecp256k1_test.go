//go:build system_libsecp256k1 && cgo

package nostr

import (
	"os"
	"testing"

	"github.com/stretchr/testify/require"
)

func init() {
	verifiersUnderTest["libsecp256k1"] = verifyNative
	signersUnderTest["libsecp256k1"] = signSchnorr
}

func TestLibsecp256k1IsTheActiveVerifier(t *testing.T) {
	t.Parallel()
	require.Equal(t, "libsecp256k1", SignatureVerifier())
	// The symbols must come from the shared system library, not from a copy
	// some dependency compiled in (go-nostr does under its own tag): only the
	// system library is the one .ci/run installs and these tests vouch for.
	maps, err := os.ReadFile("/proc/self/maps")
	require.NoError(t, err)
	require.Contains(t, string(maps), "libsecp256k1.so", "the system libsecp256k1 is not loaded")
	ev := &Event{Kind: 1, CreatedAt: 1700000000, Content: "native", Tags: Tags{}}
	sk, err := SecretKeyFromHex(testSK1)
	require.NoError(t, err)
	require.True(t, sk.native.ok, "the native signer must have prepared the key")
	require.NoError(t, ev.Sign(sk))
	require.NoError(t, ev.Verify())
	ev.Content = "tampered"
	require.ErrorIs(t, ev.Verify(), ErrBadID)
	require.ErrorIs(t, ev.VerifySignature(), ErrBadSignature)
}
