package relay

import (
	"container/list"
	"sync"
	"time"

	"github.com/buzzrelay/buzz/internal/nostr"
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
	// All addresses together, whatever their number (IPv6 /64s past the
	// address memory, a botnet): at most 40 ms of CPU a second, 4% of a
	// core.
	allBadSignaturesAtOnce    = 1000
	allBadSignaturesPerSecond = 1000
	// badSignatureAddrs and verifiedSigners bound what is remembered; the
	// least recently used goes first. signersPerAddr keeps one address's
	// throwaway keys from pushing other addresses' signers out.
	badSignatureAddrs = 10_000
	verifiedSigners   = 10_000
	signersPerAddr    = 64
	// verifiedEvents bounds the signatures remembered as good.
	verifiedEvents = 10_000
	// verifiedTokenCap bounds how long a Blossom token's signature is
	// remembered as good: until the token expires, but at most this long
	// after it verified (a token may be signed to last for days).
	verifiedTokenCap = time.Hour
)

// httpSignatures decides whether a signed HTTP request's signature is
// checked. An address whose bucket of failures is empty has its requests
// refused unchecked, except for a pubkey whose signature verified from
// that address before: so a client sending bad signatures does not lock
// out the others behind its address (a NAT, an agent host) who were
// already signing. Such a pubkey is exempt for one check at a time, and
// its failure forgets it, so a client claiming someone else's pubkey gets
// one check per success of its owner. A signature that verified is
// remembered for the auth window, so a header sent again (a replay, a
// reusable Blossom token) costs a hash, not a check.
type httpSignatures struct {
	mu       sync.Mutex
	failures *TokenBuckets // key: address bucket
	all      tokenBucket   // failures of every address together
	signers  *list.List    // of *signer, most recently verified first
	byKey    map[signerKey]*signer
	byAddr   map[string]*list.List // of *signer, per address, most recent first
	verified verifiedSignatures
}

type signerKey struct{ addr, pubkey string }

type signer struct {
	key signerKey
	// inAll and inAddr are its places in signers and byAddr[key.addr].
	inAll, inAddr *list.Element
	// checking is set while an exempt check of its signature runs: another
	// request in its name meanwhile takes the address's bucket.
	checking bool
}

// sigCheck is what allow granted a check: charged, a token of the
// address's bucket and one of all addresses'; exempt, a remembered
// signer's check.
type sigCheck struct{ charged, exempt bool }

func newHTTPSignatures(window time.Duration) *httpSignatures {
	return &httpSignatures{
		failures: NewTokenBuckets(badSignaturesPerSecond*60, badSignaturesAtOnce, badSignatureAddrs),
		all:      tokenBucket{tokens: allBadSignaturesAtOnce},
		signers:  list.New(),
		byKey:    map[signerKey]*signer{},
		byAddr:   map[string]*list.List{},
		verified: verifiedSignatures{window: window, byKey: map[verifiedKey]time.Time{}},
	}
}

// allow says whether pubkey's signature from addr is checked; when not,
// retry says when the address has a check again. A check allowed for a
// signer not remembered (or already being checked) takes a token of the
// address and one of all addresses, which outcome gives back unless the
// signature was bad.
func (h *httpSignatures) allow(addr, pubkey string, now time.Time) (check sigCheck, retry time.Duration, ok bool) {
	h.mu.Lock()
	if s := h.byKey[signerKey{addr, pubkey}]; s != nil && !s.checking {
		s.checking = true
		h.mu.Unlock()
		return sigCheck{exempt: true}, 0, true
	}
	h.mu.Unlock()
	if ok, retry = h.failures.Allow(addressCommunity, addr, now); !ok {
		return sigCheck{}, retry, false
	}
	h.mu.Lock()
	retry, ok = h.all.take(now, allBadSignaturesPerSecond, allBadSignaturesAtOnce)
	h.mu.Unlock()
	if !ok {
		h.failures.giveBack(addressCommunity, addr)
		return sigCheck{}, retry, false
	}
	return sigCheck{charged: true}, 0, true
}

