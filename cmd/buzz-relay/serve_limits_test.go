package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
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
	port := freePort(t)
	cfg.ListenAddr = fmt.Sprintf("127.0.0.1:%d", port)
	cfg.MetricsAddr = "127.0.0.1:0"
	for _, value := range []string{"not-a-pubkey:https://listener.example/wake", "abc", "0123:"} {
		env := map[string]string{"BUZZ_OPERATOR_LISTENERS": value}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		err := serve(ctx, cfg, quiet, func(k string) string { return env[k] })
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
	port, metricsPort := freePort(t), freePort(t)
	cfg.RelayURL = fmt.Sprintf("ws://localhost:%d", port)
	cfg.ListenAddr = fmt.Sprintf("127.0.0.1:%d", port)
	cfg.MetricsAddr = fmt.Sprintf("127.0.0.1:%d", metricsPort)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- serve(ctx, cfg, quiet, noEnv) }()
	defer func() {
		cancel()
		require.NoError(t, <-done)
	}()
	waitReady(t, port)

	get := func(url string) (int, string) {
		resp, err := http.Get(url)
		require.NoError(t, err)
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(body)
	}
	status, _ := get(fmt.Sprintf("http://127.0.0.1:%d/metrics", port))
	require.Equal(t, http.StatusNotFound, status)
	status, body := get(fmt.Sprintf("http://127.0.0.1:%d/metrics", metricsPort))
	require.Equal(t, http.StatusOK, status)
	require.Contains(t, body, "buzz_connections")
}
