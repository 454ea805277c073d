package nostr

import (
	"encoding/hex"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/btcsuite/btcd/btcec/v2/schnorr"
	"github.com/stretchr/testify/require"
)

type schnorrVerifierFunc func(pub *[32]byte, digest *[32]byte, sig *[64]byte) error

// verifiersUnderTest holds every verifier compiled into this test binary:
// btcec always, libsecp256k1 when built with the tag (see
// verify_system_libsecp256k1_test.go). Each test below holds them all to the same
// answers.
var verifiersUnderTest = map[string]schnorrVerifierFunc{"pure-go": verifyPureGo}

// schnorrCase is one verification input and the outcome every verifier must give.
type schnorrCase struct {
	name   string
	pub    [32]byte
	digest [32]byte
	sig    [64]byte
	want   error // nil, errPubKeyNotOnCurve, errSigMalformed or errSigMismatch
}

func mustHex[T [32]byte | [64]byte](t testing.TB, s string) T {
	var out T
	b, err := hex.DecodeString(s)
	require.NoError(t, err)
	require.Len(t, b, len(out))
	return T(b)
}

// signDeterministic signs with zero auxiliary randomness so a case's bytes
// are the same on every run.
func signDeterministic(t testing.TB, sk *SecretKey, digest [32]byte) [64]byte {
	sig, err := schnorr.Sign(sk.priv, digest[:], schnorr.CustomNonce([32]byte{}))
	require.NoError(t, err)
	return [64]byte(sig.Serialize())
}

func withByte[T [32]byte | [64]byte](b T, i int, xor byte) T {
	b[i] ^= xor
	return b
}

func withHalf(sig [64]byte, half int, v [32]byte) [64]byte {
	copy(sig[32*half:], v[:])
	return sig
}

// addSmall returns the big-endian value v + k (k small, no overflow past 2^256).
func addSmall(v [32]byte, k int) [32]byte {
	carry := k
	for i := 31; i >= 0 && carry > 0; i-- {
		sum := int(v[i]) + carry
		v[i] = byte(sum)
		carry = sum >> 8
	}
	return v
}

func subOne(v [32]byte) [32]byte {
	for i := 31; i >= 0; i-- {
		v[i]--
		if v[i] != 0xff {
			break
		}
	}
	return v
}

