package nostr

import (
	"math/rand/v2"
	"testing"

	"github.com/btcsuite/btcd/btcec/v2"
	"github.com/stretchr/testify/require"
)

type schnorrSignerFunc func(k *SecretKey, digest *[32]byte, aux *[32]byte) ([64]byte, error)

// signersUnderTest holds every BIP-340 signer compiled into this test
// binary: btcec always, libsecp256k1 when built with the tag (see
// verify_system_libsecp256k1_test.go).
var signersUnderTest = map[string]schnorrSignerFunc{"pure-go": signPureGo}

// signingKeys returns n random keys plus the smallest and the largest valid
// secret keys (1 and n-1), whose public points sit at the edges.
func signingKeys(t *testing.T, rng *rand.ChaCha8, n int) []*SecretKey {
	t.Helper()
	var one, last btcec.ModNScalar
	one.SetInt(1)
	last.SetInt(1)
	last.Negate() // n - 1
	keys := []*SecretKey{newSecretKey(btcec.PrivKeyFromScalar(&one)), newSecretKey(btcec.PrivKeyFromScalar(&last))}
	for len(keys) < n+2 {
		var b [32]byte
		_, _ = rng.Read(b[:])
		var s btcec.ModNScalar
		if overflow := s.SetBytes(&b); overflow != 0 || s.IsZero() {
			continue
		}
		keys = append(keys, newSecretKey(btcec.PrivKeyFromScalar(&s)))
	}
	return keys
}

// Every signer gives byte-identical signatures for the same key, digest and
// auxiliary randomness (BIP-340 fixes the nonce from those three), and each
// signature passes every verifier; a tampered digest or signature fails them.
func TestSignersAgreeOnAFuzzedCorpus(t *testing.T) {
	t.Parallel()
	require.NotEmpty(t, signersUnderTest)
	rng := rand.NewChaCha8([32]byte{'s', 'i', 'g', 'n'})
	for _, k := range signingKeys(t, rng, 60) {
		for range 4 {
			var digest, aux [32]byte
			_, _ = rng.Read(digest[:])
			_, _ = rng.Read(aux[:])
			var want [64]byte
			first := true
			for name, sign := range signersUnderTest {
				sig, err := sign(k, &digest, &aux)
				require.NoError(t, err, name)
				if first {
					want, first = sig, false
				}
				require.Equal(t, want, sig, "%s disagrees for key %s", name, k.PublicKeyHex())
			}
			for name, verify := range verifiersUnderTest {
				require.NoError(t, verify(&k.pub, &digest, &want), name)
				tampered := withByte(digest, int(digest[0])%32, 0x01)
				require.ErrorIs(t, verify(&k.pub, &tampered, &want), ErrBadSignature, name)
				badSig := withByte(want, 32+int(digest[1])%32, 0x80)
				require.ErrorIs(t, verify(&k.pub, &digest, &badSig), ErrBadSignature, name)
			}
		}
	}
}

// The signer a build selected signs events and digests that verify, with
// fresh randomness each time (two signatures of one digest differ).
func TestActiveSignerSignsVerifiableEvents(t *testing.T) {
	t.Parallel()
	sk, err := GenerateSecretKey()
	require.NoError(t, err)
	ev := &Event{Kind: 1, CreatedAt: 1700000000, Content: "signed by " + SignatureVerifier()}
	require.NoError(t, ev.Sign(sk))
	require.NoError(t, ev.Verify())
	digest := ev.IDBytes()
	a, err := sk.SignDigest(digest)
	require.NoError(t, err)
	b, err := sk.SignDigest(digest)
	require.NoError(t, err)
	require.NotEqual(t, a, b, "auxiliary randomness must be fresh per signature")
	require.NoError(t, VerifyDigest(sk.PublicKey(), digest, a))
	require.NoError(t, VerifyDigest(sk.PublicKey(), digest, b))
}
