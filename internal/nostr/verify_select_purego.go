//go:build !(system_libsecp256k1 && cgo)

package nostr

import "github.com/btcsuite/btcd/btcec/v2"

// Built without cgo or without the system_libsecp256k1 tag: btcec verifies.
const signatureVerifierName = "pure-go"

func verifySchnorr(pub *[32]byte, digest *[32]byte, sig *[64]byte) error {
	return verifyPureGo(pub, digest, sig)
}

// Without the native library btcec signs too; a key needs no preparation.
type nativeSigningKey struct{}

func newNativeSigningKey(*btcec.PrivateKey) nativeSigningKey { return nativeSigningKey{} }

func signSchnorr(k *SecretKey, digest *[32]byte, aux *[32]byte) ([64]byte, error) {
	return signPureGo(k, digest, aux)
}