func schnorrCases(t testing.TB) []schnorrCase {
	sk, err := SecretKeyFromHex(testSK1)
	require.NoError(t, err)
	other, err := SecretKeyFromHex(strings.Repeat("07", 32))
	require.NoError(t, err)
	pub := sk.PublicKey()
	digest := mustHex[[32]byte](t, hexA)
	sig := signDeterministic(t, sk, digest)
	var zero [32]byte
	// p and n written out here rather than taken from verify.go, so a typo
	// there cannot hide behind the table.
	p := mustHex[[32]byte](t, "fffffffffffffffffffffffffffffffffffffffffffffffffffffffefffffc2f")
	n := mustHex[[32]byte](t, "fffffffffffffffffffffffffffffffebaaedce6af48a03bbfd25e8cd0364141")
	allFF := [32]byte(mustHex[[32]byte](t, strings.Repeat("ff", 32)))

	// BIP-340's published verification vectors: the cases a random
	// tamper would rarely reach.
	bipPub := mustHex[[32]byte](t, "dff1d77f2a671c5f36183726db2341be58feae1da2deced843240f7b502ba659")
	bipMsg := mustHex[[32]byte](t, "243f6a8885a308d313198a2e03707344a4093822299f31d0082efa98ec4e6c89")

	return []schnorrCase{
		{"valid", pub, digest, sig, nil},
		{"digest one bit off", pub, withByte(digest, 31, 1), sig, errSigMismatch},
		{"r one bit off", pub, digest, withByte(sig, 5, 0x10), errSigMismatch},
		{"s one bit off", pub, digest, withByte(sig, 63, 1), errSigMismatch},
		{"another author's key", other.PublicKey(), digest, sig, errSigMismatch},
		{"pubkey x = 0 is not on the curve", zero, digest, sig, errPubKeyNotOnCurve},
		{"pubkey x = p", p, digest, sig, errPubKeyNotOnCurve},
		{"pubkey x = p + 1", addSmall(p, 1), digest, sig, errPubKeyNotOnCurve},
		{"pubkey x = 2^256 - 1", allFF, digest, sig, errPubKeyNotOnCurve},
		{"pubkey off the curve and sig malformed: the key is reported", zero, digest, withHalf(sig, 1, allFF), errPubKeyNotOnCurve},
		{"r = p", pub, digest, withHalf(sig, 0, p), errSigMalformed},
		{"r = 2^256 - 1", pub, digest, withHalf(sig, 0, allFF), errSigMalformed},
		{"r = p - 1", pub, digest, withHalf(sig, 0, subOne(p)), errSigMismatch},
		{"r = 0", pub, digest, withHalf(sig, 0, zero), errSigMismatch},
		{"s = n", pub, digest, withHalf(sig, 1, n), errSigMalformed},
		{"s = n + 1", pub, digest, withHalf(sig, 1, addSmall(n, 1)), errSigMalformed},
		{"s = 2^256 - 1", pub, digest, withHalf(sig, 1, allFF), errSigMalformed},
		{"s = n - 1", pub, digest, withHalf(sig, 1, subOne(n)), errSigMismatch},
		{"s = 0", pub, digest, withHalf(sig, 1, zero), errSigMismatch},
		{"all-zero signature", pub, digest, [64]byte{}, errSigMismatch},
		{"BIP-340 vector: r has leading zeros", mustHex[[32]byte](t, "d69c3509bb99e412e68b0fe8544e72837dfa30746d8be2aa65975f29d22dc7b9"),
			mustHex[[32]byte](t, "4df3c3f68fcc83b27e9d42c90431a72499f17875c81a599b566c9889b9696703"),
			mustHex[[64]byte](t, "00000000000000000000003b78ce563f89a0ed9414f5aa28ad0d96d6795f9c6376afb1548af603b3eb45c9f8207dee1060cb71c04e80f593060b07d28308d7f4"), nil},
		{"BIP-340 vector: public key not on the curve", mustHex[[32]byte](t, "eefdea4cdb677750a420fee807eacf21eb9898ae79b9768766e4faa04a2d4a34"), bipMsg,
			mustHex[[64]byte](t, "6cff5c3ba86c69ea4b7376f31a9bcb4f74c1976089b2d9963da2e5543e17776969e89b4c5564d00349106b8497785dd7d1d713a8ae82b32fa79d5f7fc407d39b"), errPubKeyNotOnCurve},
		{"BIP-340 vector: R has odd y", bipPub, bipMsg,
			mustHex[[64]byte](t, "fff97bd5755eeea420453a14355235d382f6472f8568a18b2f057a14602975563cc27944640ac607cd107ae10923d9ef7a73c643e166be5ebeafa34b1ac553e2"), errSigMismatch},
		{"BIP-340 vector: negated message", bipPub, bipMsg,
			mustHex[[64]byte](t, "1fa62e331edbc21c394792d2ab1100a7b432b013df3f6ff4f99fcb33e0e1515f28890b3edb6e7189b630448b515ce4f8622a954cfe545735aaea5134fccdb2bd"), errSigMismatch},
		{"BIP-340 vector: negated s", bipPub, bipMsg,
			mustHex[[64]byte](t, "6cff5c3ba86c69ea4b7376f31a9bcb4f74c1976089b2d9963da2e5543e177769961764b3aa9b2ffcb6ef947b6887a226e8d7c93e00c5ed0c1834ff0d0c2e6da6"), errSigMismatch},
		{"BIP-340 vector: sG - eP is infinite (r = 0)", bipPub, bipMsg,
			mustHex[[64]byte](t, "0000000000000000000000000000000000000000000000000000000000000000123dda8328af9c23a94c1feecfd123ba4fb73476f0d594dcb65c6425bd186051"), errSigMismatch},
		{"BIP-340 vector: sG - eP is infinite (r = 1)", bipPub, bipMsg,
			mustHex[[64]byte](t, "00000000000000000000000000000000000000000000000000000000000000017615fbaf5ae28864013c099742deadb4dba87f11ac6754f93780d5a1837cf197"), errSigMismatch},
		{"BIP-340 vector: r is not an x on the curve", bipPub, bipMsg,
			mustHex[[64]byte](t, "4a298dacae57395a15d0795ddbfd1dcb564da82b0f269bc70a74f8220429ba1d69e89b4c5564d00349106b8497785dd7d1d713a8ae82b32fa79d5f7fc407d39b"), errSigMismatch},
	}
}

// Every verifier gives each hand-picked case the expected answer: valid,
// tampered, out-of-range scalars, keys off the curve or at or above p.
func TestSchnorrVerifiersOnEdgeCases(t *testing.T) {
	t.Parallel()
	for _, c := range schnorrCases(t) {
		for name, verify := range verifiersUnderTest {
			got := verify(&c.pub, &c.digest, &c.sig)
			require.Equal(t, c.want, got, "%s: %s", name, c.name)
		}
	}
}

// Three hundred seeded random cases, the same on every run: fresh keys and
// digests, then a valid signature or one of the ways a relay sees a bad one.
// Every verifier must give the same answer, and accept exactly the untouched
// signatures.
func TestSchnorrVerifiersAgreeOnRandomCases(t *testing.T) {
	t.Parallel()
	rng := rand.New(rand.NewChaCha8([32]byte{'b', 'u', 'z', 'z'}))
	n := 300
	if testing.Short() {
		n = 50
	}
	for i := range n {
		c := randomSchnorrCase(t, rng)
		got := sameAnswer(t, &c.pub, &c.digest, &c.sig)
		if c.want == nil {
			require.NoError(t, got, "case %d (%s) must verify", i, c.name)
		} else {
			require.Error(t, got, "case %d (%s) must fail", i, c.name)
		}
	}
}

