package relay_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/http/httptrace"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/buzzrelay/buzz/internal/community"
	"github.com/buzzrelay/buzz/internal/config"
	"github.com/buzzrelay/buzz/internal/db"
	"github.com/buzzrelay/buzz/internal/dberr"
	"github.com/buzzrelay/buzz/internal/dbtest"
	"github.com/buzzrelay/buzz/internal/logtest"
	"github.com/buzzrelay/buzz/internal/media"
	"github.com/buzzrelay/buzz/internal/nostr"
	"github.com/buzzrelay/buzz/internal/outbox"
	"github.com/buzzrelay/buzz/internal/relay"
	"github.com/buzzrelay/buzz/internal/relaytest"
)

// A database that goes away after a bridge request's host was looked up,
// before its NIP-98 claim, is an outage like any other: the request gets
// 503 "error: database unavailable; try again" with Retry-After, the
// answer every route gives while the database is unreachable, and the log
// gets the outage's one line instead of an ERROR "http auth failed" for
// each request. The database is taken away for real: its sessions are
// terminated and it takes no new ones. The window is exact: the client
// sends the body only after the relay asked for it (Expect:
// 100-continue), which it does after the lookup and before the claim.
// Mutation killed: the claim's unreachable error left to the internal
// error branch (500 "error: could not check authorization; try again",
// and "http auth failed" logged); the Retry-After left out.
func TestHTTPBridgeAnswers503WhenTheDatabaseDropsBeforeTheClaim(t *testing.T) {
	t.Parallel()
	hs, logs, takeAway := relayBeforeAnOutage(t)

	key := relaytest.NewKey(t)
	body, err := json.Marshal(relaytest.SignEvent(t, key, 1, "during the outage", nil, 0))
	require.NoError(t, err)
	req, err := http.NewRequest(http.MethodPost, hs.URL+"/events", bytes.NewReader(body))
	require.NoError(t, err)
	req.Header.Set("Authorization", authHeader(nip98(t, key, "POST", hs.URL+"/events", body, nil)))
	req.Header.Set("Content-Type", "application/json")
	sendTakingTheDatabaseAway(t, req, takeAway)

	// The next requests fail at their host lookup: counted, not logged.
	for range 3 {
		r, err := http.Get(hs.URL + "/")
		require.NoError(t, err)
		r.Body.Close()
		require.Equal(t, http.StatusServiceUnavailable, r.StatusCode)
		require.Equal(t, "1", r.Header.Get("Retry-After"))
	}
	logged := logs.String()
	require.NotContains(t, logged, "http auth failed", logged)
	require.NotContains(t, logged, "msg=\"resolve community\"", logged)
	require.Equal(t, 1, strings.Count(logged, "database unreachable"), logged)
	require.Contains(t, logged, "first_failure=\"http auth claim\"", logged)
}

// relayBeforeAnOutage serves a relay with opts on its own database and
// community, logging to the returned buffer; takeAway makes the database
// unreachable (databaseOutage).
func relayBeforeAnOutage(t *testing.T, opts ...relay.Option) (*httptest.Server, *logtest.Buffer, func()) {
	t.Helper()
	databaseURL := dbtest.URL(t)
	hs, logs, _ := relayLoggingTo(t, dbtest.PoolOn(t, databaseURL, 4), opts...)
	takeAway, _ := databaseOutage(t, databaseURL)
	return hs, logs, takeAway
}

// relayLoggingTo serves a relay with opts on pool, with a community of its
// own, logging to the returned buffer; the relay is returned too.
func relayLoggingTo(t *testing.T, pool *pgxpool.Pool, opts ...relay.Option) (*httptest.Server, *logtest.Buffer, *relay.Server) {
	t.Helper()
	logs := &logtest.Buffer{}
	srv := relay.New(config.Default(), pool, slog.New(slog.NewTextHandler(logs, nil)), opts...)
	hs := httptest.NewServer(srv.HTTPServer().Handler)
	t.Cleanup(hs.Close)
	_, err := db.New(pool).CommunityCreate(t.Context(), community.NormalizeHost(hs.Listener.Addr().String()))
	require.NoError(t, err)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(ctx)
	})
	return hs, logs, srv
}

// sendTakingTheDatabaseAway sends req with Expect: 100-continue and takes
// the database away when the relay asks for the body (past the host
// lookup, before the claim), then asserts the outage's answer: 503 with
// Retry-After. It returns the response (its body read) and the JSON answer.
func sendTakingTheDatabaseAway(t *testing.T, req *http.Request, takeAway func()) (*http.Response, map[string]any) {
	t.Helper()
	req.Header.Set("Expect", "100-continue")
	tookAway := false
	req = req.WithContext(httptrace.WithClientTrace(t.Context(), &httptrace.ClientTrace{
		Got100Continue: func() { takeAway(); tookAway = true },
	}))
	client := &http.Client{Transport: &http.Transport{ExpectContinueTimeout: time.Minute}}
	resp, err := client.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	require.True(t, tookAway, "the relay asked for the body")
	var answer map[string]any
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&answer))
	requireOutageAnswer(t, resp, answer, "")
	return resp, answer
}

