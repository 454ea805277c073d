//go:build system_libsecp256k1 && cgo

package nostr

/*
#cgo LDFLAGS: -lsecp256k1
#cgo noescape secp256k1_xonly_pubkey_parse
#cgo nocallback secp256k1_xonly_pubkey_parse
#cgo noescape secp256k1_schnorrsig_verify
#cgo nocallback secp256k1_schnorrsig_verify
#include <secp256k1.h>
#include <secp256k1_extrakeys.h>
#include <secp256k1_schnorrsig.h>
*/
import "C"

import "unsafe"

// Built with cgo and the system_libsecp256k1 tag: the system's C library
// (Debian libsecp256k1-dev) verifies, several times faster than btcec per
// signature. The tag is not plain "libsecp256k1" on purpose: go-nostr, which
// the interop tests import, reads that tag to compile its own bundled copy of
// the library, whose symbols would then silently stand in for the system's.
const signatureVerifierName = "libsecp256k1"

// nativeContext is created once and never destroyed. Parsing and verifying
// only read it, so every goroutine shares it without a lock; verification
// uses no secret data, so the context needs no randomization.
var nativeContext = C.secp256k1_context_create(C.SECP256K1_CONTEXT_VERIFY)

// nativeKeys caches parsed x-only keys the way pureGoKeys does for btcec:
// parsing computes a square root. A secp256k1_xonly_pubkey is 64 bytes of
// plain data, so it lives in Go memory and is handed to C by pointer.
var nativeKeys = pubKeyCache[*C.secp256k1_xonly_pubkey]{max: pubKeyCacheSize, lift: parseNativeXOnly}

func parseNativeXOnly(pk [32]byte) (*C.secp256k1_xonly_pubkey, error) {
	key := new(C.secp256k1_xonly_pubkey)
	if C.secp256k1_xonly_pubkey_parse(nativeContext, key, (*C.uchar)(unsafe.Pointer(&pk[0]))) != 1 {
		return nil, errPubKeyNotOnCurve
	}
	return key, nil
}

// verifyNative checks one signature with libsecp256k1. The noescape and
// nocallback directives above let the digest and signature stay on the
// caller's stack: no allocation crosses into C.
func verifyNative(pub *[32]byte, digest *[32]byte, sig *[64]byte) error {
	key, err := nativeKeys.parse(*pub)
	if err != nil {
		return errPubKeyNotOnCurve
	}
	ok := C.secp256k1_schnorrsig_verify(nativeContext,
		(*C.uchar)(unsafe.Pointer(&sig[0])),
		(*C.uchar)(unsafe.Pointer(&digest[0])), C.size_t(len(digest)),
		key)
	if ok == 1 {
		return nil
	}
	if !sigScalarsInRange(sig) {
		return errSigMalformed
	}
	return errSigMismatch
}

func verifySchnorr(pub *[32]byte, digest *[32]byte, sig *[64]byte) error {
	return verifyNative(pub, digest, sig)
}
