package main

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/coder/websocket"
	"github.com/stretchr/testify/require"

	"github.com/buzzrelay/buzz/internal/nostr"
)

// Tests against fake relays that misbehave in ways the real one does not
// (or only under load), to pin how the CLI reports each case.

// scriptedRelay is a fake relay: it sends an AUTH challenge, accepts any
// AUTH with OK true and hands every later message to onMsg. onHTTP, when
// set, serves the plain HTTP requests (the NIP-98 commands).
func scriptedRelay(t *testing.T, onMsg func(ctx context.Context, ws *websocket.Conn, verb string, parts []json.RawMessage), onHTTP http.HandlerFunc) (wsURL string) {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !strings.EqualFold(r.Header.Get("Upgrade"), "websocket") {
			if onHTTP != nil {
				onHTTP(w, r)
			}
			return
		}
		ws, err := websocket.Accept(w, r, nil)
		if err != nil {
			return
		}
		defer ws.CloseNow()
		ws.SetReadLimit(16 << 20)
		ctx := r.Context()
		_ = ws.Write(ctx, websocket.MessageText, []byte(`["AUTH","challenge"]`))
		for {
			_, data, err := ws.Read(ctx)
			if err != nil {
				return
			}
			var parts []json.RawMessage
			var verb string
			if json.Unmarshal(data, &parts) != nil || len(parts) < 2 || json.Unmarshal(parts[0], &verb) != nil {
				return
			}
			if verb == "AUTH" {
				writeOK(ctx, ws, parts[1], true, "")
				continue
			}
			onMsg(ctx, ws, verb, parts)
		}
	}))
	t.Cleanup(srv.Close)
	return "ws" + strings.TrimPrefix(srv.URL, "http")
}

// writeOK answers the event in raw with an OK message.
func writeOK(ctx context.Context, ws *websocket.Conn, raw json.RawMessage, ok bool, msg string) {
	var ev struct {
		ID string `json:"id"`
	}
	_ = json.Unmarshal(raw, &ev)
	reply, _ := json.Marshal([]any{"OK", ev.ID, ok, msg})
	_ = ws.Write(ctx, websocket.MessageText, reply)
}

// fakeRelayEnv is a fresh key and relay URL as the CLI's environment.
func fakeRelayEnv(t *testing.T, relay string) map[string]string {
	t.Helper()
	key, err := nostr.GenerateSecretKey()
	require.NoError(t, err)
	return map[string]string{"BUZZ_PRIVATE_KEY": key.Hex(), "BUZZ_RELAY_URL": relay}
}

// A relay refusing the WebSocket upgrade (429 per address, 503 at its
// connection limit, 404 for an unknown community host) has refused: exit
// 3, its NIP-01 prefix as the code (else http_STATUS) and its reason in
// the message. Mutation killed: Dial ignoring the failed upgrade's
// response reports code "network" with the library's "expected handshake
// response status code 101" and drops the relay's reason.
func TestUpgradeRefusalIsReportedAsRefusal(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		status   int
		body     string
		wantCode string
		wantMsg  string
	}{
		{http.StatusTooManyRequests, `{"error":"rate-limited: at most 50 connections per client address"}`, "rate-limited", "at most 50 connections"},
		{http.StatusServiceUnavailable, `{"error":"relay is at its limit of 10 connections; try again later"}`, "http_503", "at its limit of 10"},
		{http.StatusNotFound, `<html>not found</html>`, "http_404", "404 Not Found"},
	} {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(tc.status)
			_, _ = w.Write([]byte(tc.body))
		}))
		t.Cleanup(srv.Close)
		e := buzz(t, fakeRelayEnv(t, "ws"+strings.TrimPrefix(srv.URL, "http")), "", "channels", "list").fail(t, 3)
		require.Equal(t, tc.wantCode, e.Code, e.Error)
		require.Contains(t, e.Error, tc.wantMsg)
	}
}
