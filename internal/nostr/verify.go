package nostr

import (
	"bytes"
	"fmt"

	"github.com/btcsuite/btcd/btcec/v2/schnorr"
)

// The three ways a BIP-340 check fails. They are values, not built per call,
// so a flood of bad signatures costs no allocations; all wrap ErrBadSignature.
var (
	errPubKeyNotOnCurve = fmt.Errorf("%w: pubkey is not a valid secp256k1 point", ErrBadSignature)
	errSigMalformed     = fmt.Errorf("%w: malformed signature", ErrBadSignature)
	errSigMismatch      = fmt.Errorf("%w: verification failed", ErrBadSignature)
)

// VerifyDigest checks a BIP-340 signature by the x-only public key pub over
// a 32-byte message digest. Errors wrap ErrBadSignature. Every signature
// check in the relay (events, owner attestations, NIP-98, doorbells) ends
// here, through whichever verifier the build selected.
func VerifyDigest(pub [32]byte, digest [32]byte, sig [64]byte) error {
	return verifySchnorr(&pub, &digest, &sig)
}

// SignatureVerifier names the BIP-340 verifier this binary was built with:
// "libsecp256k1" (cgo, build tag system_libsecp256k1) or "pure-go".
func SignatureVerifier() string { return signatureVerifierName }

// verifyPureGo is the btcec verifier. It is compiled into every build: it is
// the verifier when cgo or the library is absent, and the reference the
// native verifier is tested against.
func verifyPureGo(pub *[32]byte, digest *[32]byte, sig *[64]byte) error {
	key, err := pureGoKeys.parse(*pub)
	if err != nil {
		return errPubKeyNotOnCurve
	}
	// btcec v2.3.5 range-checks r but reduces s modulo n without a word;
	// BIP-340 requires s < n, so both bounds are checked here first.
	if !sigScalarsInRange(sig) {
		return errSigMalformed
	}
	s, err := schnorr.ParseSignature(sig[:])
	if err != nil {
		return errSigMalformed
	}
	if !s.Verify(digest[:], key) {
		return errSigMismatch
	}
	return nil
}

// Big-endian secp256k1 field prime p and group order n: a signature's r must
// be below p and its s below n.
var (
	fieldPrime = [32]byte{
		0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff,
		0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xfe, 0xff, 0xff, 0xfc, 0x2f,
	}
	groupOrder = [32]byte{
		0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xfe,
		0xba, 0xae, 0xdc, 0xe6, 0xaf, 0x48, 0xa0, 0x3b, 0xbf, 0xd2, 0x5e, 0x8c, 0xd0, 0x36, 0x41, 0x41,
	}
)

// sigScalarsInRange reports whether r < p and s < n, as BIP-340 requires.
// The native library folds an out-of-range scalar into a plain "invalid", so
// the native verifier asks this only after a failure, to name the cause.
func sigScalarsInRange(sig *[64]byte) bool {
	return bytes.Compare(sig[:32], fieldPrime[:]) < 0 && bytes.Compare(sig[32:], groupOrder[:]) < 0
}
