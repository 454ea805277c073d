package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/buzzrelay/buzz/internal/config"
	"github.com/buzzrelay/buzz/internal/dbtest"
)

func noEnv(string) string { return "" }

// A malformed BUZZ_OPERATOR_LISTENERS stops serve before it touches the
// database or opens a port.
func TestServeRefusesMalformedOperatorListeners(t *testing.T) {
	t.Parallel()
	cfg := config.Default()
	cfg.DatabaseURL = dbtest.URL(t)
	cfg.MetricsAddr = "127.0.0.1:0"
	for _, value := range []string{"not-a-pubkey:https://listener.example/wake", "abc", "0123:"} {
		env := map[string]string{"BUZZ_OPERATOR_LISTENERS": value}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		listener, _ := listenLoopback(t)
		err := serve(ctx, cfg, quiet, mustListen(t, cfg, listener), func(k string) string { return env[k] })
		cancel()
		require.ErrorContains(t, err, "operator listeners", value)
		require.ErrorContains(t, err, "BUZZ_OPERATOR_LISTENERS", value)
	}
}

// /metrics is served on BUZZ_METRICS_ADDR only, never on the public
// listener that every community's host reaches.
func TestServeKeepsMetricsOffThePublicListener(t *testing.T) {
	t.Parallel()
	cfg := config.Default()
	cfg.DatabaseURL = dbtest.URL(t)
	listener, port := listenLoopback(t)
	cfg.RelayURL = fmt.Sprintf("ws://localhost:%d", port)
	cfg.MetricsAddr = "127.0.0.1:0"
	var logs lockedBuffer
	addrs := mustListen(t, cfg, listener)
	runRelay(t, port, func(ctx context.Context, _ *slog.Logger) error {
		return serve(ctx, cfg, slog.New(slog.NewJSONHandler(&logs, nil)), addrs, noEnv)
	})
	metricsAddr := logs.attr(t, "metrics listening", "addr")

	get := func(url string) (int, string) {
		resp, err := http.Get(url)
		require.NoError(t, err)
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(body)
	}
	status, _ := get(fmt.Sprintf("http://127.0.0.1:%d/metrics", port))
	require.Equal(t, http.StatusNotFound, status)
	status, body := get("http://" + metricsAddr + "/metrics")
	require.Equal(t, http.StatusOK, status)
	require.Contains(t, body, "buzz_connections")
}

// lockedBuffer collects a relay's JSON log lines while it runs.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

// attr returns attribute key of the first log line with message msg.
func (b *lockedBuffer) attr(t *testing.T, msg, key string) string {
	t.Helper()
	b.mu.Lock()
	defer b.mu.Unlock()
	lines := bufio.NewScanner(bytes.NewReader(b.buf.Bytes()))
	for lines.Scan() {
		var line map[string]any
		if json.Unmarshal(lines.Bytes(), &line) == nil && line["msg"] == msg {
			if v, ok := line[key].(string); ok {
				return v
			}
		}
	}
	t.Fatalf("no %q log line with %s in:\n%s", msg, key, b.buf.String())
	return ""
}
