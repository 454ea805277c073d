package relay_test

import (
	"bytes"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/buzzrelay/buzz/internal/config"
	"github.com/buzzrelay/buzz/internal/dbtest"
	"github.com/buzzrelay/buzz/internal/nostr"
	"github.com/buzzrelay/buzz/internal/relay"
	"github.com/buzzrelay/buzz/internal/relaytest"
)

// bridgeHTTP's timeout is a failure bound only, as long as a WebSocket
// reply's (relaytest.Patience).
var bridgeHTTP = &http.Client{Timeout: relaytest.Patience}

// nip98 builds a signed kind 27235 auth event for (method, url, body);
// mutate, when given, changes the event before it is signed. The replay
// guard keys on the event id, which the signature does not change, so two
// identical requests signed in the same second would share one auth event:
// like a client repeating a request, the helper adds a random nonce tag.
func nip98(t *testing.T, key *nostr.SecretKey, method, url string, body []byte, mutate func(*nostr.Event)) *nostr.Event {
	t.Helper()
	sum := sha256.Sum256(body)
	ev := &nostr.Event{
		Kind:      nostr.KindHTTPAuth,
		CreatedAt: time.Now().Unix(),
		Tags: nostr.Tags{
			{"u", url}, {"method", method}, {"payload", hex.EncodeToString(sum[:])},
			{"nonce", uuid.NewString()},
		},
	}
	if mutate != nil {
		mutate(ev)
	}
	require.NoError(t, ev.Sign(key))
	return ev
}

// authEventUsed is the relay's answer to a replayed NIP-98 auth event.
const authEventUsed = "auth event already used; sign a new one for every request " +
	"(identical requests signed in the same second are one event: add a nonce tag or vary created_at)"

func authHeader(ev *nostr.Event) string {
	b, _ := ev.MarshalJSON()
	return "Nostr " + base64.StdEncoding.EncodeToString(b)
}

type bridgeReply struct {
	Status int
	Header http.Header
	Raw    string
	Error  string         `json:"error"`
	ID     string         `json:"id"`
	OK     *bool          `json:"accepted"`
	Msg    string         `json:"message"`
	Count  int64          `json:"count"`
	Events []*nostr.Event `json:"events"`
}

// send posts body to path on r as host ("" = the home community) with the
// given Authorization header ("" = none).
func send(t *testing.T, r *relaytest.Relay, host, path, authorization string, body []byte) bridgeReply {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, r.HTTPURL+path, bytes.NewReader(body))
	require.NoError(t, err)
	if host != "" {
		req.Host = host
	}
	if authorization != "" {
		req.Header.Set("Authorization", authorization)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := bridgeHTTP.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	out := bridgeReply{Status: resp.StatusCode, Header: resp.Header, Raw: string(raw)}
	require.Equal(t, "application/json", resp.Header.Get("Content-Type"), "%s", raw)
	require.NoError(t, json.Unmarshal(raw, &out), "%s", raw)
	return out
}

// post signs a fresh auth event for the request as key and sends it.
func post(t *testing.T, r *relaytest.Relay, key *nostr.SecretKey, path string, body any) bridgeReply {
	t.Helper()
	b := encodeBody(t, body)
	return send(t, r, "", path, authHeader(nip98(t, key, "POST", r.HTTPURL+path, b, nil)), b)
}

func encodeBody(t *testing.T, body any) []byte {
	t.Helper()
	switch v := body.(type) {
	case []byte:
		return v
	case string:
		return []byte(v)
	}
	b, err := json.Marshal(body)
	require.NoError(t, err)
	return b
}

func query(filters ...map[string]any) map[string]any { return map[string]any{"filters": filters} }

// An answer larger than the part /query holds before streaming arrives
// whole and well-formed through a real HTTP client: newest first, every
// event once.
func TestHTTPQueryStreamsALargeAnswer(t *testing.T) {
	t.Parallel()
	r := relaytest.Start(t)
	key := relaytest.NewKey(t)
	ws := r.Dial(t, "")
	ws.Auth(key)
	big := strings.Repeat("x", 60<<10)
	var want []string
	now := time.Now().Unix()
	for i := range 24 { // about 1.5 MB of answer
		ev := ws.Sign(1, fmt.Sprint(i, big), nil, now-100+int64(i))
		require.True(t, ws.Publish(ev).OK)
		want = append([]string{ev.ID}, want...)
	}
	got := post(t, r, key, "/query", query(map[string]any{"kinds": []int{1}}))
	require.Equal(t, http.StatusOK, got.Status)
	require.Greater(t, len(got.Raw), 1<<20)
	require.Equal(t, want, ids(got.Events))
}

