package relay_test

import (
	"bytes"
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/buzzrelay/buzz/internal/outbox"
	"github.com/buzzrelay/buzz/internal/relaytest"
)

// A relay whose operator API has no origin configured cannot check any u
// tag: the API is absent (404), not broken (500).
func TestUnconfiguredOperatorAPIIs404(t *testing.T) {
	t.Parallel()
	r := relaytest.Start(t)
	listenerKey := relaytest.NewKey(t)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	cfg := outbox.Config{
		Listeners: outbox.Routes{listenerKey.PublicKeyHex(): "https://listener.invalid/wake"},
		Timeout:   5 * time.Second,
	}
	require.NoError(t, r.Server.StartOperatorListeners(ctx, cfg, r.CommunityID))

	body := []byte(`{"pubkeys":["` + relaytest.NewKey(t).PublicKeyHex() + `"]}`)
	for _, method := range []string{http.MethodPost, http.MethodDelete} {
		req, err := http.NewRequest(method, r.HTTPURL+outbox.RegistrationPath, bytes.NewReader(body))
		require.NoError(t, err)
		req.Header.Set("Authorization", authHeader(nip98(t, listenerKey, method, r.HTTPURL+outbox.RegistrationPath, body, nil)))
		resp, err := bridgeHTTP.Do(req)
		require.NoError(t, err)
		resp.Body.Close()
		require.Equal(t, http.StatusNotFound, resp.StatusCode, method)
	}
}