// requireOutageAnswer checks that resp is the relay's answer to a request the
// database went away under: 503, Retry-After and the JSON error, nothing else.
func requireOutageAnswer(t *testing.T, resp *http.Response, answer map[string]any, what string) {
	t.Helper()
	require.Equal(t, http.StatusServiceUnavailable, resp.StatusCode, "%s: %v", what, answer)
	require.Equal(t, "1", resp.Header.Get("Retry-After"), what)
	require.Equal(t, map[string]any{"error": dberr.UnavailableAnswer}, answer, what)
}

// databaseOutage returns takeAway, which makes the database of databaseURL
// unreachable for real (its sessions terminated, new ones refused), and
// bringBack, which lets sessions in again; the database is let in again
// when the test ends.
func databaseOutage(t *testing.T, databaseURL string) (takeAway, bringBack func()) {
	t.Helper()
	u, err := url.Parse(databaseURL)
	require.NoError(t, err)
	name := pgx.Identifier{strings.TrimPrefix(u.Path, "/")}.Sanitize()
	admin, err := pgx.Connect(t.Context(), dbtest.AdminURL())
	require.NoError(t, err)
	t.Cleanup(func() { admin.Close(context.Background()) })
	var mu sync.Mutex // the admin session is used from the client's trace hook too
	allow := func(allowed bool) {
		mu.Lock()
		defer mu.Unlock()
		_, err := admin.Exec(context.Background(), fmt.Sprintf("ALTER DATABASE %s ALLOW_CONNECTIONS %t", name, allowed))
		require.NoError(t, err)
		if !allowed {
			_, err = admin.Exec(context.Background(),
				"SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = $1 AND pid <> pg_backend_pid()",
				strings.TrimPrefix(u.Path, "/"))
			require.NoError(t, err)
		}
	}
	t.Cleanup(func() { allow(true) })
	return func() { allow(false) }, func() { allow(true) }
}

// A media upload whose NIP-98 claim meets a database gone away is answered
// as every route answers an outage: 503 "error: database unavailable; try
// again" (in X-Reason too) with Retry-After, the outage logged once, not an
// ERROR "media auth failed" and a 500 "could not check authorization" per
// upload. The window is exact, as for the bridge: the relay asks for the
// body (Expect: 100-continue) after the host lookup and the upload's
// lease, and claims once it hashed the body.
// Mutation killed: mediaUnauthorized without databaseUnreachable (500,
// "media auth failed" logged).
func TestMediaUploadAnswers503WhenTheDatabaseDropsBeforeTheClaim(t *testing.T) {
	t.Parallel()
	hs, logs, takeAway := relayBeforeAnOutage(t, relay.WithMedia(media.NewService(mediaStores["fs"](t),
		media.Limits{MaxBytes: testMediaMaxBytes, AllowedTypes: config.DefaultMediaTypes, TempDir: t.TempDir()}, nil)))

	key := relaytest.NewKey(t)
	req := signedUpload(t, hs, key, pngBlob(t, 700))
	resp, _ := sendTakingTheDatabaseAway(t, req, takeAway)
	require.Equal(t, dberr.UnavailableAnswer, resp.Header.Get("X-Reason"))

	logged := logs.String()
	require.NotContains(t, logged, "media auth failed", logged)
	require.NotContains(t, logged, "media request failed", logged)
	require.Equal(t, 1, strings.Count(logged, "database unreachable"), logged)
}

// statementHook is a pgx tracer (install it with hookStatements) that
// calls before with a statement's text as it is sent, each statement of a
// batch included, and after with its text and error once it ended: a test
// takes the database away at an exact point of a request with it.
type statementHook struct {
	before func(sql string)
	after  func(sql string, err error)
}

type hookedSQLKey struct{}

func hookStatements(h *statementHook) func(*pgxpool.Config) {
	return func(cfg *pgxpool.Config) { cfg.ConnConfig.Tracer = h }
}

func (h *statementHook) TraceQueryStart(ctx context.Context, _ *pgx.Conn, data pgx.TraceQueryStartData) context.Context {
	if h.before != nil {
		h.before(data.SQL)
	}
	return context.WithValue(ctx, hookedSQLKey{}, data.SQL)
}

func (h *statementHook) TraceQueryEnd(ctx context.Context, _ *pgx.Conn, data pgx.TraceQueryEndData) {
	if sql, ok := ctx.Value(hookedSQLKey{}).(string); ok && h.after != nil {
		h.after(sql, data.Err)
	}
}