func TestHTTPBridgeRoundTrip(t *testing.T) {
	t.Parallel()
	r := relaytest.Start(t)
	key := relaytest.NewKey(t)
	ws := r.Dial(t, "")
	ws.Auth(key)

	// Posted over HTTP, read over WebSocket.
	viaHTTP := relaytest.SignEvent(t, key, 1, "hello over http", nil, time.Now().Unix()-10)
	got := post(t, r, key, "/events", viaHTTP)
	require.Equal(t, http.StatusOK, got.Status, got.Raw)
	require.Equal(t, viaHTTP.ID, got.ID)
	require.True(t, *got.OK)
	require.Empty(t, got.Msg)
	require.Equal(t, []string{viaHTTP.ID}, ids(ws.Req("a", map[string]any{"kinds": []int{1}})))

	// Posted again: accepted, reported as a duplicate.
	got = post(t, r, key, "/events", viaHTTP)
	require.Equal(t, http.StatusOK, got.Status, got.Raw)
	require.True(t, *got.OK)
	require.Equal(t, "duplicate: already have this event", got.Msg)

	// Posted over WebSocket, read over HTTP: newest first, exact NIP-01 objects.
	viaWS := ws.Sign(1, "hello <over> & ws", nil, 0)
	require.True(t, ws.Publish(viaWS).OK)
	got = post(t, r, key, "/query", query(map[string]any{"kinds": []int{1}}))
	require.Equal(t, http.StatusOK, got.Status, got.Raw)
	require.Equal(t, []string{viaWS.ID, viaHTTP.ID}, ids(got.Events))
	for _, ev := range got.Events {
		require.NoError(t, ev.Verify())
	}
	require.Contains(t, got.Raw, `"content":"hello <over> & ws"`, "events are written as NIP-01 JSON, not HTML-escaped")

	got = post(t, r, key, "/count", query(map[string]any{"kinds": []int{1}}, map[string]any{"authors": []string{key.PublicKeyHex()}}))
	require.Equal(t, http.StatusOK, got.Status, got.Raw)
	require.Equal(t, int64(2), got.Count)

	got = post(t, r, key, "/query", query(map[string]any{"kinds": []int{7}}))
	require.Equal(t, http.StatusOK, got.Status, got.Raw)
	require.JSONEq(t, `{"events":[]}`, got.Raw)

	// A bad signature passes the parser and is refused by the write spine.
	forged := relaytest.SignEvent(t, key, 1, "forged", nil, 0)
	forged.Sig = strings.Repeat("0", 128)
	got = post(t, r, key, "/events", forged)
	require.Equal(t, http.StatusBadRequest, got.Status, got.Raw)
	require.False(t, *got.OK)
	require.True(t, strings.HasPrefix(got.Msg, "invalid: "), got.Msg)

	// Requests are counted by route and status; NIP-11 lists NIP-98.
	resp, err := bridgeHTTP.Get(r.MetricsURL + "/metrics")
	require.NoError(t, err)
	metrics, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.Contains(t, string(metrics), `buzz_http_bridge_requests_total{route="/events",status="200"} 2`)
	require.Contains(t, string(metrics), `buzz_http_bridge_requests_total{route="/events",status="400"} 1`)
	require.Contains(t, string(metrics), `buzz_http_bridge_requests_total{route="/query",status="200"} 2`)
	req, _ := http.NewRequest("GET", r.HTTPURL+"/info", nil)
	resp, err = bridgeHTTP.Do(req)
	require.NoError(t, err)
	var info struct {
		SupportedNIPs []int `json:"supported_nips"`
	}
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&info))
	resp.Body.Close()
	require.Contains(t, info.SupportedNIPs, 98)
}

