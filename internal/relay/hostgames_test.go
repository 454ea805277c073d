package relay_test

import (
	"bufio"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/buzzrelay/buzz/internal/config"
	"github.com/buzzrelay/buzz/internal/relaytest"
)

// TestHostGamesReachOnlyTheNamedCommunity sends raw requests whose Host
// is spelled every way a client may try, to a relay that trusts the
// loopback proxy: the community is the one the request's own authority
// names after normalization (case, one trailing dot, a default port), a
// forwarded host is never read, two Host headers are refused, and an
// absolute request target binds its host for the NIP-98 check too, so a
// token signed for one community's URL cannot be carried to another by
// any spelling.
func TestHostGamesReachOnlyTheNamedCommunity(t *testing.T) {
	t.Parallel()
	r := relaytest.Start(t, func(c *config.Config) { c.TrustedProxies = mustPrefixes(t, "127.0.0.0/8,::1") })
	r.AddCommunity(t, "b.example")
	addr := strings.TrimPrefix(r.HTTPURL, "http://")
	raw := func(requestLine, body string, headers ...string) (int, string) {
		t.Helper()
		conn, err := net.Dial("tcp", addr)
		require.NoError(t, err)
		defer conn.Close()
		require.NoError(t, conn.SetDeadline(time.Now().Add(relaytest.Patience)))
		if body != "" {
			headers = append(headers, "Content-Length: "+strconv.Itoa(len(body)))
		}
		req := requestLine + "\r\n" + strings.Join(append(headers, "Connection: close"), "\r\n") + "\r\n\r\n" + body
		_, err = conn.Write([]byte(req))
		require.NoError(t, err)
		resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
		require.NoError(t, err)
		defer resp.Body.Close()
		var answer strings.Builder
		_, _ = bufio.NewReader(resp.Body).WriteTo(&answer)
		return resp.StatusCode, answer.String()
	}
	servedFor := func(host string) string {
		return "Buzz relay for " + host + ". Connect with a Nostr client over WebSocket."
	}

	for name, c := range map[string]struct {
		line    string
		headers []string
		status  int
		served  string // "" unless 200
	}{
		"upper case":                      {"GET / HTTP/1.1", []string{"Host: B.EXAMPLE"}, 200, "b.example"},
		"trailing dot":                    {"GET / HTTP/1.1", []string{"Host: b.example."}, 200, "b.example"},
		"default port 443":                {"GET / HTTP/1.1", []string{"Host: b.example:443"}, 200, "b.example"},
		"default port 80":                 {"GET / HTTP/1.1", []string{"Host: b.example:80"}, 200, "b.example"},
		"another port":                    {"GET / HTTP/1.1", []string{"Host: b.example:8443"}, 404, ""},
		"dot before the port":             {"GET / HTTP/1.1", []string{"Host: b.example.:8443"}, 404, ""},
		"dot after the default port":      {"GET / HTTP/1.1", []string{"Host: b.example:443."}, 200, "b.example"},
		"two dots":                        {"GET / HTTP/1.1", []string{"Host: b.example.."}, 404, ""},
		"two default ports":               {"GET / HTTP/1.1", []string{"Host: b.example:443:443"}, 404, ""},
		"punycode of another name":        {"GET / HTTP/1.1", []string{"Host: xn--b-example-9ya.example"}, 404, ""},
		"non-ASCII":                       {"GET / HTTP/1.1", []string{"Host: b.exämple"}, 400, ""},
		"second Host header":              {"GET / HTTP/1.1", []string{"Host: " + r.Host, "Host: b.example"}, 400, ""},
		"X-Forwarded-Host from the proxy": {"GET / HTTP/1.1", []string{"Host: " + r.Host, "X-Forwarded-Host: b.example"}, 200, r.Host},
		"Forwarded host from the proxy":   {"GET / HTTP/1.1", []string{"Host: " + r.Host, "Forwarded: host=b.example"}, 200, r.Host},
		"absolute target names B":         {"GET http://b.example/ HTTP/1.1", []string{"Host: " + r.Host}, 200, "b.example"},
		"absolute target names A":         {"GET http://" + r.Host + "/ HTTP/1.1", []string{"Host: b.example"}, 200, r.Host},
	} {
		status, body := raw(c.line, "", c.headers...)
		require.Equal(t, c.status, status, "%s: %s", name, body)
		if c.served != "" {
			require.Equal(t, servedFor(c.served), strings.TrimSpace(body), name)
		}
	}

	// A NIP-98 token signed for A's URL, sent with A's Host header but an
	// absolute target naming B: the request is B's, and so is the URL the
	// token must name.
	key := relaytest.NewKey(t)
	body := []byte(`[{"kinds":[1]}]`)
	forA := nip98(t, key, "POST", r.HTTPURL+"/count", body, nil)
	status, answer := raw("POST http://b.example/count HTTP/1.1", string(body), "Host: "+r.Host,
		"Authorization: "+authHeader(forA), "Content-Type: application/json")
	require.Equal(t, http.StatusUnauthorized, status, answer)
	require.Contains(t, answer, "u tag does not match this URL (http://b.example/count)")
}