func (h *statementHook) TraceBatchStart(ctx context.Context, _ *pgx.Conn, data pgx.TraceBatchStartData) context.Context {
	if h.before != nil {
		for _, q := range data.Batch.QueuedQueries {
			h.before(q.SQL)
		}
	}
	return ctx
}

func (h *statementHook) TraceBatchQuery(context.Context, *pgx.Conn, pgx.TraceBatchQueryData) {}
func (h *statementHook) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData)     {}

// relayWithOutageBefore serves a relay with opts (as relayBeforeAnOutage)
// on a pool configured with configure, whose database is taken away as the next
// statement that when (passed to arm) matches is sent, once per arm: after
// a request's NIP-98 claim, before its insert or read, say. bringBack lets
// the database in again and drops the pool's connections, which the
// outage ended.
func relayWithOutageBefore(t *testing.T, opts []relay.Option, configure ...func(*pgxpool.Config)) (hs *httptest.Server, logs *logtest.Buffer, arm func(when func(sql string) bool), bringBack func()) {
	t.Helper()
	o := serverWithOutageBefore(t, opts, configure...)
	return o.hs, o.logs, o.arm, o.bringBack
}

// outageRelay is a relay served by serverWithOutageBefore.
type outageRelay struct {
	hs   *httptest.Server
	logs *logtest.Buffer
	srv  *relay.Server
	pool *pgxpool.Pool
	// arm and bringBack are relayWithOutageBefore's.
	arm       func(when func(sql string) bool)
	bringBack func()
}

// serverWithOutageBefore is relayWithOutageBefore with the server and its
// pool, for a test that configures the server further.
func serverWithOutageBefore(t *testing.T, opts []relay.Option, configure ...func(*pgxpool.Config)) outageRelay {
	t.Helper()
	databaseURL := dbtest.URL(t)
	takeAway, letIn := databaseOutage(t, databaseURL)
	var armed atomic.Pointer[func(string) bool]
	hook := hookStatements(&statementHook{before: func(sql string) {
		if when := armed.Load(); when != nil && (*when)(sql) && armed.CompareAndSwap(when, nil) {
			takeAway()
		}
	}})
	pool := dbtest.PoolOn(t, databaseURL, 4, append(configure, hook)...)
	hs, logs, srv := relayLoggingTo(t, pool, opts...)
	return outageRelay{
		hs: hs, logs: logs, srv: srv, pool: pool,
		arm:       func(when func(string) bool) { armed.Store(&when) },
		bringBack: func() { letIn(); pool.Reset() },
	}
}

// statementNamed matches the statement named name (its "-- name:" line;
// a name that begins another's matches both).
func statementNamed(name string) func(sql string) bool {
	return func(sql string) bool { return strings.Contains(sql, "-- name: "+name) }
}

// postSigned posts body to path on hs with a fresh NIP-98 header of key.
func postSigned(t *testing.T, hs *httptest.Server, key *nostr.SecretKey, path string, body []byte) (*http.Response, map[string]any) {
	t.Helper()
	return answerTo(t, signedPost(t, hs, key, path, body))
}

// signedPost is a POST of body to path on hs with a fresh NIP-98 header of
// key.
func signedPost(t *testing.T, hs *httptest.Server, key *nostr.SecretKey, path string, body []byte) *http.Request {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, hs.URL+path, bytes.NewReader(body))
	require.NoError(t, err)
	req.Header.Set("Authorization", authHeader(nip98(t, key, "POST", hs.URL+path, body, nil)))
	req.Header.Set("Content-Type", "application/json")
	return req
}

// signedUpload is a PUT of blob, a PNG, to /media/upload on hs with a fresh
// NIP-98 header of key.
func signedUpload(t *testing.T, hs *httptest.Server, key *nostr.SecretKey, blob []byte) *http.Request {
	t.Helper()
	req, err := http.NewRequest(http.MethodPut, hs.URL+"/media/upload", bytes.NewReader(blob))
	require.NoError(t, err)
	req.Header.Set("Authorization", authHeader(nip98(t, key, http.MethodPut, hs.URL+"/media/upload", blob, nil)))
	req.Header.Set("Content-Type", "image/png")
	return req
}

// answerTo sends req and returns the response with its JSON body decoded.
func answerTo(t *testing.T, req *http.Request) (*http.Response, map[string]any) {
	t.Helper()
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	var answer map[string]any
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&answer))
	return resp, answer
}

// requireOutageAt sends req with the database taken away (arm) as the
// statement named statement is sent, requires the outage's answer to it,
// and lets the database in again.
func requireOutageAt(t *testing.T, arm func(when func(sql string) bool), bringBack func(), statement string, req *http.Request) {
	t.Helper()
	arm(statementNamed(statement))
	resp, answer := answerTo(t, req)
	requireOutageAnswer(t, resp, answer, req.URL.Path)
	bringBack()
}

