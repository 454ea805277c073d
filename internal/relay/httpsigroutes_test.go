package relay_test

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"net/http"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/buzzrelay/buzz/internal/clock"
	"github.com/buzzrelay/buzz/internal/config"
	"github.com/buzzrelay/buzz/internal/dbtest"
	"github.com/buzzrelay/buzz/internal/media"
	"github.com/buzzrelay/buzz/internal/nostr"
	"github.com/buzzrelay/buzz/internal/outbox"
	"github.com/buzzrelay/buzz/internal/relay"
	"github.com/buzzrelay/buzz/internal/relaytest"
)

// forgeSig changes one digit of the signature in a "Nostr <base64 event>"
// header: its id still matches, only the signature is wrong.
func forgeSig(t *testing.T, header string) string {
	t.Helper()
	raw, err := base64.StdEncoding.DecodeString(header[len("Nostr "):])
	require.NoError(t, err)
	var ev map[string]any
	require.NoError(t, json.Unmarshal(raw, &ev))
	sig := ev["sig"].(string)
	digit := "0"
	if sig[10] == '0' {
		digit = "1"
	}
	ev["sig"] = sig[:10] + digit + sig[11:]
	raw, err = json.Marshal(ev)
	require.NoError(t, err)
	return "Nostr " + base64.StdEncoding.EncodeToString(raw)
}

// operatorRelay is a relay with media on and the operator registration API
// served for listenerKey at origin.
func operatorRelay(t *testing.T, listenerKey *nostr.SecretKey, origin string, opts ...relay.Option) *relaytest.Relay {
	t.Helper()
	svc := media.NewService(mediaStores["fs"](t), media.Limits{MaxBytes: testMediaMaxBytes, AllowedTypes: config.DefaultMediaTypes, TempDir: t.TempDir()}, nil)
	r := relaytest.StartWith(t, dbtest.Pool(t), append([]relay.Option{relay.WithMedia(svc)}, opts...))
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	require.NoError(t, r.Server.StartOperatorListeners(ctx, outbox.Config{
		Listeners: outbox.Routes{listenerKey.PublicKeyHex(): "https://listener.invalid/wake"},
		Timeout:   5 * time.Second,
		APIOrigin: origin,
	}, r.CommunityID))
	return r
}

// Every route that takes a signed Authorization header checks its
// signature: decoding the header checks none, so each caller must. A
// header whose signature alone is wrong is refused 401 with its JSON (a
// HEAD, which has no body, with its reason in X-Reason), on the bridge,
// the media upload (PUT), its preflight (HEAD) and delete, each with a
// NIP-98 and a Blossom header, and the operator registration API.
// Mutations killed: media's NIP-98 branch returning the event unchecked
// (the NIP-98 media rows answer 200 or 404); verifyOperatorAuth returning
// it unchecked (the operator row answers 200).
func TestEveryHTTPSignatureRouteRefusesABadSignature(t *testing.T) {
	t.Parallel()
	const origin = "https://ops.example"
	listenerKey := relaytest.NewKey(t)
	r := operatorRelay(t, listenerKey, origin)
	key := relaytest.NewKey(t)
	blob := pngBlob(t, 700)
	sha := hexSHA(blob)
	require.Equal(t, http.StatusOK, upload(t, r, "", key, blob).Status)
	queryBody := encodeBody(t, query(map[string]any{"kinds": []int{1}}))
	opBody := []byte(`{"pubkeys":["` + relaytest.NewKey(t).PublicKeyHex() + `"]}`)
	uploadURL := r.HTTPURL + "/media/upload"
	deleteURL := r.HTTPURL + "/media/" + sha

	for _, tc := range []struct {
		name, method, path, auth string
		body                     []byte
	}{
		{"bridge POST /query", http.MethodPost, "/query", authHeader(nip98(t, key, "POST", r.HTTPURL+"/query", queryBody, nil)), queryBody},
		{"media PUT, NIP-98", http.MethodPut, "/media/upload", authHeader(nip98(t, key, "PUT", uploadURL, blob, nil)), blob},
		{"media PUT, Blossom", http.MethodPut, "/media/upload", blossomAuth(t, key, "upload", []string{sha}, nil), blob},
		{"media HEAD, NIP-98", http.MethodHead, "/media/upload", authHeader(nip98(t, key, "PUT", uploadURL, nil, nil)), nil},
		{"media HEAD, Blossom", http.MethodHead, "/media/upload", blossomAuth(t, key, "upload", []string{sha}, nil), nil},
		{"media DELETE, NIP-98", http.MethodDelete, "/media/" + sha, authHeader(nip98(t, key, "DELETE", deleteURL, nil, nil)), nil},
		{"media DELETE, Blossom", http.MethodDelete, "/media/" + sha, blossomAuth(t, key, "delete", []string{sha}, nil), nil},
		{"operator POST", http.MethodPost, outbox.RegistrationPath, authHeader(nip98(t, listenerKey, "POST", origin+outbox.RegistrationPath, opBody, nil)), opBody},
		{"operator DELETE", http.MethodDelete, outbox.RegistrationPath, authHeader(nip98(t, listenerKey, "DELETE", origin+outbox.RegistrationPath, opBody, nil)), opBody},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := mediaDo(t, r, tc.method, "", tc.path, forgeSig(t, tc.auth), bytes.NewReader(tc.body), nil)
			require.Equal(t, http.StatusUnauthorized, got.Status, "%s", got.Body)
			if tc.method == http.MethodHead {
				require.Contains(t, got.Header.Get("X-Reason"), "auth-required: auth event: bad signature")
				return
			}
			require.Equal(t, "application/json", got.Header.Get("Content-Type"))
			require.Contains(t, got.Error, "auth-required: ")
			require.Contains(t, got.Error, "bad signature")
		})
	}
	require.Equal(t, http.StatusOK, mediaDo(t, r, http.MethodGet, "", "/media/"+sha, "", nil, nil).Status, "the blob is still served")
}