func TestHTTPBridgeAuthFailures(t *testing.T) {
	t.Parallel()
	r := relaytest.Start(t)
	key := relaytest.NewKey(t)
	body := []byte(`{"filters":[{"kinds":[1]}]}`)
	url := r.HTTPURL + "/count"
	signed := func(mutate func(*nostr.Event)) string { return authHeader(nip98(t, key, "POST", url, body, mutate)) }
	setTag := func(name, value string) func(*nostr.Event) {
		return func(ev *nostr.Event) {
			for _, tag := range ev.Tags {
				if tag[0] == name {
					tag[1] = value
				}
			}
		}
	}
	badSig := nip98(t, key, "POST", url, body, nil)
	badSig.Sig = tamperedSig(badSig.Sig)
	badID := nip98(t, key, "POST", url, body, nil)
	badID.Content = "tampered after signing"
	raw, _ := nip98(t, key, "POST", url, body, nil).MarshalJSON()

	for name, tc := range map[string]struct{ header, reason string }{
		"missing header":   {"", "missing Authorization header"},
		"wrong scheme":     {"Bearer abc", "Authorization scheme must be Nostr"},
		"bad base64":       {"Nostr %%%not-base64%%%", "not valid base64"},
		"not an event":     {"Nostr " + base64.StdEncoding.EncodeToString([]byte(`{"kind":27235}`)), "auth event: "},
		"bad signature":    {authHeader(badSig), "auth event: bad signature"},
		"bad id":           {authHeader(badID), "auth event id does not match its content"},
		"wrong kind":       {signed(func(ev *nostr.Event) { ev.Kind = nostr.KindAuth }), "auth event must be kind 27235"},
		"expired":          {signed(func(ev *nostr.Event) { ev.CreatedAt -= 120 }), "auth event expired"},
		"future":           {signed(func(ev *nostr.Event) { ev.CreatedAt += 120 }), "created_at is in the future"},
		"no u tag":         {signed(setTag("u", "")), "u tag does not match this URL"},
		"wrong path":       {signed(setTag("u", r.HTTPURL+"/query")), "u tag does not match this URL"},
		"wrong scheme u":   {signed(setTag("u", strings.Replace(url, "http://", "https://", 1))), "u tag does not match this URL"},
		"wrong query":      {signed(setTag("u", url+"?x=1")), "u tag does not match this URL"},
		"wrong method":     {signed(setTag("method", "GET")), "method tag does not match"},
		"payload mismatch": {signed(setTag("payload", strings.Repeat("ab", 32))), "payload tag does not match"},
	} {
		got := send(t, r, "", "/count", tc.header, body)
		require.Equal(t, http.StatusUnauthorized, got.Status, "%s: %s", name, got.Raw)
		require.Equal(t, "Nostr", got.Header.Get("WWW-Authenticate"), name)
		require.Contains(t, got.Error, tc.reason, name)
	}

	// Unpadded base64 is accepted; each auth event authorizes one request.
	header := "Nostr " + base64.RawStdEncoding.EncodeToString(raw)
	first := send(t, r, "", "/count", header, body)
	require.Equal(t, http.StatusOK, first.Status, first.Raw)
	replay := send(t, r, "", "/count", header, body)
	require.Equal(t, http.StatusUnauthorized, replay.Status, replay.Raw)
	require.Equal(t, "auth-required: "+authEventUsed, replay.Error)
	require.Equal(t, "Nostr", replay.Header.Get("WWW-Authenticate"))

	// A refused request does not burn its auth event: the payload check runs
	// before the claim.
	ev := nip98(t, key, "POST", url, body, nil)
	require.Equal(t, http.StatusUnauthorized, send(t, r, "", "/count", authHeader(ev), []byte(`{"filters":[{}]}`)).Status)
	require.Equal(t, http.StatusOK, send(t, r, "", "/count", authHeader(ev), body).Status)

	// Normalization: scheme and host case, loopback spellings, one trailing
	// slash, the method's case.
	port := r.HTTPURL[strings.LastIndex(r.HTTPURL, ":"):]
	for _, u := range []string{"HTTP://LOCALHOST" + port + "/count/", "http://[::1]" + port + "/count", "http://127.0.0.1" + port + "/count"} {
		ev := nip98(t, key, "post", u, body, nil)
		got := send(t, r, "", "/count", authHeader(ev), body)
		require.Equal(t, http.StatusOK, got.Status, "%s: %s", u, got.Raw)
	}

	// X-Forwarded-Proto counts only from a configured proxy (see
	// TestForwardedHeadersOnlyFromTrustedProxies); this relay trusts none.
	ev = nip98(t, key, "POST", strings.Replace(url, "http://", "https://", 1), body, nil)
	req, _ := http.NewRequest(http.MethodPost, url, bytes.NewReader(body))
	req.Header.Set("Authorization", authHeader(ev))
	req.Header.Set("X-Forwarded-Proto", "https")
	resp, err := bridgeHTTP.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusUnauthorized, resp.StatusCode)

	// Used claims are rows of this community, expiring after window + slack.
	var rows int
	require.NoError(t, r.Pool.QueryRow(t.Context(), `
		SELECT count(*) FROM http_auth_replays
		WHERE community_id = $1 AND expires_at > now() + interval '90 seconds'`, r.CommunityID).Scan(&rows))
	require.Equal(t, 5, rows)
}