// A database that goes away after a bridge request's NIP-98 claim, at the
// event's insert or the read's statement, is answered as an outage
// everywhere else is: 503 "error: database unavailable; try again" with
// Retry-After, the outage logged once and not an ERROR "ingest failed" or
// "http read failed" per request. The database is taken away for real as
// the statement is sent. The event, which never reached the database, is
// stored when sent again.
// Mutations killed (one at a time): serveEvents' unreachable error left to
// the internal-error branch (500 "error: could not store the event",
// "ingest failed" logged); readFailure without the outage log (500
// "error: query failed", "http read failed" logged); the Retry-After left
// out.
func TestHTTPBridgeAnswers503WhenTheDatabaseDropsAfterTheClaim(t *testing.T) {
	t.Parallel()
	hs, logs, arm, bringBack := relayWithOutageBefore(t, nil)
	key := relaytest.NewKey(t)
	ev := relaytest.SignEvent(t, key, 1, "the database goes away at its insert", nil, 0)
	event, err := json.Marshal(ev)
	require.NoError(t, err)
	read := []byte(`{"filters":[{"kinds":[1]}]}`)

	for _, step := range []struct{ path, statement string }{
		{"/events", "EventInsert"},
		{"/query", "EventsQuery"},
		{"/count", "EventsCount"},
	} {
		body := read
		if step.path == "/events" {
			body = event
		}
		requireOutageAt(t, arm, bringBack, step.statement, signedPost(t, hs, key, step.path, body))
	}
	logged := logs.String()
	require.NotContains(t, logged, "ingest failed", logged)
	require.NotContains(t, logged, "http read failed", logged)
	require.NotContains(t, logged, "level=ERROR msg=\"http", logged)
	require.Contains(t, logged, "first_failure=\"http ingest\"", logged)

	// Nothing was stored: sent again, the event is stored now.
	resp, answer := postSigned(t, hs, key, "/events", event)
	require.Equal(t, http.StatusOK, resp.StatusCode, "%v", answer)
	require.Equal(t, map[string]any{"id": ev.ID, "accepted": true, "message": ""}, answer)
}

// An event its insert found stored already (sent again) is accepted,
// stored or superseded, even when the database goes away before the
// lookup that tells those two apart: the relay knows the event is in, so
// it answers 200 accepted, in words that cover both, rather than a 503 its
// client would take for "not stored".
// Mutation killed: notInserted returning the lookup's error (503
// "database unavailable; try again", accepted never said).
func TestHTTPBridgeStoredEventIsAcceptedWhenTheDatabaseDropsBeforeTellingDuplicateFromSuperseded(t *testing.T) {
	t.Parallel()
	hs, _, arm, _ := relayWithOutageBefore(t, nil)
	key := relaytest.NewKey(t)
	ev := relaytest.SignEvent(t, key, 1, "stored, then sent again", nil, 0)
	body, err := json.Marshal(ev)
	require.NoError(t, err)
	resp, answer := postSigned(t, hs, key, "/events", body)
	require.Equal(t, http.StatusOK, resp.StatusCode, "%v", answer)

	arm(statementNamed("EventExists"))
	resp, answer = postSigned(t, hs, key, "/events", body)
	require.Equal(t, http.StatusOK, resp.StatusCode, "%v", answer)
	require.Equal(t, map[string]any{"id": ev.ID, "accepted": true,
		"message": "duplicate: this event, its deletion or a newer version of its address is already stored"}, answer)
}

// What docs/errors.md tells a client to do on a 503 from POST /events,
// send the event again, is safe even when the event was stored: its
// transaction's COMMIT reached the server and committed, its answer was
// lost and the database went away before the relay could look. The relay
// cannot know, so it answers 503 "database unavailable; try again"; sent
// again once the database is back, the event is answered 200 accepted
// "duplicate: already have this event" and is stored once. A note that
// mentions someone commits in a transaction (its mention rows beside it),
// whose COMMIT the pool's connections lose the answer of.
// Mutation killed: the event insert without ON CONFLICT DO NOTHING (the
// retry refused 409 "duplicate: ..." with accepted false, which a client
// reads as not stored).
func TestHTTPBridgeEventStoredAsTheDatabaseWentAwayIsADuplicateWhenSentAgain(t *testing.T) {
	t.Parallel()
	var cutAt atomic.Int32
	hs, _, arm, bringBack := relayWithOutageBefore(t, nil, dbtest.LoseCommitAnswer(&cutAt))
	key := relaytest.NewKey(t)
	ev := relaytest.SignEvent(t, key, 1, "stored in the dark", nostr.Tags{{"p", relaytest.NewKey(t).PublicKeyHex()}}, 0)
	body, err := json.Marshal(ev)
	require.NoError(t, err)

	cutAt.Store(1)
	// The event runs again alone once its group's COMMIT is lost: the
	// database is gone by then.
	arm(func(sql string) bool { return sql == "begin" && cutAt.Load() == 0 })
	resp, answer := postSigned(t, hs, key, "/events", body)
	require.Zero(t, cutAt.Load(), "the event's COMMIT went through the losing connection")
	requireOutageAnswer(t, resp, answer, "")

	bringBack()
	resp, answer = postSigned(t, hs, key, "/events", body)
	require.Equal(t, http.StatusOK, resp.StatusCode, "%v", answer)
	require.Equal(t, map[string]any{"id": ev.ID, "accepted": true, "message": "duplicate: already have this event"}, answer)

	resp, answer = postSigned(t, hs, key, "/count", []byte(`{"filters":[{"ids":["`+ev.ID+`"]}]}`))
	require.Equal(t, http.StatusOK, resp.StatusCode, "%v", answer)
	require.Equal(t, map[string]any{"count": 1.0}, answer, "stored once")
}

