package outbox

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/buzzrelay/buzz/internal/nostr"
)

const testOrigin = "https://relay.example"

type registrationCall struct {
	status int
	body   string
}

// call sends one request to h, signed by key for url (the expected URL
// when empty).
func call(t *testing.T, h http.Handler, method string, key *nostr.SecretKey, body, url string) registrationCall {
	t.Helper()
	if url == "" {
		url = testOrigin + RegistrationPath
	}
	req := httptest.NewRequest(method, RegistrationPath, strings.NewReader(body))
	if key != nil {
		req.Header.Set("Authorization", signNIP98(t, key, method, url, []byte(body)))
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	return registrationCall{rec.Code, strings.TrimSpace(rec.Body.String())}
}

func errorBody(msg string) string {
	b, _ := json.Marshal(map[string]string{"error": msg})
	return string(b)
}

func pubkeysBody(keys ...string) string {
	b, _ := json.Marshal(map[string][]string{"pubkeys": keys})
	return string(b)
}

func (f *fixture) registered(listener string) []string {
	f.t.Helper()
	rows, err := f.q.ListenerRegistrationsList(context.Background(), mustHex(f.t, listener))
	require.NoError(f.t, err)
	var out []string
	for _, r := range rows {
		out = append(out, hex.EncodeToString(r.TargetPubkey))
	}
	return out
}

func TestRegistrationRegistersAndRemovesTargets(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	key, listener := newKey(t)
	h := RegistrationHandler(f.pool, Routes{listener: "https://l.example/hook"}, testOrigin, verifyNIP98)
	a, b, c := newPubkey(t), newPubkey(t), newPubkey(t)

	got := call(t, h, http.MethodPost, key, pubkeysBody(a, strings.ToUpper(b), a, b), "")
	require.Equal(t, registrationCall{200, "{}"}, got)
	require.ElementsMatch(t, []string{a, b}, f.registered(listener), "deduplicated, stored lowercase")

	// Registered targets now produce outbox rows for this listener.
	require.Len(t, f.enqueue(a), 1)

	got = call(t, h, http.MethodDelete, key, pubkeysBody(a, c), "")
	require.Equal(t, registrationCall{200, "{}"}, got, "removing an unregistered target is fine")
	require.Equal(t, []string{b}, f.registered(listener))
	got = call(t, h, http.MethodDelete, key, pubkeysBody(a), "")
	require.Equal(t, registrationCall{200, "{}"}, got, "idempotent")
}

func TestRegistrationRefusals(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	key, listener := newKey(t)
	stranger, _ := newKey(t)
	routes := Routes{listener: "https://l.example/hook"}
	h := RegistrationHandler(f.pool, routes, testOrigin, verifyNIP98)
	ok := pubkeysBody(newPubkey(t))
	many := make([]string, 1001)
	for i := range many {
		many[i] = strings.Repeat(fmt.Sprintf("%02x", i%256), 32)
	}

	for name, tc := range map[string]struct {
		got        registrationCall
		wantStatus int
		wantMsg    string
	}{
		"no origin configured": {
			call(t, RegistrationHandler(f.pool, routes, "", verifyNIP98), http.MethodPost, key, ok, ""),
			500, "operator API origin is not configured"},
		"no auth":           {call(t, h, http.MethodPost, nil, ok, ""), 401, "NIP-98: Authorization scheme must be Nostr"},
		"u for another URL": {call(t, h, http.MethodPost, key, ok, "https://other.example"+RegistrationPath), 401, "NIP-98: u tag must be " + testOrigin + RegistrationPath},
		"not a listener":    {call(t, h, http.MethodPost, stranger, ok, ""), 403, "actor not authorized: not a configured operator listener"},
		"bad JSON":          {call(t, h, http.MethodPost, key, `{"pubkeys": [`, ""), 400, "invalid operator-listener pubkeys JSON: unexpected end of JSON input"},
		"not strings":       {call(t, h, http.MethodPost, key, `{"pubkeys": [1]}`, ""), 400, "invalid operator-listener pubkeys JSON: json: cannot unmarshal number into Go struct field .pubkeys of type string"},
		"no pubkeys":        {call(t, h, http.MethodPost, key, `{"pubkeys": []}`, ""), 400, "pubkeys must contain between 1 and 1000 entries"},
		"missing pubkeys":   {call(t, h, http.MethodPost, key, `{}`, ""), 400, "pubkeys must contain between 1 and 1000 entries"},
		"1001 pubkeys":      {call(t, h, http.MethodPost, key, pubkeysBody(many...), ""), 400, "pubkeys must contain between 1 and 1000 entries"},
		"short key":         {call(t, h, http.MethodDelete, key, pubkeysBody("abcd"), ""), 400, "pubkeys must contain 64-char hex public keys"},
		"non-hex key":       {call(t, h, http.MethodPost, key, pubkeysBody(strings.Repeat("z", 64)), ""), 400, "pubkeys must contain 64-char hex public keys"},
		"GET":               {call(t, h, http.MethodGet, key, "", ""), 405, "method must be POST or DELETE"},
	} {
		require.Equal(t, registrationCall{tc.wantStatus, errorBody(tc.wantMsg)}, tc.got, name)
	}
	require.Empty(t, f.registered(listener))

	// 1000 entries is the most a request may carry.
	require.Equal(t, 200, call(t, h, http.MethodPost, key, pubkeysBody(many[:1000]...), "").status)
	require.Len(t, f.registered(listener), 256, "1000 entries, 256 distinct")
}

func TestRegistrationRefusesReplays(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	key, listener := newKey(t)
	h := RegistrationHandler(f.pool, Routes{listener: "https://l.example/hook"}, testOrigin, verifyNIP98)
	body := pubkeysBody(newPubkey(t))
	auth := signNIP98(t, key, http.MethodPost, testOrigin+RegistrationPath, []byte(body))
	send := func() registrationCall {
		req := httptest.NewRequest(http.MethodPost, RegistrationPath, strings.NewReader(body))
		req.Header.Set("Authorization", auth)
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		return registrationCall{rec.Code, strings.TrimSpace(rec.Body.String())}
	}
	require.Equal(t, registrationCall{200, "{}"}, send())
	require.Equal(t, registrationCall{401, errorBody("NIP-98: replay detected (sign each request anew, with a nonce tag or a later created_at)")}, send())

	var expiresIn float64
	require.NoError(t, f.pool.QueryRow(context.Background(),
		`SELECT extract(epoch FROM expires_at - now()) FROM operator_auth_replays`).Scan(&expiresIn))
	require.InDelta(t, replayTTL.Seconds(), expiresIn, 5)
}

func TestRegistrationFailsClosedWithoutTheReplayStore(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	key, listener := newKey(t)
	broken, err := pgxpool.New(context.Background(), f.pool.Config().ConnString())
	require.NoError(t, err)
	broken.Close()
	h := RegistrationHandler(broken, Routes{listener: "https://l.example/hook"}, testOrigin, verifyNIP98)
	got := call(t, h, http.MethodPost, key, pubkeysBody(newPubkey(t)), "")
	require.Equal(t, registrationCall{401, errorBody("NIP-98: replay check unavailable")}, got)
}

func TestRegistrationVerifierSeesTheExpectedURLAndBody(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	_, listener := newKey(t)
	var sawURL, sawBody string
	verify := func(r *http.Request, body []byte, expectedURL string) (*nostr.Event, error) {
		sawURL, sawBody = expectedURL, string(body)
		return nil, errors.New("nope")
	}
	h := RegistrationHandler(f.pool, Routes{listener: "https://l.example/hook"}, "http://127.0.0.1:3000", verify)
	got := call(t, h, http.MethodPost, nil, `{"pubkeys":[]}`, "")
	require.Equal(t, registrationCall{401, errorBody("NIP-98: nope")}, got)
	require.Equal(t, "http://127.0.0.1:3000/operator/listener/pubkeys", sawURL)
	require.Equal(t, `{"pubkeys":[]}`, sawBody)
}
