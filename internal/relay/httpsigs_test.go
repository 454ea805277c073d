package relay_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/buzzrelay/buzz/internal/clock"
	"github.com/buzzrelay/buzz/internal/dbtest"
	"github.com/buzzrelay/buzz/internal/nostr"
	"github.com/buzzrelay/buzz/internal/relay"
	"github.com/buzzrelay/buzz/internal/relaytest"
)

// A signed HTTP request's signature is checked last, and an address has a
// hundred bad signatures checked at once, then ten a second: past them its
// requests are refused 429 with Retry-After, unchecked, except those of a
// pubkey that verified from the address before, so a member behind the
// same address as the flooder is not locked out. A pubkey's bad signature
// forgets it. The clock stands still, so the bucket refills only when the
// test moves it.
// Mutations killed: no bucket (the 101st bad signature checked, 401); no
// exemption for a verified signer (the member refused 429).
func TestBadHTTPSignaturesPerAddressAreBounded(t *testing.T) {
	t.Parallel()
	clk := &stoppedClock{now: time.Now()}
	r := relaytest.StartWith(t, dbtest.Pool(t), []relay.Option{relay.WithClock(clock.Stub(clk.at))})
	body := encodeBody(t, query(map[string]any{"kinds": []int{1}}))
	signed := func(key *nostr.SecretKey, forge bool) string {
		ev := nip98(t, key, "POST", r.HTTPURL+"/query", body, nil)
		if forge { // the id still matches: only the signature is wrong
			ev.Sig = ev.Sig[:10] + map[bool]string{true: "0", false: "1"}[ev.Sig[10] != '0'] + ev.Sig[11:]
		}
		return authHeader(ev)
	}
	member, flooder := relaytest.NewKey(t), relaytest.NewKey(t)
	require.Equal(t, 200, send(t, r, "", "/query", signed(member, false), body).Status)

	for i := range 100 {
		got := send(t, r, "", "/query", signed(flooder, true), body)
		require.Equal(t, 401, got.Status, "bad signature %d is checked", i)
		require.Contains(t, got.Error, "auth-required: auth event: bad signature")
	}
	got := send(t, r, "", "/query", signed(flooder, true), body)
	require.Equal(t, 429, got.Status, "the 101st bad signature is not checked: %s", got.Raw)
	require.Contains(t, got.Error, "rate-limited: too many requests with bad signatures from this address")
	require.NotEmpty(t, got.Header.Get("Retry-After"))
	require.Equal(t, "1", metric(t, r, "buzz_http_auth_rate_limited_total"))

	require.Equal(t, 200, send(t, r, "", "/query", signed(member, false), body).Status, "a signer verified before is still checked")
	newcomer := relaytest.NewKey(t)
	require.Equal(t, 429, send(t, r, "", "/query", signed(newcomer, false), body).Status, "a new signer waits for the bucket")

	require.Equal(t, 401, send(t, r, "", "/query", signed(member, true), body).Status, "a bad signature in a verified signer's name is checked once")
	require.Equal(t, 429, send(t, r, "", "/query", signed(member, false), body).Status, "and forgets the signer")

	clk.advance(time.Second)
	require.Equal(t, 200, send(t, r, "", "/query", signed(newcomer, false), body).Status, "the bucket refills")
}