// Two identical requests signed without a nonce in the same second are one
// auth event: the second is a replay, and the refusal says how to make the
// next one differ; a nonce tag does. Mutation killed: the replay answer
// without the nonce/created_at advice leaves a client re-signing the same
// event forever.
func TestHTTPBridgeReplayAdviceNamesTheNonce(t *testing.T) {
	t.Parallel()
	r := relaytest.Start(t)
	key := relaytest.NewKey(t)
	body := encodeBody(t, query(map[string]any{"kinds": []int{1}, "limit": 1}))
	now := time.Now().Unix()
	sign := func(nonce string) string {
		return authHeader(nip98(t, key, "POST", r.HTTPURL+"/count", body, func(ev *nostr.Event) {
			ev.Tags = ev.Tags[:3] // u, method, payload
			if nonce != "" {
				ev.Tags = append(ev.Tags, nostr.Tag{"nonce", nonce})
			}
			ev.CreatedAt = now
		}))
	}
	first := send(t, r, "", "/count", sign(""), body)
	require.Equal(t, http.StatusOK, first.Status, first.Raw)
	second := send(t, r, "", "/count", sign(""), body)
	require.Equal(t, http.StatusUnauthorized, second.Status, second.Raw)
	require.Equal(t, "auth-required: "+authEventUsed, second.Error)
	require.Contains(t, second.Error, "nonce")
	withNonce := send(t, r, "", "/count", sign(uuid.NewString()), body)
	require.Equal(t, http.StatusOK, withNonce.Status, withNonce.Raw)
}

func TestHTTPBridgeUnknownHostIs404BeforeAuth(t *testing.T) {
	t.Parallel()
	r := relaytest.Start(t)
	for _, path := range []string{"/events", "/query", "/count"} {
		got := send(t, r, "unknown.example", path, "", []byte(`{}`))
		require.Equal(t, http.StatusNotFound, got.Status, got.Raw)
		require.Equal(t, "invalid: no community is served at this host", got.Error)
		require.Empty(t, got.Header.Get("WWW-Authenticate"))
	}
}

func TestHTTPBridgeReadAccessControl(t *testing.T) {
	t.Parallel()
	r := relaytest.Start(t)
	owner := r.Dial(t, "")
	ownerKey := owner.Auth(nil)
	outsider := relaytest.NewKey(t)
	ch := createChannel(t, owner, "secret", true)
	secret := owner.Sign(9, "the secret", nostr.Tags{{"h", ch}}, 0)
	require.True(t, owner.Publish(secret).OK)

	got := post(t, r, outsider, "/query", query(map[string]any{}))
	require.Equal(t, http.StatusOK, got.Status, got.Raw)
	require.NotContains(t, ids(got.Events), secret.ID)
	got = post(t, r, outsider, "/count", query(map[string]any{"kinds": []int{9}}))
	require.Equal(t, http.StatusOK, got.Status, got.Raw)
	require.Zero(t, got.Count)
	for _, path := range []string{"/query", "/count"} {
		got = post(t, r, outsider, path, query(map[string]any{"#h": []string{ch}}))
		require.Equal(t, http.StatusForbidden, got.Status, got.Raw)
		require.Equal(t, "restricted: not a channel member", got.Error)
	}
	got = post(t, r, outsider, "/query", query(map[string]any{"kinds": []int{1059}}))
	require.Equal(t, http.StatusForbidden, got.Status, got.Raw)
	require.Contains(t, got.Error, "restricted: kind 1059")

	// The member reads it, pinned or not; and cannot be impersonated.
	got = post(t, r, ownerKey, "/query", query(map[string]any{"#h": []string{ch}, "kinds": []int{9}}))
	require.Equal(t, http.StatusOK, got.Status, got.Raw)
	require.Equal(t, []string{secret.ID}, ids(got.Events))
	intruding := relaytest.SignEvent(t, outsider, 9, "let me in", nostr.Tags{{"h", ch}}, 0)
	got = post(t, r, outsider, "/events", intruding)
	require.Equal(t, http.StatusForbidden, got.Status, got.Raw)
	require.False(t, *got.OK)
	require.True(t, strings.HasPrefix(got.Msg, "restricted: "), got.Msg)
}

func TestHTTPBridgeAuthorRule(t *testing.T) {
	t.Parallel()
	r := relaytest.Start(t)
	alice, mallory := relaytest.NewKey(t), relaytest.NewKey(t)
	alicesNote := relaytest.SignEvent(t, alice, 1, "mine", nil, 0)
	got := post(t, r, mallory, "/events", alicesNote)
	require.Equal(t, http.StatusForbidden, got.Status, got.Raw)
	require.Equal(t, alicesNote.ID, got.ID)
	require.False(t, *got.OK)
	require.Equal(t, "restricted: event pubkey must match the authenticated pubkey", got.Msg)

	// Gift wraps are signed by a throwaway key, as on WebSocket.
	wrap := relaytest.SignEvent(t, relaytest.NewKey(t), 1059, "ciphertext", nostr.Tags{{"p", alice.PublicKeyHex()}}, 0)
	got = post(t, r, mallory, "/events", wrap)
	require.Equal(t, http.StatusOK, got.Status, got.Raw)
	got = post(t, r, alice, "/query", query(map[string]any{"kinds": []int{1059}, "#p": []string{alice.PublicKeyHex()}}))
	require.Equal(t, []string{wrap.ID}, ids(got.Events))
}