// stoppedClock is a relay clock that moves only when the test moves it.
type stoppedClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *stoppedClock) at() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.now }

func (c *stoppedClock) advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

// The operator registration API is served on the public listener, so its
// bad signatures are bounded per address like the bridge's: past a
// hundred, its requests are answered 429 with Retry-After and the JSON
// rate-limited: error, unchecked.
// Mutation killed: verifyOperatorAuth checking the signature itself,
// unbounded (the 101st bad signature answered 401).
func TestOperatorAPIBadSignaturesAreBounded(t *testing.T) {
	t.Parallel()
	const origin = "https://ops.example"
	clk := &stoppedClock{now: time.Now()}
	listenerKey := relaytest.NewKey(t)
	r := operatorRelay(t, listenerKey, origin, relay.WithClock(clock.Stub(clk.at)))
	body := []byte(`{"pubkeys":["` + relaytest.NewKey(t).PublicKeyHex() + `"]}`)
	forged := func() *nostr.Event {
		ev := nip98(t, listenerKey, "POST", origin+outbox.RegistrationPath, body, nil)
		ev.Sig = ev.Sig[:10] + map[bool]string{true: "0", false: "1"}[ev.Sig[10] != '0'] + ev.Sig[11:]
		return ev
	}
	for i := range 100 {
		got := operatorRequest(t, r, http.MethodPost, "", body, forged())
		require.Equal(t, http.StatusUnauthorized, got.Status, "bad signature %d is checked: %s", i, got.Raw)
	}
	req, err := http.NewRequest(http.MethodPost, r.HTTPURL+outbox.RegistrationPath, bytes.NewReader(body))
	require.NoError(t, err)
	req.Header.Set("Authorization", authHeader(forged()))
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	var reply struct{ Error string }
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&reply))
	require.Equal(t, http.StatusTooManyRequests, resp.StatusCode, reply.Error)
	require.Equal(t, "application/json", resp.Header.Get("Content-Type"))
	require.Contains(t, reply.Error, "rate-limited: too many requests with bad signatures from this address")
	require.Equal(t, "1", resp.Header.Get("Retry-After"))

	clk.advance(time.Second)
	got := operatorRequest(t, r, http.MethodPost, "", body, nip98(t, listenerKey, "POST", origin+outbox.RegistrationPath, body, nil))
	require.Equal(t, http.StatusOK, got.Status, "the bucket refills: %s", got.Raw)
}

