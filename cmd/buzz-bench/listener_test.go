package main

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// listener-setup's files serve the bench's listener, and its certificate is
// the root a client needs (the relay gets it as SSL_CERT_FILE); the
// listener counts the relay's keep-alive HEADs and dates each delivery's
// POST by its event id, the first arrival only.
func TestBenchListenerServesTheSetUpCertificate(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	var out bytes.Buffer
	require.NoError(t, runListenerSetup([]string{dir}, &out))
	pub := strings.TrimSpace(out.String())
	require.Len(t, pub, 64)

	l, err := startBenchListener(dir, "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(l.close)
	require.Equal(t, pub, l.key.PublicKeyHex(), "the printed pubkey is the listener's key")

	pemBytes, err := os.ReadFile(filepath.Join(dir, "cert.pem"))
	require.NoError(t, err)
	roots := x509.NewCertPool()
	require.True(t, roots.AppendCertsFromPEM(pemBytes))
	client := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS12}}, Timeout: 5 * time.Second}
	base := "https://" + l.addr()

	resp, err := client.Head(base + listenerHookPath)
	require.NoError(t, err, "the certificate verifies for 127.0.0.1 against itself")
	resp.Body.Close()
	require.Equal(t, 1, l.keepAlivesSeen())

	posted := l.arrival("abc")
	before := time.Now()
	for range 2 {
		resp, err = client.Post(base+listenerHookPath, "application/json", strings.NewReader(`{"v":1,"event_id":"abc"}`))
		require.NoError(t, err)
		resp.Body.Close()
		require.Equal(t, http.StatusOK, resp.StatusCode)
	}
	at := <-posted
	require.False(t, at.Before(before))
	select {
	case again := <-posted:
		t.Fatalf("a redelivery was recorded too (%v)", again)
	default:
	}

	resp, err = client.Post(base+"/elsewhere", "application/json", strings.NewReader(`{"event_id":"abc"}`))
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusBadRequest, resp.StatusCode)
}

func TestHTTPOrigin(t *testing.T) {
	t.Parallel()
	require.Equal(t, "http://localhost:3300", httpOrigin("ws://localhost:3300"))
	require.Equal(t, "https://relay.example", httpOrigin("wss://relay.example/"))
}

// "all" runs the listener scenario only when the relay was set up for it.
func TestListenerRunsOnlyWhenSetUp(t *testing.T) {
	t.Parallel()
	o, err := parseFlags(nil)
	require.NoError(t, err)
	require.False(t, o.runs("listener"))
	require.True(t, o.runs("fanout"))
	o, err = parseFlags([]string{"-listener-dir", "x"})
	require.NoError(t, err)
	require.True(t, o.runs("listener"))
	_, err = parseFlags([]string{"-scenario", "listener"})
	require.ErrorContains(t, err, "-listener-dir")
}

// Registering the target cannot hang the bench: a relay that takes the
// request and never answers is given up on after opTimeout, like every
// other step of the scenario.
// Mutation killed: register without its own timeout (the scenario's
// context has none).
func TestListenerRegistrationGivesUp(t *testing.T) {
	t.Parallel()
	stop := make(chan struct{})
	silent := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-r.Context().Done():
		case <-stop:
		}
	}))
	t.Cleanup(silent.Close)
	t.Cleanup(func() { close(stop) }) // runs first: Close waits for the handler
	dir := t.TempDir()
	require.NoError(t, runListenerSetup([]string{dir}, io.Discard))
	l, err := startBenchListener(dir, "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(l.close)
	done := make(chan error, 1)
	go func() { done <- l.register(context.Background(), silent.URL, strings.Repeat("ab", 32)) }()
	select {
	case err := <-done:
		require.ErrorIs(t, err, context.DeadlineExceeded)
	case <-time.After(6 * opTimeout):
		t.Fatal("register still waiting for a relay that never answers")
	}
}

// The registration body carries the target as given, whatever it holds:
// a quote or backslash stays inside the string.
//
// Mutation killed: the body built by concatenation (as before): the
// quote ends the string and the body is not JSON.
func TestRegistrationBodyEscapesTheTarget(t *testing.T) {
	t.Parallel()
	target := `ab"],"extra":["\c`
	body, err := registrationBody(target)
	require.NoError(t, err)
	var got struct {
		Pubkeys []string `json:"pubkeys"`
	}
	require.NoError(t, json.Unmarshal(body, &got), string(body))
	require.Equal(t, []string{target}, got.Pubkeys)
}