// A database that goes away as a media upload or delete takes its
// serving-write lease (the upload's first statement, the delete's after
// its claim) is an outage, not a media store failure: 503 "error:
// database unavailable; try again" (in X-Reason too) with Retry-After,
// logged once per outage, where it was a 500 "could not reach the media
// store" with an ERROR "media request failed" per request, which sent an
// operator to the object store. The database is taken away for real as
// the lease's statement is sent; once it is back, the same upload stores
// the blob and the same delete deletes it: the refused ones changed
// nothing. So is one that goes away past the lease, at the upload's blob
// lock or its quota reservation.
// Mutations killed (one at a time): the lease's failure left to
// mediaFenced (500, "media request failed" logged), for the upload or the
// delete; the blob lock's or the quota reservation's failure not marked as
// the database's (500).
func TestMediaAnswersADatabaseOutageAs503NotAsAStoreFailure(t *testing.T) {
	t.Parallel()
	hs, logs, arm, bringBack := relayWithOutageBefore(t, []relay.Option{relay.WithMedia(media.NewService(mediaStores["fs"](t),
		media.Limits{MaxBytes: testMediaMaxBytes, AllowedTypes: config.DefaultMediaTypes, TempDir: t.TempDir()}, nil))})
	key := relaytest.NewKey(t)
	blob := pngBlob(t, 700)
	sha := hexSHA(blob)
	mediaRequest := func(method, path, action string, body []byte) *http.Response {
		t.Helper()
		req, err := http.NewRequest(method, hs.URL+path, bytes.NewReader(body))
		require.NoError(t, err)
		req.Header.Set("Authorization", blossomAuth(t, key, action, []string{sha}, nil))
		req.Header.Set("Content-Type", "image/png")
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		t.Cleanup(func() { resp.Body.Close() })
		return resp
	}
	refusedAsAnOutage := func(resp *http.Response) {
		t.Helper()
		var answer map[string]any
		require.NoError(t, json.NewDecoder(resp.Body).Decode(&answer))
		requireOutageAnswer(t, resp, answer, "")
		require.Equal(t, dberr.UnavailableAnswer, resp.Header.Get("X-Reason"))
	}

	arm(statementNamed("ServingLeaseAcquire"))
	refusedAsAnOutage(mediaRequest(http.MethodPut, "/media/upload", "upload", blob))
	bringBack()
	require.Equal(t, http.StatusNotFound, mediaRequest(http.MethodGet, "/media/"+sha, "", nil).StatusCode, "nothing stored")
	require.Equal(t, http.StatusOK, mediaRequest(http.MethodPut, "/media/upload", "upload", blob).StatusCode)

	arm(statementNamed("ServingLeaseAcquire"))
	refusedAsAnOutage(mediaRequest(http.MethodDelete, "/media/"+sha, "delete", nil))
	bringBack()
	require.Equal(t, http.StatusOK, mediaRequest(http.MethodGet, "/media/"+sha, "", nil).StatusCode, "nothing deleted")
	require.Equal(t, http.StatusOK, mediaRequest(http.MethodDelete, "/media/"+sha, "delete", nil).StatusCode)

	for _, statement := range []string{"MediaBlobLock", "MediaUsageReserve"} {
		blob = pngBlob(t, 700)
		sha = hexSHA(blob)
		arm(statementNamed(statement))
		refusedAsAnOutage(mediaRequest(http.MethodPut, "/media/upload", "upload", blob))
		bringBack()
		require.Equal(t, http.StatusNotFound, mediaRequest(http.MethodGet, "/media/"+sha, "", nil).StatusCode, "nothing stored")
		require.Equal(t, http.StatusOK, mediaRequest(http.MethodPut, "/media/upload", "upload", blob).StatusCode)
	}

	logged := logs.String()
	require.NotContains(t, logged, "media request failed", logged)
	require.Contains(t, logged, "first_failure=\"media lease\"", logged)
}