func TestHTTPBridgeBadBodies(t *testing.T) {
	t.Parallel()
	r := relaytest.Start(t, func(c *config.Config) { c.MaxMessageBytes = 2048; c.MaxFilters = 2 })
	key := relaytest.NewKey(t)

	big := relaytest.SignEvent(t, key, 1, strings.Repeat("x", 4096), nil, 0)
	got := post(t, r, key, "/events", big)
	require.Equal(t, http.StatusRequestEntityTooLarge, got.Status, got.Raw)
	require.Equal(t, "invalid: body exceeds the 2048-byte limit", got.Error)

	for _, tc := range []struct{ path, body, reason string }{
		{"/events", `{"kind":1`, "invalid: "},
		{"/events", `not json`, "invalid: "},
		{"/events", `{"id":"zz","pubkey":"","created_at":1,"kind":1,"tags":[],"content":"","sig":""}`, "invalid: id must be 64-char lowercase hex"},
		{"/query", `{"filters":[{"kinds":"1"}]}`, "invalid: kinds must be"},
		{"/query", `{"filters":[]}`, "invalid: at least one filter is required"},
		{"/query", `{}`, `invalid: "filters" is required`},
		{"/query", `{"filters":[{}],"extra":1}`, "invalid: body must be a JSON object"},
		{"/query", `{"filters":[{}]} trailing`, "invalid: unexpected data after the JSON object"},
		{"/count", `{"filters":[{},{},{}]}`, "invalid: too many filters (max 2)"},
		{"/count", `[{}]`, "invalid: body must be a JSON object"},
		// One spelling, once: encoding/json took "Filters" and the last of
		// two. Kills: parseReadBody decoding into a struct.
		{"/query", `{"filters":[{"kinds":[1]}],"filters":[{}]}`, `invalid: body must be a JSON object {"filters":[...]}: duplicate field "filters"`},
		{"/count", `{"Filters":[{}]}`, `invalid: body must be a JSON object {"filters":[...]}: unknown field "Filters"`},
		{"/count", `{"filters":null}`, "invalid: filters must be a JSON array"},
		{"/count", `{"filters":[{}]`, "invalid: body must be a JSON object"},
	} {
		got := post(t, r, key, tc.path, tc.body)
		require.Equal(t, http.StatusBadRequest, got.Status, "%s %s: %s", tc.path, tc.body, got.Raw)
		require.Contains(t, got.Error, tc.reason, "%s %s", tc.path, tc.body)
	}
}

func TestHTTPBridgeQueryTimeoutIs503(t *testing.T) {
	t.Parallel()
	r := relaytest.Start(t, func(c *config.Config) { c.QueryTimeout = time.Nanosecond })
	key := relaytest.NewKey(t)
	for _, path := range []string{"/query", "/count"} {
		got := post(t, r, key, path, query(map[string]any{"kinds": []int{1}}))
		require.Equal(t, http.StatusServiceUnavailable, got.Status, got.Raw)
		require.Equal(t, "error: query timed out", got.Error)
	}
}

func TestHTTPBridgeAuthIsBoundToItsCommunity(t *testing.T) {
	t.Parallel()
	r := relaytest.Start(t)
	r.AddCommunity(t, "b.example")
	key := relaytest.NewKey(t)
	body := []byte(`{"filters":[{"kinds":[1]}]}`)

	// Community A's auth event, replayed at B's host: u names A.
	forA := nip98(t, key, "POST", r.HTTPURL+"/count", body, nil)
	require.Equal(t, http.StatusOK, send(t, r, "", "/count", authHeader(forA), body).Status)
	got := send(t, r, "b.example", "/count", authHeader(forA), body)
	require.Equal(t, http.StatusUnauthorized, got.Status, got.Raw)
	require.Contains(t, got.Error, "u tag does not match this URL (http://b.example/count)")

	// B's own auth event works at B only, once; events stay in their community.
	note := relaytest.SignEvent(t, key, 1, "only in b", nil, 0)
	noteBody := encodeBody(t, note)
	forB := nip98(t, key, "POST", "http://b.example/events", noteBody, nil)
	require.Equal(t, http.StatusUnauthorized, send(t, r, "", "/events", authHeader(forB), noteBody).Status)
	got = send(t, r, "b.example", "/events", authHeader(forB), noteBody)
	require.Equal(t, http.StatusOK, got.Status, got.Raw)
	got = send(t, r, "b.example", "/events", authHeader(forB), noteBody)
	require.Equal(t, "auth-required: "+authEventUsed, got.Error)

	inA := post(t, r, key, "/count", query(map[string]any{"kinds": []int{1}}))
	require.Zero(t, inA.Count)
	countB := []byte(`{"filters":[{"kinds":[1]}]}`)
	got = send(t, r, "b.example", "/count", authHeader(nip98(t, key, "POST", "http://b.example/count", countB, nil)), countB)
	require.Equal(t, int64(1), got.Count)
}