// sameAnswer runs every verifier on one input, requires them to agree and
// returns their answer.
func sameAnswer(t testing.TB, pub *[32]byte, digest *[32]byte, sig *[64]byte) error {
	var first error
	firstName := ""
	for name, verify := range verifiersUnderTest {
		got := verify(pub, digest, sig)
		if firstName == "" {
			first, firstName = got, name
			continue
		}
		require.Equal(t, first, got, "%s and %s disagree on pub=%x digest=%x sig=%x", firstName, name, *pub, *digest, *sig)
	}
	return first
}

// randomSchnorrCase draws one case; want is nil only for an untouched
// signature and errSigMismatch as a stand-in for "any failure" otherwise.
func randomSchnorrCase(t testing.TB, rng *rand.Rand) schnorrCase {
	var secret, digest [32]byte
	fillRandom(rng, secret[:])
	fillRandom(rng, digest[:])
	sk, err := SecretKeyFromHex(hex.EncodeToString(secret[:]))
	require.NoError(t, err, "a random 256-bit value is a valid key but for odds of 2^-128")
	c := schnorrCase{name: "valid", pub: sk.PublicKey(), digest: digest, sig: signDeterministic(t, sk, digest)}
	switch rng.IntN(8) {
	case 0, 1:
		return c
	case 2:
		c.name, c.digest = "digest bit flipped", withByte(c.digest, rng.IntN(32), 1<<rng.IntN(8))
	case 3:
		c.name, c.sig = "signature bit flipped", withByte(c.sig, rng.IntN(64), 1<<rng.IntN(8))
	case 4:
		c.name, c.pub = "pubkey bit flipped", withByte(c.pub, rng.IntN(32), 1<<rng.IntN(8))
	case 5:
		c.name = "random pubkey bytes"
		fillRandom(rng, c.pub[:])
	case 6:
		c.name = "random signature bytes"
		fillRandom(rng, c.sig[:])
	case 7:
		c.name = "scalar pushed to or past its bound"
		if rng.IntN(2) == 0 {
			c.sig = withHalf(c.sig, 0, addSmall(fieldPrime, rng.IntN(1000)))
		} else {
			c.sig = withHalf(c.sig, 1, addSmall(groupOrder, rng.IntN(1000)))
		}
	}
	c.want = errSigMismatch
	return c
}

func fillRandom(rng *rand.Rand, b []byte) {
	for i := range b {
		b[i] = byte(rng.Uint32())
	}
}

// FuzzSchnorrVerifiersAgree feeds every verifier the same input and
// requires the same answer. With a usable secret the input is a real
// signature with pubMask and sigMask XORed in (empty masks must verify);
// otherwise pubBytes and sigBytes are taken as they are. The seed corpus
// under testdata/fuzz holds the edge cases above in raw form.
func FuzzSchnorrVerifiersAgree(f *testing.F) {
	f.Add([]byte(strings.Repeat("\x01", 32)), []byte("digest"), []byte{}, []byte{})
	f.Add([]byte(strings.Repeat("\x02", 32)), []byte("digest"), []byte{}, []byte{63: 1})
	f.Add([]byte(strings.Repeat("\x03", 32)), []byte("digest"), []byte{0: 0x80}, []byte{})
	f.Fuzz(func(t *testing.T, secret, digestBytes, pubBytes, sigBytes []byte) {
		var pub, digest [32]byte
		var sig [64]byte
		copy(digest[:], digestBytes)
		signed := false
		if len(secret) == 32 {
			if sk, err := SecretKeyFromHex(hex.EncodeToString(secret)); err == nil {
				signed = true
				pub, sig = sk.PublicKey(), signDeterministic(t, sk, digest)
				for i := 0; i < len(pubBytes) && i < len(pub); i++ {
					pub[i] ^= pubBytes[i]
				}
				for i := 0; i < len(sigBytes) && i < len(sig); i++ {
					sig[i] ^= sigBytes[i]
				}
			}
		}
		if !signed {
			copy(pub[:], pubBytes)
			copy(sig[:], sigBytes)
		}
		untouched := signed && allZero(pubBytes, len(pub)) && allZero(sigBytes, len(sig))
		got := sameAnswer(t, &pub, &digest, &sig)
		if untouched {
			require.NoError(t, got, "an untouched signature must verify")
		}
	})
}

// allZero reports whether the first n bytes of mask (the part XORed in) are zero.
func allZero(mask []byte, n int) bool {
	for i := 0; i < len(mask) && i < n; i++ {
		if mask[i] != 0 {
			return false
		}
	}
	return true
}
