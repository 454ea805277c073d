package relay_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/http/httptrace"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/buzzrelay/buzz/internal/community"
	"github.com/buzzrelay/buzz/internal/config"
	"github.com/buzzrelay/buzz/internal/db"
	"github.com/buzzrelay/buzz/internal/dberr"
	"github.com/buzzrelay/buzz/internal/dbtest"
	"github.com/buzzrelay/buzz/internal/logtest"
	"github.com/buzzrelay/buzz/internal/media"
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
	_, answer := sendTakingTheDatabaseAway(t, req, takeAway)
	require.Equal(t, map[string]string{"error": dberr.UnavailableAnswer}, answer)

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
	pool := dbtest.PoolOn(t, databaseURL, 4)
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
	takeAway, _ := databaseOutage(t, databaseURL)
	return hs, logs, takeAway
}

// sendTakingTheDatabaseAway sends req with Expect: 100-continue and takes
// the database away when the relay asks for the body (past the host
// lookup, before the claim), then asserts the outage's answer: 503 with
// Retry-After. It returns the response (its body read) and the JSON answer.
func sendTakingTheDatabaseAway(t *testing.T, req *http.Request, takeAway func()) (*http.Response, map[string]string) {
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
	var answer map[string]string
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&answer))
	require.Equal(t, http.StatusServiceUnavailable, resp.StatusCode, "%v", answer)
	require.Equal(t, "1", resp.Header.Get("Retry-After"))
	return resp, answer
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
	blob := pngBlob(t, 700)
	req, err := http.NewRequest(http.MethodPut, hs.URL+"/media/upload", bytes.NewReader(blob))
	require.NoError(t, err)
	req.Header.Set("Authorization", authHeader(nip98(t, key, http.MethodPut, hs.URL+"/media/upload", blob, nil)))
	req.Header.Set("Content-Type", "image/png")
	resp, answer := sendTakingTheDatabaseAway(t, req, takeAway)
	require.Equal(t, dberr.UnavailableAnswer, resp.Header.Get("X-Reason"))
	require.Equal(t, map[string]string{"error": dberr.UnavailableAnswer}, answer)

	logged := logs.String()
	require.NotContains(t, logged, "media auth failed", logged)
	require.NotContains(t, logged, "media request failed", logged)
	require.Equal(t, 1, strings.Count(logged, "database unreachable"), logged)
}
