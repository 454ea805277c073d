package main

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"net/http"
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
	require.Equal(t, pub, l.signer.pubHex, "the printed pubkey is the listener's key")

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