// outcome records a check allowed by allow: a verified signer is
// remembered, a bad signature forgets its pubkey and keeps the tokens it
// took, if any.
func (h *httpSignatures) outcome(addr, pubkey string, check sigCheck, verified bool) {
	if check.charged && verified {
		h.failures.giveBack(addressCommunity, addr)
	}
	key := signerKey{addr, pubkey}
	h.mu.Lock()
	defer h.mu.Unlock()
	if check.charged && verified {
		h.all.tokens = min(h.all.tokens+1, allBadSignaturesAtOnce)
	}
	s := h.byKey[key]
	if check.exempt && s != nil {
		s.checking = false
	}
	switch {
	case verified && s != nil:
		h.signers.MoveToFront(s.inAll)
		h.byAddr[addr].MoveToFront(s.inAddr)
	case verified:
		own := h.byAddr[addr]
		switch {
		case own != nil && own.Len() >= signersPerAddr:
			h.forget(own.Back().Value.(*signer))
		case h.signers.Len() >= verifiedSigners:
			h.forget(h.signers.Back().Value.(*signer))
		}
		if own = h.byAddr[addr]; own == nil {
			own = list.New()
			h.byAddr[addr] = own
		}
		s = &signer{key: key}
		s.inAll = h.signers.PushFront(s)
		s.inAddr = own.PushFront(s)
		h.byKey[key] = s
	case s != nil:
		h.forget(s)
	}
}

// forget drops a remembered signer. Call with mu held.
func (h *httpSignatures) forget(s *signer) {
	h.signers.Remove(s.inAll)
	own := h.byAddr[s.key.addr]
	own.Remove(s.inAddr)
	if own.Len() == 0 {
		delete(h.byAddr, s.key.addr)
	}
	delete(h.byKey, s.key)
}

// verifiedSignatures remembers events whose signature verified, for as
// long as the same event may be sent again and pass (rememberedUntil): the
// same event sent again (a replayed header, or a Blossom token reused until
// it expires) has its id hashed and matched, its signature not checked
// again. Entries are kept in the order they were added; at most
// verifiedEvents are kept, the oldest added going first once full, and an
// expired one at the front goes as the next is added.
type verifiedSignatures struct {
	mu     sync.Mutex
	window time.Duration
	byKey  map[verifiedKey]time.Time // when each expires
	order  list.List                 // of verifiedKey, oldest first
}

// verifiedKey is an event's id and signature: the id commits to the rest.
type verifiedKey struct {
	id  [32]byte
	sig [64]byte
}

func keyOf(ev *nostr.Event) verifiedKey {
	return verifiedKey{id: ev.IDBytes(), sig: ev.SigBytes()}
}

// seen reports whether ev, whose id was checked against its content,
// carries a signature that verified and is still remembered.
func (v *verifiedSignatures) seen(ev *nostr.Event, now time.Time) bool {
	v.mu.Lock()
	defer v.mu.Unlock()
	until, ok := v.byKey[keyOf(ev)]
	return ok && now.Before(until)
}

// rememberedUntil is how long ev's verified signature is remembered from
// now: a NIP-98 event for the auth window, the longest its created_at may
// pass; a Blossom token until it expires (its id commits to the
// expiration tag, which every request checks again), at most
// verifiedTokenCap.
func (v *verifiedSignatures) rememberedUntil(ev *nostr.Event, now time.Time) time.Time {
	if ev.Kind != nostr.KindBlossomAuth {
		return now.Add(v.window)
	}
	expires, ok, err := ev.Expiration()
	if err != nil || !ok {
		return now.Add(v.window) // refused before its signature is checked
	}
	until := now.Add(verifiedTokenCap)
	if token := time.Unix(expires, 0); token.Before(until) {
		return token
	}
	return until
}

// add remembers ev's signature as verified at now.
func (v *verifiedSignatures) add(ev *nostr.Event, now time.Time) {
	key := keyOf(ev)
	v.mu.Lock()
	defer v.mu.Unlock()
	for v.order.Len() > 0 {
		oldest := v.order.Front()
		k := oldest.Value.(verifiedKey)
		if v.order.Len() < verifiedEvents && now.Before(v.byKey[k]) {
			break
		}
		v.order.Remove(oldest)
		delete(v.byKey, k)
	}
	until := v.rememberedUntil(ev, now)
	if was, ok := v.byKey[key]; ok {
		// Still here though forgotten: entries do not expire in the order
		// they were added (a Blossom token's outlives the NIP-98 events
		// added after it), so the loop above can leave an expired one.
		if until.After(was) {
			v.byKey[key] = until
		}
		return
	}
	v.byKey[key] = until
	v.order.PushBack(key)
}
