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

	"github.com/google/uuid"
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

// answerDatabaseFailure stands for the relay's answer to a database
// failure (its databaseFailed): 503, naming the statement that failed.
func answerDatabaseFailure(w http.ResponseWriter, _ *http.Request, _ error, what string) {
	writeError(w, http.StatusServiceUnavailable, "error: "+what+" failed")
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
	h := RegistrationHandler(f.pool, Routes{listener: "https://l.example/hook"}, testOrigin, verifyNIP98, answerDatabaseFailure)
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
	h := RegistrationHandler(f.pool, routes, testOrigin, verifyNIP98, answerDatabaseFailure)
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
			call(t, RegistrationHandler(f.pool, routes, "", verifyNIP98, answerDatabaseFailure), http.MethodPost, key, ok, ""),
			500, "error: operator API origin is not configured"},
		"no auth":           {call(t, h, http.MethodPost, nil, ok, ""), 401, "auth-required: NIP-98: Authorization scheme must be Nostr"},
		"u for another URL": {call(t, h, http.MethodPost, key, ok, "https://other.example"+RegistrationPath), 401, "auth-required: NIP-98: u tag must be " + testOrigin + RegistrationPath},
		"not a listener":    {call(t, h, http.MethodPost, stranger, ok, ""), 403, "restricted: actor not authorized: not a configured operator listener"},
		"bad JSON":          {call(t, h, http.MethodPost, key, `{"pubkeys": [`, ""), 400, "invalid: operator-listener pubkeys JSON: unexpected end of JSON input"},
		"not strings":       {call(t, h, http.MethodPost, key, `{"pubkeys": [1]}`, ""), 400, "invalid: operator-listener pubkeys JSON: json: cannot unmarshal number into Go struct field .pubkeys of type string"},
		"no pubkeys":        {call(t, h, http.MethodPost, key, `{"pubkeys": []}`, ""), 400, "invalid: pubkeys must contain between 1 and 1000 entries"},
		"missing pubkeys":   {call(t, h, http.MethodPost, key, `{}`, ""), 400, "invalid: pubkeys must contain between 1 and 1000 entries"},
		"1001 pubkeys":      {call(t, h, http.MethodPost, key, pubkeysBody(many...), ""), 400, "invalid: pubkeys must contain between 1 and 1000 entries"},
		"short key":         {call(t, h, http.MethodDelete, key, pubkeysBody("abcd"), ""), 400, "invalid: pubkeys must contain 64-char hex public keys"},
		"non-hex key":       {call(t, h, http.MethodPost, key, pubkeysBody(strings.Repeat("z", 64)), ""), 400, "invalid: pubkeys must contain 64-char hex public keys"},
		"GET":               {call(t, h, http.MethodGet, key, "", ""), 405, "invalid: method must be POST or DELETE"},
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
	h := RegistrationHandler(f.pool, Routes{listener: "https://l.example/hook"}, testOrigin, verifyNIP98, answerDatabaseFailure)
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
	require.Equal(t, registrationCall{401, errorBody("auth-required: NIP-98: replay detected (sign each request anew, with a nonce tag or a later created_at)")}, send())

	var expiresIn float64
	require.NoError(t, f.pool.QueryRow(context.Background(),
		`SELECT extract(epoch FROM expires_at - now()) FROM operator_auth_replays`).Scan(&expiresIn))
	require.InDelta(t, replayTTL.Seconds(), expiresIn, 5)
}

// A request the replay store cannot answer for is refused, as a database
// failure (the relay answers 503 with Retry-After, see
// TestOperatorListenerAPIAnswersAnOutageAs503WithRetryAfter), never
// registered unchecked.
func TestRegistrationFailsClosedWithoutTheReplayStore(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	key, listener := newKey(t)
	broken, err := pgxpool.New(context.Background(), f.pool.Config().ConnString())
	require.NoError(t, err)
	broken.Close()
	h := RegistrationHandler(broken, Routes{listener: "https://l.example/hook"}, testOrigin, verifyNIP98, answerDatabaseFailure)
	got := call(t, h, http.MethodPost, key, pubkeysBody(newPubkey(t)), "")
	require.Equal(t, registrationCall{503, errorBody("error: operator auth replay claim failed")}, got)
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
	h := RegistrationHandler(f.pool, Routes{listener: "https://l.example/hook"}, "http://127.0.0.1:3000", verify, answerDatabaseFailure)
	got := call(t, h, http.MethodPost, nil, `{"pubkeys":[]}`, "")
	require.Equal(t, registrationCall{401, errorBody("auth-required: NIP-98: nope")}, got)
	require.Equal(t, "http://127.0.0.1:3000/operator/listener/pubkeys", sawURL)
	require.Equal(t, `{"pubkeys":[]}`, sawBody)
}

