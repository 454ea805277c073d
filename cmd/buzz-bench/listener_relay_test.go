package main

import (
	"bytes"
	"context"
	"crypto/x509"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/buzzrelay/buzz/internal/config"
	"github.com/buzzrelay/buzz/internal/dbtest"
	"github.com/buzzrelay/buzz/internal/outbox"
	"github.com/buzzrelay/buzz/internal/relaytest"
)

// The relay tests below need PostgreSQL.
func TestMain(m *testing.M) { dbtest.Main(m) }

// The listener scenario against a real relay: the relay routes the bench's
// listener, and the scenario's client sits quiet through the wait for the
// first keep-alive and through the idle before the last mention, far
// longer than the relay's ping interval here (200 ms, 30 s by default
// against `make bench`'s 2-minute idle). The relay closes a connection
// that answers no ping, and a coder/websocket client answers pings only
// while it reads: the mention after the idle went out on a closed
// connection and the scenario reported an error instead of a number.
// Mutation killed: publishing every mention on the connection that created
// the channel (one dial for the whole scenario).
func TestListenerScenarioThroughARelaySurvivesItsIdle(t *testing.T) {
	t.Parallel()
	r := relaytest.Start(t, func(c *config.Config) { c.PingInterval = 200 * time.Millisecond })

	dir := t.TempDir()
	var out bytes.Buffer
	require.NoError(t, runListenerSetup([]string{dir}, &out))
	l, err := startBenchListener(dir, "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(l.close)
	pemBytes, err := os.ReadFile(filepath.Join(dir, "cert.pem"))
	require.NoError(t, err)
	roots := x509.NewCertPool()
	require.True(t, roots.AppendCertsFromPEM(pemBytes))

	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	cfg := outbox.Config{
		Listeners: outbox.Routes{strings.TrimSpace(out.String()): "https://" + l.addr() + listenerHookPath},
		Timeout:   5 * time.Second,
		APIOrigin: r.HTTPURL,
		KeepWarm:  300 * time.Millisecond,
	}
	require.NoError(t, r.Server.StartOperatorListeners(ctx, cfg, r.CommunityID, outbox.WithRootCAs(roots)))

	o, err := parseFlags([]string{"-url", r.URL, "-listener-dir", dir, "-listener-mentions", "2",
		"-listener-spacing", "0s", "-listener-idle", "2s"})
	require.NoError(t, err)
	o.runID = newRunID()
	rep := runListener(ctx, o, l)
	require.Empty(t, rep.Error)
	require.Equal(t, 3, rep.Delivered)
	require.Positive(t, rep.KeepAlives)
}
