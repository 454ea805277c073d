//go:build !(system_libsecp256k1 && cgo)

package nostr

// Built without cgo or without the system_libsecp256k1 tag: btcec verifies.
const signatureVerifierName = "pure-go"

func verifySchnorr(pub *[32]byte, digest *[32]byte, sig *[64]byte) error {
	return verifyPureGo(pub, digest, sig)
}