// A signature that verified is not checked again within the auth window:
// a replayed NIP-98 header, refused as a replay, and a Blossom token
// reused for the upload preflight cost a hash each, not a signature check.
// Counted by the relay's own count of signatures checked.
// Mutation killed: no memory of verified signatures (20 and 21 checks).
func TestVerifiedHTTPSignaturesAreNotCheckedAgain(t *testing.T) {
	t.Parallel()
	r := mediaRelay(t, mediaStores["fs"](t))
	key := relaytest.NewKey(t)
	body := encodeBody(t, query(map[string]any{"kinds": []int{1}}))
	header := authHeader(nip98(t, key, "POST", r.HTTPURL+"/query", body, nil))
	require.Equal(t, http.StatusOK, send(t, r, "", "/query", header, body).Status)
	for range 19 {
		got := send(t, r, "", "/query", header, body)
		require.Equal(t, http.StatusUnauthorized, got.Status)
		require.Contains(t, got.Error, "already used")
	}
	require.Equal(t, "1", metric(t, r, "buzz_http_auth_signatures_checked_total"), "19 replays, no check")

	token := blossomAuth(t, key, "upload", []string{hexSHA(pngBlob(t, 700))}, nil)
	for range 20 {
		require.Equal(t, http.StatusOK, mediaDo(t, r, http.MethodHead, "", "/media/upload", token, nil, nil).Status)
	}
	require.Equal(t, "2", metric(t, r, "buzz_http_auth_signatures_checked_total"), "one token, one check")
}

// An x-auth-tag attestation whose signature does not authorize the agent is
// checked after the request's auth event is claimed: one valid header sent
// again with a bad attestation has it checked once, then is refused as a
// replay, unchecked.
// Mutation killed: the attestation checked before the claim (five checks,
// five 401s naming the attestation).
func TestBadAttestationIsCheckedOncePerSignedRequest(t *testing.T) {
	t.Parallel()
	r := relaytest.Start(t)
	agent, owner := relaytest.NewKey(t), relaytest.NewKey(t)
	// An attestation naming someone else: it does not authorize agent.
	tag := tagJSON(t, attest(t, owner, relaytest.NewKey(t).PublicKeyHex(), ""))
	body := encodeBody(t, query(map[string]any{"kinds": []int{1}}))
	header := authHeader(nip98(t, agent, "POST", r.HTTPURL+"/query", body, nil))
	status, out := sendWithTag(t, r, http.MethodPost, "/query", header, tag, body)
	require.Equal(t, http.StatusUnauthorized, status)
	require.Contains(t, out["error"], "x-auth-tag header")
	for range 4 {
		status, out = sendWithTag(t, r, http.MethodPost, "/query", header, tag, body)
		require.Equal(t, http.StatusUnauthorized, status)
		require.Contains(t, out["error"], "already used")
	}
	require.Equal(t, "1", metric(t, r, `buzz_owner_attestations_total{result="invalid"}`))
}