// Expired claims are purged from the request path, one community at a time.
func TestHTTPBridgePurgesExpiredClaims(t *testing.T) {
	t.Parallel()
	r := relaytest.Start(t)
	other := r.AddCommunity(t, "b.example")
	for _, row := range []struct {
		community any
		id        string
		expires   string
	}{
		{r.CommunityID, "aa", "-1 minute"},
		{r.CommunityID, "bb", "+1 minute"},
		{other, "cc", "-1 minute"},
	} {
		_, err := r.Pool.Exec(t.Context(), `
			INSERT INTO http_auth_replays (community_id, event_id, expires_at)
			VALUES ($1, decode(repeat($2, 32), 'hex'), now() + $3::interval)`, row.community, row.id, row.expires)
		require.NoError(t, err)
	}
	got := post(t, r, relaytest.NewKey(t), "/count", query(map[string]any{}))
	require.Equal(t, http.StatusOK, got.Status, got.Raw)

	rows, err := r.Pool.Query(t.Context(), `
		SELECT format('%s:%s', CASE WHEN community_id = $1 THEN 'home' ELSE 'other' END, encode(event_id, 'hex'))
		FROM http_auth_replays ORDER BY 1`, r.CommunityID)
	require.NoError(t, err)
	left, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	// The home community's expired claim is gone; its live claims (the seeded
	// one and the request's own) and the other community's rows stay.
	require.Len(t, left, 3)
	require.Contains(t, left, "home:"+strings.Repeat("bb", 32))
	require.Contains(t, left, "other:"+strings.Repeat("cc", 32))
	require.NotContains(t, left, "home:"+strings.Repeat("aa", 32))
}

// A backlog of expired claims (a community's first claim after a long
// time, or after an upgrade) is purged a batch per claim, each claim
// purging on until one leaves none, so no one request waits for the whole
// backlog. Mutation killed: a full batch not letting the next claim purge
// (the rest waits a minute).
func TestReplayClaimsPurgeABacklogInBatches(t *testing.T) {
	t.Parallel()
	r := relaytest.Start(t)
	_, err := r.Pool.Exec(t.Context(), `
		INSERT INTO http_auth_replays (community_id, event_id, expires_at)
		SELECT $1, sha256(i::text::bytea), now() - interval '1 minute' FROM generate_series(1, $2::int) i`,
		r.CommunityID, relay.ReplayPurgeBatch+10)
	require.NoError(t, err)
	expired := func() int {
		var n int
		require.NoError(t, r.Pool.QueryRow(t.Context(), `
			SELECT count(*) FROM http_auth_replays WHERE community_id = $1 AND expires_at < now()`, r.CommunityID).Scan(&n))
		return n
	}
	key := relaytest.NewKey(t)
	require.Equal(t, http.StatusOK, post(t, r, key, "/count", query(map[string]any{})).Status)
	require.Equal(t, 10, expired(), "one batch per claim")
	require.Equal(t, http.StatusOK, post(t, r, key, "/count", query(map[string]any{"limit": 1})).Status)
	require.Zero(t, expired(), "the next claim purges the rest")
}