// A database that goes away after the claim, as a request's x-auth-tag
// header is checked against the owner on record (the statement after the
// claim on /events, /query and /count alike), is an outage like the
// claim's: 503 "error: database unavailable; try again" with Retry-After,
// logged once per outage, not a 500 "could not record the owner
// attestation" with an ERROR per request. Once the database is back, the
// same request with a new header is served and records the owner.
// Mutation killed: the owner record's unreachable error left to the
// internal-error branch (500, "record owner attestation" logged).
func TestHTTPBridgeAnswers503WhenTheDatabaseDropsAtTheOwnerAttestation(t *testing.T) {
	t.Parallel()
	hs, logs, arm, bringBack := relayWithOutageBefore(t, nil)
	owner, agentKey := relaytest.NewKey(t), relaytest.NewKey(t)
	tag := attest(t, owner, agentKey.PublicKeyHex(), "")
	signed := func(ev *nostr.Event) { ev.Tags = append(ev.Tags, tag) }
	filters := []byte(`{"filters":[{"kinds":[1]}]}`)
	query := func() (*http.Response, map[string]any) {
		t.Helper()
		req, err := http.NewRequest(http.MethodPost, hs.URL+"/query", bytes.NewReader(filters))
		require.NoError(t, err)
		req.Header.Set("Authorization", authHeader(nip98(t, agentKey, "POST", hs.URL+"/query", filters, signed)))
		req.Header.Set("X-Auth-Tag", tagJSON(t, tag))
		return answerTo(t, req)
	}

	arm(statementNamed("UserChannelAddPolicy"))
	resp, answer := query()
	requireOutageAnswer(t, resp, answer, "")
	logged := logs.String()
	require.NotContains(t, logged, "record owner attestation", logged)
	require.Contains(t, logged, "first_failure=\"http owner attestation\"", logged)

	bringBack()
	resp, answer = query()
	require.Equal(t, http.StatusOK, resp.StatusCode, "%v", answer)
}

// A NIP-98 upload answered 503 "database unavailable" past its claim (the
// database gone as its quota reservation is sent) keeps its claim: giving
// it back is a statement too, and fails while the database is away. So,
// as docs/media.md says, the same header sent again once the database is
// back is a replay (401), and the upload is sent again with a new header,
// which stores it. The database is taken away for real.
// What it checks is the documentation's word, which said such a 503 gave
// its claim back: a change that does (a give-back retried once the
// database answers, say) fails the 401 below, and docs/media.md changes
// with it. Mutation killed: the upload's claim made again by a retry with
// a new header refused as a replay (the new header's retry not 200).
func TestMediaUploadRefusedInAnOutageIsSentAgainWithANewHeader(t *testing.T) {
	t.Parallel()
	hs, _, arm, bringBack := relayWithOutageBefore(t, []relay.Option{relay.WithMedia(media.NewService(mediaStores["fs"](t),
		media.Limits{MaxBytes: testMediaMaxBytes, AllowedTypes: config.DefaultMediaTypes, TempDir: t.TempDir()}, nil))})
	key := relaytest.NewKey(t)
	blob := pngBlob(t, 700)
	upload := func(auth string) (int, map[string]any) {
		t.Helper()
		req, err := http.NewRequest(http.MethodPut, hs.URL+"/media/upload", bytes.NewReader(blob))
		require.NoError(t, err)
		req.Header.Set("Authorization", auth)
		req.Header.Set("Content-Type", "image/png")
		resp, answer := answerTo(t, req)
		return resp.StatusCode, answer
	}
	header := authHeader(nip98(t, key, http.MethodPut, hs.URL+"/media/upload", blob, nil))

	arm(statementNamed("MediaUsageReserve"))
	status, answer := upload(header)
	require.Equal(t, http.StatusServiceUnavailable, status, "%v", answer)
	require.Equal(t, dberr.UnavailableAnswer, answer["error"])
	bringBack()

	status, answer = upload(header)
	require.Equal(t, http.StatusUnauthorized, status, "%v", answer)
	require.Equal(t, "auth-required: "+authEventUsed, answer["error"])
	status, answer = upload(authHeader(nip98(t, key, http.MethodPut, hs.URL+"/media/upload", blob, nil)))
	require.Equal(t, http.StatusOK, status, "%v", answer)
	require.Equal(t, hexSHA(blob), answer["sha256"])
}