// Removing a target also drops the listener's notifications about it that
// are still queued (due now or waiting to retry), but not a row a worker is
// sending, nor rows of other targets or other listeners.
// Mutation killed: the removal leaving the outbox alone (the queued row of
// the removed target is still there to be delivered).
func TestRemovingATargetDropsItsQueuedNotifications(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := newFixture(t)
	key, listener := newKey(t)
	_, otherListener := newKey(t)
	h := RegistrationHandler(f.pool, Routes{listener: "https://l.example/hook"}, testOrigin, verifyNIP98, answerDatabaseFailure)
	removed, kept := newPubkey(t), newPubkey(t)
	f.register(listener, removed, kept)
	f.register(otherListener, removed)

	// Two notifications about the removed target (one row per listener
	// each) and one about the kept target.
	first, second := f.enqueue(removed), f.enqueue(removed)
	keptRow := f.enqueue(kept)[0]
	mine := func(ids []uuid.UUID) (own, other uuid.UUID) {
		require.Len(t, ids, 2)
		if r, _ := f.row(ids[0]); r.ListenerHex == listener {
			return ids[0], ids[1]
		}
		return ids[1], ids[0]
	}
	sending, othersFirst := mine(first)
	retrying, othersSecond := mine(second)
	claims, err := f.claimer(Routes{listener: "https://l.example/hook"}).claimDue(ctx, 10, nil)
	require.NoError(t, err)
	require.Len(t, claims, 3)
	// sending stays claimed; the others are pending again, retrying due later.
	f.exec(`UPDATE operator_listener_outbox SET state = 'pending', claim_id = NULL, lease_until = NULL,
	            next_attempt_at = now() + interval '1 minute' WHERE id = $1`, retrying)
	f.exec(`UPDATE operator_listener_outbox SET state = 'pending', claim_id = NULL, lease_until = NULL WHERE id = $1`, keptRow)

	got := call(t, h, http.MethodDelete, key, pubkeysBody(removed), "")
	require.Equal(t, registrationCall{200, "{}"}, got)

	_, ok := f.row(retrying)
	require.False(t, ok, "the removed target's queued row is dropped")
	r, ok := f.row(sending)
	require.True(t, ok, "a row being sent finishes as claimed")
	require.Equal(t, "sending", r.State)
	for _, id := range []uuid.UUID{keptRow, othersFirst, othersSecond} {
		_, ok := f.row(id)
		require.True(t, ok, "rows of another target or another listener stay")
	}
}

// Every NIP-98 refusal of the operator API is a 401 carrying the
// WWW-Authenticate challenge, as the HTTP bridge's are (a 401 must name its
// scheme); other refusals carry none. Before, the operator API's 401s had
// no challenge.
// Mutation killed: unauthorized without its WWW-Authenticate header.
func TestRegistrationUnauthorizedAnswersCarryTheNostrChallenge(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	key, listener := newKey(t)
	stranger, _ := newKey(t)
	h := RegistrationHandler(f.pool, Routes{listener: "https://l.example/hook"}, testOrigin, verifyNIP98, answerDatabaseFailure)
	body := pubkeysBody(newPubkey(t))
	send := func(auth string) *httptest.ResponseRecorder {
		req := httptest.NewRequest(http.MethodPost, RegistrationPath, strings.NewReader(body))
		if auth != "" {
			req.Header.Set("Authorization", auth)
		}
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		return rec
	}
	signed := signNIP98(t, key, http.MethodPost, testOrigin+RegistrationPath, []byte(body))
	require.Equal(t, 200, send(signed).Code)
	for name, auth := range map[string]string{
		"no auth":   "",
		"wrong u":   signNIP98(t, key, http.MethodPost, "https://other.example"+RegistrationPath, []byte(body)),
		"bad token": "Nostr AAAA",
		"replay":    signed,
	} {
		rec := send(auth)
		require.Equal(t, 401, rec.Code, name)
		require.Equal(t, "Nostr", rec.Header().Get("WWW-Authenticate"), name)
	}
	rec := send(signNIP98(t, stranger, http.MethodPost, testOrigin+RegistrationPath, []byte(body)))
	require.Equal(t, 403, rec.Code)
	require.Empty(t, rec.Header().Get("WWW-Authenticate"), "a stranger's valid signature is not asked for again")
}