// A Blossom token's verified signature is remembered until the token
// expires, at most an hour: a token reused past the auth window from its
// first check is matched by its hash, not checked again every minute; one
// that lasts longer than the cap is checked once an hour. On the relay's
// stopped clock, counted by its own count of signatures checked.
// Mutations killed: every token remembered for the auth window only (4
// checks after 5 minutes); no cap (still 2 after 61 minutes).
func TestBlossomTokenSignatureIsRememberedUntilItExpires(t *testing.T) {
	t.Parallel()
	clk := &stoppedClock{now: time.Now()}
	svc := media.NewService(mediaStores["fs"](t), media.Limits{MaxBytes: testMediaMaxBytes, AllowedTypes: config.DefaultMediaTypes, TempDir: t.TempDir()}, nil)
	r := relaytest.StartWith(t, dbtest.Pool(t), []relay.Option{relay.WithMedia(svc), relay.WithClock(clock.Stub(clk.at))})
	key := relaytest.NewKey(t)
	hash := hexSHA(pngBlob(t, 700))
	token := func(lasts time.Duration) string {
		return blossomAuth(t, key, "upload", []string{hash}, func(ev *nostr.Event) {
			ev.CreatedAt = clk.at().Unix()
			for _, tag := range ev.Tags {
				if tag[0] == "expiration" {
					tag[1] = strconv.FormatInt(clk.at().Add(lasts).Unix(), 10)
				}
			}
		})
	}
	preflight := func(token string) int {
		return mediaDo(t, r, http.MethodHead, "", "/media/upload", token, nil, nil).Status
	}
	checks := func() string { return metric(t, r, "buzz_http_auth_signatures_checked_total") }

	start := clk.at()
	halfHour, threeHours := token(30*time.Minute), token(3*time.Hour)
	require.Equal(t, http.StatusOK, preflight(halfHour))
	require.Equal(t, http.StatusOK, preflight(threeHours))
	require.Equal(t, "2", checks())

	clk.advance(5 * time.Minute) // five auth windows later
	require.Equal(t, http.StatusOK, preflight(halfHour))
	require.Equal(t, http.StatusOK, preflight(threeHours))
	require.Equal(t, "2", checks(), "remembered past the auth window")

	clk.advance(start.Add(31 * time.Minute).Sub(clk.at()))
	require.Equal(t, http.StatusUnauthorized, preflight(halfHour), "expired")
	require.Equal(t, http.StatusOK, preflight(threeHours))
	require.Equal(t, "2", checks())

	clk.advance(start.Add(61 * time.Minute).Sub(clk.at()))
	require.Equal(t, http.StatusOK, preflight(threeHours))
	require.Equal(t, "3", checks(), "checked again after the cap")
	require.Equal(t, http.StatusOK, preflight(threeHours))
	require.Equal(t, "3", checks(), "and remembered again")
}

// A signature forgotten when its memory ran out while the event may still
// pass (a NIP-98 event dated ahead of the relay's clock passes for up to
// two auth windows, remembered for one) is remembered again once it is
// checked again, even behind a Blossom token remembered longer: entries no
// longer expire in the order they were added, so the forgotten one is
// still in the memory when it is checked again. On the relay's stopped
// clock, counted by its own count of signatures checked.
// Mutation killed: add leaving a key already present as it was (its
// expired time kept; every later request checks the signature: 4, not 3).
func TestHTTPSignatureIsRememberedAgainBehindALongerOne(t *testing.T) {
	t.Parallel()
	clk := &stoppedClock{now: time.Now()}
	svc := media.NewService(mediaStores["fs"](t), media.Limits{MaxBytes: testMediaMaxBytes, AllowedTypes: config.DefaultMediaTypes, TempDir: t.TempDir()}, nil)
	r := relaytest.StartWith(t, dbtest.Pool(t), []relay.Option{relay.WithMedia(svc), relay.WithClock(clock.Stub(clk.at))})
	key := relaytest.NewKey(t)
	hash := hexSHA(pngBlob(t, 700))
	preflight := func(token string) int {
		return mediaDo(t, r, http.MethodHead, "", "/media/upload", token, nil, nil).Status
	}
	checks := func() string { return metric(t, r, "buzz_http_auth_signatures_checked_total") }

	start := clk.at()
	token := blossomAuth(t, key, "upload", []string{hash}, func(ev *nostr.Event) {
		ev.CreatedAt = start.Unix()
		for _, tag := range ev.Tags {
			if tag[0] == "expiration" {
				tag[1] = strconv.FormatInt(start.Add(3*time.Hour).Unix(), 10)
			}
		}
	})
	require.Equal(t, http.StatusOK, preflight(token))
	ahead := authHeader(nip98(t, key, http.MethodPut, r.HTTPURL+"/media/upload", nil, func(ev *nostr.Event) {
		ev.CreatedAt = start.Add(50 * time.Second).Unix()
	}))
	require.Equal(t, http.StatusOK, preflight(ahead))
	require.Equal(t, "2", checks())

	clk.advance(61 * time.Second) // forgotten; it still passes for 49 s
	require.Equal(t, http.StatusOK, preflight(ahead))
	require.Equal(t, "3", checks(), "checked again once forgotten")
	require.Equal(t, http.StatusOK, preflight(ahead))
	require.Equal(t, "3", checks(), "and remembered again")
}