// The bridge's GET routes, past their claim, and the workflow webhook
// answer a database gone away as every route answers an outage: 503
// "error: database unavailable; try again" with Retry-After, logged once
// per outage. They answered the same text, but with no Retry-After, and
// the recorded-owner lookup and the webhook with an ERROR per request, the
// workflow history with no line at all (not even for a failure that was no
// outage). The database is taken away for real as the route's first
// statement past the claim (the webhook's first) is sent.
// Mutations killed (one at a time): the recorded-owner lookup's, the
// workflow lookup's or the webhook's failure answered without the outage
// log (no Retry-After; "recorded owner lookup failed" or "workflow
// webhook call failed" logged).
func TestHTTPRoutesAnswerAnOutageAs503WithRetryAfter(t *testing.T) {
	t.Parallel()
	hs, logs, arm, bringBack := relayWithOutageBefore(t, nil)
	key := relaytest.NewKey(t)
	for _, route := range []struct{ method, path, statement string }{
		{http.MethodGet, "/v1/users/" + key.PublicKeyHex() + "/recorded-owner", "UserRecordedOwner"},
		{http.MethodGet, "/workflows/00000000-0000-4000-8000-000000000001/runs", "WorkflowGet"},
		{http.MethodPost, "/hooks/00000000-0000-4000-8000-000000000001", "WorkflowGet"},
	} {
		var body io.Reader
		if route.method == http.MethodPost {
			body = strings.NewReader(`{}`)
		}
		req, err := http.NewRequest(route.method, hs.URL+route.path, body)
		require.NoError(t, err)
		if route.method == http.MethodGet {
			req.Header.Set("Authorization", authHeader(nip98(t, key, http.MethodGet, hs.URL+route.path, nil, nil)))
		}
		requireOutageAt(t, arm, bringBack, route.statement, req)
	}
	logged := logs.String()
	require.NotContains(t, logged, "level=ERROR msg=\"recorded owner", logged)
	require.NotContains(t, logged, "level=ERROR msg=\"workflow", logged)
	require.NotContains(t, logged, "webhook call failed", logged)
	require.Contains(t, logged, "first_failure=\"recorded owner lookup\"", logged)
}

// The operator listener API answers a database gone away as every route
// does: 503 "error: database unavailable; try again" with Retry-After,
// logged once per outage, at its replay claim, at a registration's upsert
// and at a removal alike. The replay claim answered 503 "error: replay
// check unavailable; try again" without Retry-After, and the registration
// and removal 500 "error: could not store the registration", none of them
// logged at all, in an outage or not. The database is taken away for real
// as each statement is sent; once it is back, a registration goes through.
// Mutations killed (one at a time): the replay claim's failure answered as
// before (503 with its own text, no Retry-After); the registration's
// failure answered 500 as before.
func TestOperatorListenerAPIAnswersAnOutageAs503WithRetryAfter(t *testing.T) {
	t.Parallel()
	o := serverWithOutageBefore(t, nil)
	home, err := db.New(o.pool).CommunityByHost(t.Context(), community.NormalizeHost(o.hs.Listener.Addr().String()))
	require.NoError(t, err)
	listenerKey := relaytest.NewKey(t)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	require.NoError(t, o.srv.StartOperatorListeners(ctx, outbox.Config{
		Listeners: outbox.Routes{listenerKey.PublicKeyHex(): "https://listener.invalid/wake"},
		Timeout:   5 * time.Second,
		APIOrigin: o.hs.URL,
	}, home.ID))

	apiURL := o.hs.URL + outbox.RegistrationPath
	body := []byte(`{"pubkeys":["` + relaytest.NewKey(t).PublicKeyHex() + `"]}`)
	signed := func(method string) *http.Request {
		req, err := http.NewRequest(method, apiURL, bytes.NewReader(body))
		require.NoError(t, err)
		req.Header.Set("Authorization", authHeader(nip98(t, listenerKey, method, apiURL, body, nil)))
		return req
	}
	for _, step := range []struct{ method, statement string }{
		{http.MethodPost, "OperatorAuthReplayClaim"},
		{http.MethodPost, "ListenerRegistrationsUpsert"},
		{http.MethodDelete, "OutboxDeleteUnsentForTargets"},
	} {
		requireOutageAt(t, o.arm, o.bringBack, step.statement, signed(step.method))
	}

	resp, answer := answerTo(t, signed(http.MethodPost))
	require.Equal(t, http.StatusOK, resp.StatusCode, "registered once the database is back: %v", answer)
	logged := o.logs.String()
	// The outbox worker's poll counts into the same outage log and may
	// fail first (its statement cut off by the same outage); the answers'
	// Retry-After above already says the outage log took each request.
	require.Regexp(t, `first_failure="(operator auth replay claim|operator-listener outbox poll)"`, logged)
	require.NotContains(t, logged, "msg=\"operator auth replay claim\"", logged)
	require.NotContains(t, logged, "msg=\"listener registration\"", logged)
}

