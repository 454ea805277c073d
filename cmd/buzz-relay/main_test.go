package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/buzzrelay/buzz/internal/config"
	"github.com/buzzrelay/buzz/internal/dbtest"
	"github.com/buzzrelay/buzz/internal/relaytest"
)

func TestMain(m *testing.M) { dbtest.Main(m) }

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

func freePort(t *testing.T) int {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

func waitReady(t *testing.T, port int) {
	t.Helper()
	require.Eventually(t, func() bool {
		resp, err := http.Get(fmt.Sprintf("http://127.0.0.1:%d/ready", port))
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	}, 60*time.Second, 20*time.Millisecond)
}

func TestServeRefusesADatabaseThatIsBehind(t *testing.T) {
	t.Parallel()
	cfg := config.Default()
	cfg.DatabaseURL = dbtest.EmptyURL(t)
	port := freePort(t)
	cfg.ListenAddr = fmt.Sprintf("127.0.0.1:%d", port)
	cfg.MetricsAddr = "127.0.0.1:0"
	err := serve(context.Background(), cfg, quiet, noEnv)
	require.ErrorContains(t, err, "run `buzz-relay migrate` first")

	require.NoError(t, runMigrate(context.Background(), cfg, nil))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- serve(ctx, cfg, quiet, noEnv) }()
	waitReady(t, port)
	cancel()
	require.NoError(t, <-done)
}

// The dev relay keeps its private cluster across restarts: an event
// published before a stop is still there after the next start.
func TestDevRelaySurvivesRestart(t *testing.T) {
	t.Parallel()
	dataDir, err := os.MkdirTemp("", "buzz-dev-test-")
	require.NoError(t, err)
	require.NoError(t, os.Chmod(dataDir, 0o755)) // the postgres user must reach it when we are root
	t.Cleanup(func() { os.RemoveAll(dataDir) })
	opts := devOptions{DataDir: dataDir, PGPort: freePort(t)}

	port := freePort(t)
	cfg := config.Default()
	cfg.RelayURL = fmt.Sprintf("ws://localhost:%d", port)
	cfg.ListenAddr = fmt.Sprintf("127.0.0.1:%d", port)
	cfg.MetricsAddr = "127.0.0.1:0"
	start := func() (stop func()) {
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- dev(ctx, cfg, quiet, opts, noEnv) }()
		waitReady(t, port)
		return func() {
			cancel()
			require.NoError(t, <-done)
		}
	}
	relay := &relaytest.Relay{URL: fmt.Sprintf("ws://127.0.0.1:%d", port), Host: fmt.Sprintf("localhost:%d", port)}

	stop := start()
	c := relay.Dial(t, "")
	c.Auth(nil)
	ev := c.Sign(1, "still here after a restart", nil, 0)
	require.True(t, c.Publish(ev).OK)
	c.WS.CloseNow()
	stop()

	stop = start()
	defer stop()
	c = relay.Dial(t, "")
	c.Auth(nil)
	got := c.Req("again", map[string]any{"ids": []string{ev.ID}})
	require.Len(t, got, 1)
	require.Equal(t, ev.Content, got[0].Content)
}