// A claim expires by the relay's clock, which checked its event's
// created_at, not by the database's: on a database running ten minutes
// ahead, a purge by its now() deleted claims still within their window, and
// the same header was accepted again. Mutation killed: the purge comparing
// with the database's now() (the live claim is purged).
func TestReplayClaimsPurgeByTheRelaysClock(t *testing.T) {
	t.Parallel()
	pool := dbtest.Pool(t)
	_, err := pool.Exec(t.Context(), `
		CREATE SCHEMA skew;
		CREATE FUNCTION skew.now() RETURNS timestamptz LANGUAGE plpgsql STABLE AS
		$$BEGIN RETURN pg_catalog.now() + interval '10 minutes'; END$$`)
	require.NoError(t, err)
	ahead := dbtest.PoolOn(t, pool.Config().ConnString(), 4, func(c *pgxpool.Config) {
		c.ConnConfig.RuntimeParams["search_path"] = "skew,pg_catalog,public"
	})
	r := relaytest.StartWith(t, ahead, nil)
	_, err = pool.Exec(t.Context(), `
		INSERT INTO http_auth_replays (community_id, event_id, expires_at)
		VALUES ($1, decode(repeat('dd', 32), 'hex'), pg_catalog.now() + interval '1 minute')`, r.CommunityID)
	require.NoError(t, err)

	got := post(t, r, relaytest.NewKey(t), "/count", query(map[string]any{}))
	require.Equal(t, http.StatusOK, got.Status, got.Raw)
	var live int
	require.NoError(t, pool.QueryRow(t.Context(), `
		SELECT count(*) FROM http_auth_replays WHERE community_id = $1 AND event_id = decode(repeat('dd', 32), 'hex')`,
		r.CommunityID).Scan(&live))
	require.Equal(t, 1, live, "a claim within its window by the relay's clock was purged")
}

// Media requests signed with NIP-98 claim their auth events in the same
// table, and a community whose clients only upload and delete media never
// sends a bridge request: their claims purge the community's expired rows
// too, or the table keeps one row per signed upload for good. Mutation
// checked: the purge back on the bridge route alone leaves all 20 expired
// rows.
func TestMediaClaimsPurgeExpiredClaims(t *testing.T) {
	t.Parallel()
	r := mediaRelay(t, mediaStores["fs"](t))
	_, err := r.Pool.Exec(t.Context(), `
		INSERT INTO http_auth_replays (community_id, event_id, expires_at)
		SELECT $1, sha256(i::text::bytea), now() - interval '1 minute' FROM generate_series(1, 20) i`, r.CommunityID)
	require.NoError(t, err)
	key := relaytest.NewKey(t)
	blob := pngBlob(t, 1000)
	up := mediaDo(t, r, http.MethodPut, "", "/media/upload", authHeader(nip98(t, key, http.MethodPut, r.HTTPURL+"/media/upload", blob, nil)), bytes.NewReader(blob), nil)
	require.Equal(t, http.StatusOK, up.Status, string(up.Body))

	var expired, live int
	require.NoError(t, r.Pool.QueryRow(t.Context(), `
		SELECT count(*) FILTER (WHERE expires_at < now()), count(*) FILTER (WHERE expires_at >= now())
		FROM http_auth_replays WHERE community_id = $1`, r.CommunityID).Scan(&expired, &live))
	require.Zero(t, expired, "expired claims left after a media upload")
	require.Equal(t, 1, live, "the upload's own claim")
}

// Web clients on other origins can use the bridge: a preflight allows the
// Authorization header and the route's method, and every answer, refusals
// included, is readable with the NIP-98 challenge exposed. An unknown host
// is still 404. Mutations killed: the preflight routes missing (the
// preflight falls to the root handler's 404); the origin header not set on
// answers.
func TestHTTPBridgeCrossOrigin(t *testing.T) {
	t.Parallel()
	r := relaytest.Start(t)
	key := relaytest.NewKey(t)
	do := func(method, host, path string) *http.Response {
		req, err := http.NewRequest(method, r.HTTPURL+path, nil)
		require.NoError(t, err)
		if host != "" {
			req.Host = host
		}
		req.Header.Set("Origin", "https://client.example")
		req.Header.Set("Access-Control-Request-Method", "POST")
		req.Header.Set("Access-Control-Request-Headers", "authorization,content-type")
		resp, err := bridgeHTTP.Do(req)
		require.NoError(t, err)
		resp.Body.Close()
		return resp
	}
	for path, method := range map[string]string{
		"/events": "POST", "/query": "POST", "/count": "POST",
		"/workflows/" + uuid.NewString() + "/runs":            "GET",
		"/v1/users/" + key.PublicKeyHex() + "/recorded-owner": "GET",
	} {
		pre := do(http.MethodOptions, "", path)
		require.Equal(t, http.StatusNoContent, pre.StatusCode, path)
		require.Equal(t, "*", pre.Header.Get("Access-Control-Allow-Origin"), path)
		require.Contains(t, pre.Header.Get("Access-Control-Allow-Headers"), "Authorization", path)
		require.Equal(t, method, pre.Header.Get("Access-Control-Allow-Methods"), path)
	}
	require.Equal(t, http.StatusNotFound, do(http.MethodOptions, "unknown.example", "/events").StatusCode)

	refused := send(t, r, "", "/events", "", []byte(`{}`))
	require.Equal(t, http.StatusUnauthorized, refused.Status)
	require.Equal(t, "*", refused.Header.Get("Access-Control-Allow-Origin"))
	require.Contains(t, refused.Header.Get("Access-Control-Expose-Headers"), "WWW-Authenticate")
	ok := post(t, r, key, "/events", relaytest.SignEvent(t, key, 1, "from a web page", nil, time.Now().Unix()))
	require.Equal(t, http.StatusOK, ok.Status, "%s", ok.Raw)
	require.Equal(t, "*", ok.Header.Get("Access-Control-Allow-Origin"), "%s", ok.Raw)
}

