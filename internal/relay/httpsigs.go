package relay

import (
	"container/list"
	"sync"
	"time"

	"github.com/google/uuid"
)

// Bad signatures of signed HTTP requests (NIP-98, Blossom) an address may
// have checked: badSignaturesAtOnce, then badSignaturesPerSecond. HTTP has
// no connection to bound, and a signature costs the relay about 40 µs of
// CPU and the client nothing (one header with a made-up signature, sent
// again and again): unbounded, eight clients had 4,900 checked a second,
// a third of the relay's CPU for each of their requests.
// Only failures count, and a correct client never sends one, so the
// bucket is generous: at this rate an address costs at most 0.4 ms of CPU
// a second.
const (
	badSignaturesAtOnce    = 100
	badSignaturesPerSecond = 10
	// badSignatureAddrs and verifiedSigners bound what is remembered; the
	// least recently used goes first.
	badSignatureAddrs = 10_000
	verifiedSigners   = 10_000
)

// httpSignatures decides whether a signed HTTP request's signature is
// checked. An address whose bucket of failures is empty has its requests
// refused unchecked, except for a pubkey whose signature verified from
// that address before: so a client sending bad signatures does not lock
// out the others behind its address (a NAT, an agent host) who were
// already signing. Such a pubkey's failure forgets it, so a client
// claiming someone else's pubkey gets one check per success of its owner.
type httpSignatures struct {
	mu       sync.Mutex
	failures *TokenBuckets // key: address bucket
	signers  *list.List    // of signerKey, most recently verified first
	byKey    map[signerKey]*list.Element
}

type signerKey struct{ addr, pubkey string }

// badSignatureCommunity is the community the failure buckets are kept
// under: they count per address, whatever the community.
var badSignatureCommunity = uuid.Nil

func newHTTPSignatures() *httpSignatures {
	return &httpSignatures{
		failures: NewTokenBuckets(badSignaturesPerSecond*60, badSignaturesAtOnce, badSignatureAddrs),
		signers:  list.New(),
		byKey:    map[signerKey]*list.Element{},
	}
}

// allow says whether pubkey's signature from addr is checked; when not,
// retry says when the address has a check again. A check allowed for an
// unknown signer takes a token, which outcome gives back unless the
// signature was bad.
func (h *httpSignatures) allow(addr, pubkey string, now time.Time) (retry time.Duration, ok, charged bool) {
	h.mu.Lock()
	_, known := h.byKey[signerKey{addr, pubkey}]
	h.mu.Unlock()
	if known {
		return 0, true, false
	}
	ok, retry = h.failures.Allow(badSignatureCommunity, addr, now)
	return retry, ok, ok
}

// outcome records a check allowed by allow: a verified signer is
// remembered, a bad signature forgets its pubkey and keeps the token it
// took, if any.
func (h *httpSignatures) outcome(addr, pubkey string, charged, verified bool) {
	if charged && verified {
		h.uncharge(addr)
	}
	key := signerKey{addr, pubkey}
	h.mu.Lock()
	defer h.mu.Unlock()
	el, known := h.byKey[key]
	switch {
	case verified && known:
		h.signers.MoveToFront(el)
	case verified:
		if h.signers.Len() >= verifiedSigners {
			oldest := h.signers.Back()
			delete(h.byKey, oldest.Value.(signerKey))
			h.signers.Remove(oldest)
		}
		h.byKey[key] = h.signers.PushFront(key)
	case known:
		delete(h.byKey, key)
		h.signers.Remove(el)
	}
}

// uncharge gives back the token allow took for a check that found no bad
// signature.
func (h *httpSignatures) uncharge(addr string) {
	h.failures.giveBack(badSignatureCommunity, addr)
}