// A POST /events refused before its event was read is counted once, like
// any refused event, by the prefix of its answer: one refused 503 as the
// database goes away before its claim is an "error", as one refused at its
// insert was already (and as a WebSocket EVENT refused in an outage is);
// it was counted nowhere, so the rejected events of an outage depended on
// where each request met it. A 401 is still "auth-required".
// Mutation killed: serveEvents counting only the 401s and 413s of
// authenticate (the outage's refusal counted nowhere).
func TestHTTPBridgeCountsAnEventRefusedAtItsClaimInAnOutage(t *testing.T) {
	t.Parallel()
	databaseURL := dbtest.URL(t)
	hs, _, srv := relayLoggingTo(t, dbtest.PoolOn(t, databaseURL, 4))
	takeAway, _ := databaseOutage(t, databaseURL)
	rejected := func(reason string) float64 {
		return testutil.ToFloat64(srv.Metrics().EventsRejected.WithLabelValues(reason))
	}

	key := relaytest.NewKey(t)
	body, err := json.Marshal(relaytest.SignEvent(t, key, 1, "refused at its claim", nil, 0))
	require.NoError(t, err)
	req, err := http.NewRequest(http.MethodPost, hs.URL+"/events", bytes.NewReader(body))
	require.NoError(t, err)
	req.Header.Set("Authorization", authHeader(nip98(t, key, "POST", hs.URL+"/events", body, nil)))
	sendTakingTheDatabaseAway(t, req, takeAway)
	require.Equal(t, 1.0, rejected("error"))
	require.Zero(t, rejected("auth-required"))
	require.Zero(t, testutil.ToFloat64(srv.Metrics().EventsAccepted.WithLabelValues("stored")))
}

// A NIP-98 upload the database goes away under once its bytes were
// reserved (at its blob lock) gives back both what it took: its claim and
// its quota reservation. Both statements fail while the database is away,
// and each failure logged a WARN, for every such request of an outage,
// under the outage's one line. They are counted instead
// (buzz_http_auth_release_failures_total,
// buzz_media_quota_release_failures_total{outcome="retried"}), and the
// request once, in the outage's failed requests. The quota release's
// retry after the outage gives the bytes back. The database is taken away
// for real.
// The blob it wrote, which it removes as it fails (a database statement
// too), is left to the media sweep without a WARN as well.
// Mutations killed (one at a time): the give-back's failure logged
// whatever its cause ("give back an http auth claim" logged); the quota
// release's ("media quota release failed; retrying" logged); the failed
// upload's blob removal's ("could not remove the blob" logged).
func TestGiveBacksFailingInAnOutageAreCountedNotLogged(t *testing.T) {
	t.Parallel()
	databaseURL := dbtest.URL(t)
	takeAway, letIn := databaseOutage(t, databaseURL)
	var armed atomic.Bool
	hook := hookStatements(&statementHook{before: func(sql string) {
		if statementNamed("MediaBlobLock")(sql) && armed.CompareAndSwap(true, false) {
			takeAway()
		}
	}})
	pool := dbtest.PoolOn(t, databaseURL, 4, hook)
	hs, logs, srv := relayLoggingTo(t, pool, relay.WithMedia(media.NewService(mediaStores["fs"](t),
		media.Limits{MaxBytes: testMediaMaxBytes, AllowedTypes: config.DefaultMediaTypes, TempDir: t.TempDir()}, nil)))
	key := relaytest.NewKey(t)
	req := signedUpload(t, hs, key, pngBlob(t, 700))

	armed.Store(true)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	var answer map[string]any
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&answer))
	resp.Body.Close()
	requireOutageAnswer(t, resp, answer, "the upload")
	metrics := srv.Metrics()
	require.Equal(t, 1.0, testutil.ToFloat64(metrics.HTTPAuthReleaseFailures), "the claim not given back")
	require.Equal(t, 1.0, testutil.ToFloat64(metrics.MediaQuotaReleaseFailures.WithLabelValues("retried")), "the release's first attempt")
	requests, _ := srv.OutageFailures()
	require.Equal(t, 1, requests, "the upload, once")

	letIn()
	pool.Reset()
	require.Eventually(t, func() bool { return strings.Contains(logs.String(), "database reachable again") }, relaytest.Patience, 10*time.Millisecond)
	var used int64
	require.Eventually(t, func() bool {
		require.NoError(t, pool.QueryRow(t.Context(), `SELECT coalesce(sum(bytes), 0)::bigint FROM media_usage`).Scan(&used))
		return used == 0
	}, relaytest.Patience, 10*time.Millisecond, "the reservation given back by the retry")
	logged := logs.String()
	require.NotContains(t, logged, "give back an http auth claim", logged)
	require.NotContains(t, logged, "media quota release", logged)
	require.NotContains(t, logged, "could not remove the blob", logged)
	require.Equal(t, 1, strings.Count(logged, "database unreachable"), logged)
	require.Contains(t, logged, "failed_requests=1 ", logged)
}
