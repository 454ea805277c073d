//go:build system_libsecp256k1 && cgo

package nostr

/*
#cgo LDFLAGS: -lsecp256k1
#cgo noescape secp256k1_schnorrsig_sign32
#cgo nocallback secp256k1_schnorrsig_sign32
#include <secp256k1.h>
#include <secp256k1_extrakeys.h>
#include <secp256k1_schnorrsig.h>
*/
import "C"

import (
	"crypto/rand"
	"errors"
	"unsafe"

	"github.com/btcsuite/btcd/btcec/v2"
)

// Built with cgo and the system_libsecp256k1 tag, the system library signs
// as well as verifies: several times less CPU than btcec per signature, and
// the relay signs on latency-sensitive paths (an operator listener's NIP-98
// header sits between an event's commit and its delivery).

// signingContext is created and randomized once, before any use, and only
// read afterwards, so every goroutine signs through it without a lock. The
// randomization blinds the secret-key computations against side channels,
// as the library recommends for contexts that sign.
var signingContext = newSigningContext()

func newSigningContext() *C.secp256k1_context {
	ctx := C.secp256k1_context_create(C.SECP256K1_CONTEXT_NONE)
	var seed [32]byte
	if _, err := rand.Read(seed[:]); err != nil {
		panic("nostr: no randomness for the signing context: " + err.Error())
	}
	if C.secp256k1_context_randomize(ctx, (*C.uchar)(unsafe.Pointer(&seed[0]))) != 1 {
		panic("nostr: cannot randomize the signing context")
	}
	return ctx
}

// nativeSigningKey is the library's keypair for one secret key, computed
// once (it holds the public point, which signing would otherwise derive
// every time). It is plain data and lives in Go memory; ok is false if the
// library refused the key, and then btcec signs.
type nativeSigningKey struct {
	keypair C.secp256k1_keypair
	ok      bool
}

func newNativeSigningKey(priv *btcec.PrivateKey) nativeSigningKey {
	var k nativeSigningKey
	secret := priv.Key.Bytes()
	k.ok = C.secp256k1_keypair_create(signingContext, &k.keypair, (*C.uchar)(unsafe.Pointer(&secret[0]))) == 1
	clear(secret[:])
	return k
}

var errNativeSign = errors.New("libsecp256k1 could not sign")

func signSchnorr(k *SecretKey, digest *[32]byte, aux *[32]byte) ([64]byte, error) {
	if !k.native.ok {
		return signPureGo(k, digest, aux)
	}
	var sig [64]byte
	if C.secp256k1_schnorrsig_sign32(signingContext,
		(*C.uchar)(unsafe.Pointer(&sig[0])),
		(*C.uchar)(unsafe.Pointer(&digest[0])),
		&k.native.keypair,
		(*C.uchar)(unsafe.Pointer(&aux[0]))) != 1 {
		return [64]byte{}, errNativeSign
	}
	return sig, nil
}
