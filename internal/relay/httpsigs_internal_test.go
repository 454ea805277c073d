package relay

import (
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// Bad signatures from many addresses, each within its own bucket (IPv6
// /64s past the address memory, a botnet), share one bucket of all: on a
// stopped clock, 1,000 are checked, the next address is refused with a
// retry, and a verified check gives its token back.
// Mutation killed: no bucket of all (the 1,001st address allowed).
func TestBadHTTPSignaturesOfAllAddressesAreBounded(t *testing.T) {
	h := newHTTPSignatures(time.Minute)
	now := time.Now()
	for i := range allBadSignaturesAtOnce {
		check, _, ok := h.allow(fmt.Sprintf("addr-%d", i), "key", now)
		require.True(t, ok, "address %d", i)
		h.outcome(fmt.Sprintf("addr-%d", i), "key", check, false)
	}
	_, retry, ok := h.allow("one more", "key", now)
	require.False(t, ok, "the bucket of all is spent")
	require.Positive(t, retry)

	now = now.Add(time.Second / allBadSignaturesPerSecond)
	check, _, ok := h.allow("one more", "key", now)
	require.True(t, ok, "it refills")
	h.outcome("one more", "key", check, true)
	_, _, ok = h.allow("yet another", "key", now)
	require.True(t, ok, "a check that verified gave its token back")
}

// One address's verified throwaway keys push out only its own oldest
// signers: another address's member stays remembered, exempt from the
// bucket.
// Mutation killed: no cap per address (the member forgotten by the
// 10,000 keys of another address).
func TestOneAddressSignersDoNotEvictOthers(t *testing.T) {
	h := newHTTPSignatures(time.Minute)
	now := time.Now()
	check, _, ok := h.allow("member-addr", "member", now)
	require.True(t, ok)
	h.outcome("member-addr", "member", check, true)
	for i := range verifiedSigners {
		key := fmt.Sprintf("throwaway-%d", i)
		check, _, ok := h.allow("flooder", key, now)
		require.True(t, ok)
		h.outcome("flooder", key, check, true)
	}
	require.Equal(t, signersPerAddr, h.byAddr["flooder"].Len())
	check, _, ok = h.allow("member-addr", "member", now)
	require.True(t, ok)
	require.True(t, check.exempt, "the member is still remembered")
}

// A remembered signer is exempt for one check at a time: 50 requests in
// its name at once, from an address whose bucket is spent, get one check
// between them before any finishes; the rest are refused unchecked. So 50
// bad signatures in a remembered name cost one check, not 50.
// Mutation killed: the known-check and the mark apart (all 50 allowed).
func TestARememberedSignerIsExemptForOneCheckAtATime(t *testing.T) {
	h := newHTTPSignatures(time.Minute)
	now := time.Now()
	check, _, ok := h.allow("addr", "member", now)
	require.True(t, ok)
	h.outcome("addr", "member", check, true)
	for range badSignaturesAtOnce {
		check, _, ok := h.allow("addr", "flooder", now)
		require.True(t, ok)
		h.outcome("addr", "flooder", check, false)
	}
	var allowed atomic.Int32
	var wg sync.WaitGroup
	for range 50 {
		wg.Go(func() {
			if _, _, ok := h.allow("addr", "member", now); ok {
				allowed.Add(1)
			}
		})
	}
	wg.Wait()
	require.Equal(t, int32(1), allowed.Load())
}
