package relay_test

import (
	"net/http"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/buzzrelay/buzz/internal/nostr"
	"github.com/buzzrelay/buzz/internal/relaytest"
)

// withoutPayload drops the payload tag from a NIP-98 event before signing.
func withoutPayload(ev *nostr.Event) {
	kept := nostr.Tags{}
	for _, tag := range ev.Tags {
		if tag[0] != "payload" {
			kept = append(kept, tag)
		}
	}
	ev.Tags = kept
}

// A request with a body must sign the body's hash: without the payload tag
// a captured Authorization header could carry any other body.
func TestHTTPBridgeRequiresPayloadTagWithABody(t *testing.T) {
	t.Parallel()
	r := relaytest.Start(t)
	key := relaytest.NewKey(t)
	ev := relaytest.SignEvent(t, key, 1, "unbound body", nil, 0)
	for path, body := range map[string][]byte{
		"/events": encodeBody(t, ev),
		"/query":  encodeBody(t, query(map[string]any{"kinds": []int{1}})),
		"/count":  encodeBody(t, query(map[string]any{"kinds": []int{1}})),
	} {
		auth := nip98(t, key, "POST", r.HTTPURL+path, body, withoutPayload)
		got := send(t, r, "", path, authHeader(auth), body)
		require.Equal(t, http.StatusUnauthorized, got.Status, "%s: %s", path, got.Raw)
		require.Contains(t, got.Error, "payload tag", path)
	}
	// Nothing was stored by the refused submission.
	got := post(t, r, key, "/query", query(map[string]any{"ids": []string{ev.ID}}))
	require.Equal(t, http.StatusOK, got.Status, got.Raw)
	require.Empty(t, got.Events)
}