// An event the bridge refuses before ingest, too large (413) or not
// parseable (400), is counted in buzz_events_rejected_total{reason="invalid"}
// as the same event sent over WebSocket is; a refused read is no event.
// Mutations killed: the 413 not counted (0 after the big event); the parse
// refusal not counted (still 1 after three bad bodies); every 413 counted,
// reads' too (2 after the big read).
func TestHTTPBridgeCountsRefusedEvents(t *testing.T) {
	t.Parallel()
	r := relaytest.Start(t, func(c *config.Config) { c.MaxMessageBytes = 2048 })
	key := relaytest.NewKey(t)
	rejected := func() float64 {
		return testutil.ToFloat64(r.Server.Metrics().EventsRejected.WithLabelValues("invalid"))
	}

	big := relaytest.SignEvent(t, key, 1, strings.Repeat("x", 4096), nil, 0)
	require.Equal(t, http.StatusRequestEntityTooLarge, post(t, r, key, "/events", big).Status)
	require.Equal(t, 1.0, rejected(), "the 413")

	require.Equal(t, http.StatusRequestEntityTooLarge, post(t, r, key, "/query", `{"filters":[{"#t":["`+strings.Repeat("v", 4096)+`"]}]}`).Status)
	require.Equal(t, http.StatusBadRequest, post(t, r, key, "/query", `{"filters":[]}`).Status)
	require.Equal(t, 1.0, rejected(), "a refused read is no event")

	for _, body := range []string{
		`{"kind":1`,
		`{"id":"zz","pubkey":"","created_at":1,"kind":1,"tags":[],"content":"","sig":""}`,
		`not json`,
	} {
		got := post(t, r, key, "/events", body)
		require.Equal(t, http.StatusBadRequest, got.Status, got.Raw)
	}
	require.Equal(t, 4.0, rejected(), "the parse refusals")
}

// A POST /events refused 401 for its NIP-98 authentication (none, or one
// for another route) is an event refused for want of authentication, and
// counted as the WebSocket counts an EVENT sent before AUTH:
// buzz_events_rejected_total{reason="auth-required"}, read from the
// relay's /metrics. A 401 on /query is no event, and not counted.
// Mutation killed: serveEvents counting none of its 401s (an operator saw
// unauthenticated publishes over WebSocket only).
func TestHTTPBridgeCountsUnauthenticatedEventsAsAuthRequired(t *testing.T) {
	t.Parallel()
	r := relaytest.Start(t)
	key := relaytest.NewKey(t)
	authRequired := func() string {
		t.Helper()
		resp, err := bridgeHTTP.Get(r.MetricsURL + "/metrics")
		require.NoError(t, err)
		defer resp.Body.Close()
		metrics, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		line := regexp.MustCompile(`(?m)^buzz_events_rejected_total\{reason="auth-required"\} .*$`).Find(metrics)
		return string(line)
	}
	ev := relaytest.SignEvent(t, key, 1, "sent without a valid NIP-98 header", nil, 0)
	body := encodeBody(t, ev)

	got := send(t, r, "", "/events", "", body)
	require.Equal(t, http.StatusUnauthorized, got.Status, got.Raw)
	got = send(t, r, "", "/events", authHeader(nip98(t, key, "POST", r.HTTPURL+"/query", body, nil)), body)
	require.Equal(t, http.StatusUnauthorized, got.Status, got.Raw)
	require.Equal(t, `buzz_events_rejected_total{reason="auth-required"} 2`, authRequired())

	got = send(t, r, "", "/query", "", []byte(`{"filters":[{"kinds":[1]}]}`))
	require.Equal(t, http.StatusUnauthorized, got.Status, got.Raw)
	require.Equal(t, `buzz_events_rejected_total{reason="auth-required"} 2`, authRequired(), "a refused read is no event")

	// The same label as over WebSocket, where an EVENT before AUTH is refused.
	c := r.Dial(t, "")
	c.Send("EVENT", ev)
	reply := c.Expect("OK")
	require.False(t, reply.OK)
	require.True(t, strings.HasPrefix(reply.Msg, "auth-required: "), reply.Msg)
	require.Equal(t, `buzz_events_rejected_total{reason="auth-required"} 3`, authRequired())
}
