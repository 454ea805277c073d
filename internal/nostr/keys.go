package nostr

import (
	"crypto/rand"
	"encoding/hex"
	"errors"

	"github.com/btcsuite/btcd/btcec/v2"
	"github.com/btcsuite/btcd/btcec/v2/schnorr"
)

// SecretKey is a secp256k1 private key used for BIP-340 signing.
type SecretKey struct {
	priv *btcec.PrivateKey
	pub  [32]byte // x-only public key, cached: signing needs it every time
	// native is the key prepared once for the native signer, in builds that
	// have one (signSchnorr); empty otherwise.
	native nativeSigningKey
}

func newSecretKey(priv *btcec.PrivateKey) *SecretKey {
	k := &SecretKey{priv: priv}
	copy(k.pub[:], schnorr.SerializePubKey(priv.PubKey()))
	k.native = newNativeSigningKey(priv)
	return k
}

// signPureGo is the btcec BIP-340 signer, compiled into every build: the
// signer without cgo or the library, and the reference the native signer is
// tested against. aux is the auxiliary randomness mixed into the nonce, so
// both signers give the same signature for the same inputs.
func signPureGo(k *SecretKey, digest *[32]byte, aux *[32]byte) ([64]byte, error) {
	sig, err := schnorr.Sign(k.priv, digest[:], schnorr.CustomNonce(*aux))
	if err != nil {
		return [64]byte{}, err
	}
	var out [64]byte
	copy(out[:], sig.Serialize())
	return out, nil
}

// GenerateSecretKey returns a new random key from crypto/rand.
func GenerateSecretKey() (*SecretKey, error) {
	priv, err := btcec.NewPrivateKey()
	if err != nil {
		return nil, err
	}
	return newSecretKey(priv), nil
}

// SecretKeyFromHex parses a 64-char hex secret key. Unlike
// btcec.PrivKeyFromBytes it rejects values that are zero or >= the curve
// order instead of silently reducing them.
func SecretKeyFromHex(s string) (*SecretKey, error) {
	if len(s) != 64 {
		return nil, errors.New("secret key must be 64 hex characters")
	}
	b, err := hex.DecodeString(s)
	if err != nil {
		return nil, errors.New("secret key must be 64 hex characters")
	}
	var scalar btcec.ModNScalar
	if overflow := scalar.SetByteSlice(b); overflow || scalar.IsZero() {
		return nil, errors.New("secret key out of range")
	}
	return newSecretKey(btcec.PrivKeyFromScalar(&scalar)), nil
}

// Hex returns the secret key as 64 lowercase hex characters.
func (k *SecretKey) Hex() string {
	b := k.priv.Key.Bytes()
	return hex.EncodeToString(b[:])
}

// PublicKey returns the 32-byte x-only public key.
func (k *SecretKey) PublicKey() [32]byte { return k.pub }

// PublicKeyHex returns the x-only public key as 64 lowercase hex characters.
func (k *SecretKey) PublicKeyHex() string { return hex.EncodeToString(k.pub[:]) }

// SignDigest returns the BIP-340 signature of a 32-byte message digest (for
// signatures over something other than an event, such as an owner
// attestation), with fresh auxiliary randomness.
func (k *SecretKey) SignDigest(digest [32]byte) ([64]byte, error) {
	// BIP-340 recommends fresh auxiliary randomness mixed into the nonce.
	var aux [32]byte
	if _, err := rand.Read(aux[:]); err != nil {
		return [64]byte{}, err
	}
	return signSchnorr(k, &digest, &aux)
}
