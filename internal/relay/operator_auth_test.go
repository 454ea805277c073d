package relay_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/buzzrelay/buzz/internal/nostr"
	"github.com/buzzrelay/buzz/internal/outbox"
	"github.com/buzzrelay/buzz/internal/relaytest"
)

type operatorReply struct {
	Status int
	Raw    string
	Error  string `json:"error"`
}

// operatorRequest sends body to the registration API on r as host ("" = the
// relay's own address) with auth as its NIP-98 header (nil = none).
func operatorRequest(t *testing.T, r *relaytest.Relay, method, host string, body []byte, auth *nostr.Event) operatorReply {
	t.Helper()
	req, err := http.NewRequest(method, r.HTTPURL+outbox.RegistrationPath, bytes.NewReader(body))
	require.NoError(t, err)
	if host != "" {
		req.Host = host
	}
	if auth != nil {
		req.Header.Set("Authorization", authHeader(auth))
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	reply := operatorReply{Status: resp.StatusCode, Raw: string(raw)}
	_ = json.Unmarshal(raw, &reply)
	return reply
}

// The operator API's own NIP-98 rules, through the relay's real verifier:
// the u tag must name RELAY_OPERATOR_API_ORIGIN (a proxy in front of the
// relay forwards some other Host, which must not count), and a payload tag
// is required and must hash the body.
//
// Mutations killed: checking u against the request's Host (requestURL)
// instead of the configured origin fails "u names the origin" and "u names
// the Host"; dropping the required payload tag fails "no payload tag";
// dropping the hash comparison fails "payload of another body".
func TestOperatorAPINIP98Rules(t *testing.T) {
	t.Parallel()
	r := relaytest.Start(t)
	const origin = "https://ops.example"
	listenerKey := relaytest.NewKey(t)
	cfg := outbox.Config{
		Listeners: outbox.Routes{listenerKey.PublicKeyHex(): "https://listener.invalid/wake"},
		Timeout:   5 * time.Second,
		APIOrigin: origin,
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	require.NoError(t, r.Server.StartOperatorListeners(ctx, cfg, r.CommunityID))

	body := []byte(`{"pubkeys":["` + relaytest.NewKey(t).PublicKeyHex() + `"]}`)
	originURL := origin + outbox.RegistrationPath
	hostURL := r.HTTPURL + outbox.RegistrationPath
	for _, tc := range []struct {
		name   string
		host   string // the Host header the relay sees ("" = its address)
		auth   *nostr.Event
		status int
		error  string
	}{
		{name: "u names the origin", auth: nip98(t, listenerKey, "POST", originURL, body, nil), status: http.StatusOK},
		{name: "u names the origin, Host is the origin's", host: "ops.example", auth: nip98(t, listenerKey, "POST", originURL, body, nil), status: http.StatusOK},
		{name: "u names the Host", auth: nip98(t, listenerKey, "POST", hostURL, body, nil),
			status: http.StatusUnauthorized, error: originURL},
		{name: "u names the Host a proxy forwarded", host: "proxy.example", auth: nip98(t, listenerKey, "POST", "http://proxy.example"+outbox.RegistrationPath, body, nil),
			status: http.StatusUnauthorized, error: "u tag"},
		{name: "u names the URL as received (http), not the origin (https)", host: "ops.example", auth: nip98(t, listenerKey, "POST", "http://ops.example"+outbox.RegistrationPath, body, nil),
			status: http.StatusUnauthorized, error: originURL},
		{name: "no payload tag", auth: nip98(t, listenerKey, "POST", originURL, body, func(ev *nostr.Event) { ev.Tags = withoutTag(ev.Tags, "payload") }),
			status: http.StatusUnauthorized, error: "payload"},
		{name: "payload of another body", auth: nip98(t, listenerKey, "POST", originURL, []byte(`{"pubkeys":[]}`), nil),
			status: http.StatusUnauthorized, error: "payload"},
		{name: "no Authorization header", status: http.StatusUnauthorized, error: "Authorization"},
	} {
		reply := operatorRequest(t, r, http.MethodPost, tc.host, body, tc.auth)
		require.Equal(t, tc.status, reply.Status, "%s: %s", tc.name, reply.Raw)
		if tc.error != "" {
			require.Contains(t, reply.Error, tc.error, "%s: the refusal names what is wrong", tc.name)
		}
	}
}

func withoutTag(tags nostr.Tags, name string) nostr.Tags {
	var out nostr.Tags
	for _, tag := range tags {
		if len(tag) > 0 && tag[0] != name {
			out = append(out, tag)
		}
	}
	return out
}
