package safehttp

import (
	"context"
	"crypto/x509"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// fakeResolver answers every name with fixed addresses.
type fakeResolver struct {
	addrs []netip.Addr
	calls atomic.Int32
}

func (r *fakeResolver) LookupNetIP(context.Context, string, string) ([]netip.Addr, error) {
	r.calls.Add(1)
	return r.addrs, nil
}

// loopback lets tests reach their own server on 127.0.0.1.
var loopback = []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8"), netip.MustParsePrefix("::1/128")}

func tlsServer(t *testing.T, handler http.HandlerFunc) (*httptest.Server, *x509.CertPool) {
	t.Helper()
	srv := httptest.NewTLSServer(handler)
	t.Cleanup(srv.Close)
	pool := x509.NewCertPool()
	pool.AddCert(srv.Certificate())
	return srv, pool
}

// hostURL rewrites the server URL to the host name its certificate names,
// so that the test resolver decides where it points.
func hostURL(t *testing.T, srv *httptest.Server, path string) string {
	t.Helper()
	u, err := url.Parse(srv.URL)
	require.NoError(t, err)
	return "https://example.com:" + u.Port() + path
}

func requireKind(t *testing.T, err error, kind Kind) *Error {
	t.Helper()
	var e *Error
	require.ErrorAs(t, err, &e)
	require.Equal(t, kind, e.Kind, "error: %v", err)
	return e
}

func TestLoopbackServerIsRefusedByDefault(t *testing.T) {
	t.Parallel()
	var hits atomic.Int32
	srv, pool := tlsServer(t, func(w http.ResponseWriter, r *http.Request) { hits.Add(1) })
	client := New(Options{RootCAs: pool})

	_, err := client.Do(context.Background(), Request{URL: srv.URL + "/hook?token=s3cret"})
	e := requireKind(t, err, KindBlockedAddress)
	require.Equal(t, "127.0.0.1", e.Host)
	require.Equal(t, "127.0.0.1 is not a public address", e.Detail, "refused before dialing")
	require.NotContains(t, err.Error(), "s3cret")
	require.Zero(t, hits.Load(), "the server must never be contacted")
}

func TestHostNameResolvingToBlockedAddressIsRefused(t *testing.T) {
	t.Parallel()
	var hits atomic.Int32
	srv, pool := tlsServer(t, func(w http.ResponseWriter, r *http.Request) { hits.Add(1) })
	cases := []struct {
		name    string
		addrs   []string
		blocked string
	}{
		{"loopback", []string{"127.0.0.1"}, "127.0.0.1"},
		{"metadata", []string{"169.254.169.254"}, "169.254.169.254"},
		{"mapped loopback", []string{"::ffff:127.0.0.1"}, "127.0.0.1"},
		{"one public and one private answer", []string{"93.184.215.14", "127.0.0.1"}, "127.0.0.1"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			res := &fakeResolver{}
			for _, a := range tc.addrs {
				res.addrs = append(res.addrs, netip.MustParseAddr(a))
			}
			client := New(Options{RootCAs: pool, Resolver: res})
			_, err := client.Do(context.Background(), Request{URL: hostURL(t, srv, "/")})
			e := requireKind(t, err, KindBlockedAddress)
			require.Equal(t, "example.com", e.Host)
			// Refused while checking the answers, so nothing was dialed,
			// not even the public address. The answer is not told: the
			// relay's resolver may know a private network's names.
			require.Equal(t, "resolves to an address that is not public (loopback, private, link-local or the like)", e.Detail)
			require.NotContains(t, err.Error(), tc.blocked)
		})
	}
	require.Zero(t, hits.Load())
}

func TestDialsTheResolvedAddressAndSendsTheRequest(t *testing.T) {
	t.Parallel()
	type seen struct {
		method, path, auth, custom, host, ua string
		body                                 []byte
	}
	got := make(chan seen, 1)
	srv, pool := tlsServer(t, func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		got <- seen{r.Method, r.URL.RequestURI(), r.Header.Get("Authorization"), r.Header.Get("X-Custom"), r.Host, r.UserAgent(), body}
		w.WriteHeader(http.StatusAccepted)
		_, _ = w.Write([]byte(`{"ok":true}`))
	})
	res := &fakeResolver{addrs: []netip.Addr{netip.MustParseAddr("127.0.0.1")}}
	client := New(Options{RootCAs: pool, Resolver: res, AllowedNets: loopback})

	resp, err := client.Do(context.Background(), Request{
		URL:     hostURL(t, srv, "/hook?x=1"),
		Headers: map[string]string{"authorization": "Bearer t", "X-Custom": "v"},
		Body:    []byte(`{"a":1}`),
	})
	require.NoError(t, err)
	require.Equal(t, Response{Status: http.StatusAccepted, Body: []byte(`{"ok":true}`)}, resp)
	s := <-got
	require.Equal(t, "POST", s.method, "POST is the default method")
	require.Equal(t, "/hook?x=1", s.path)
	require.Equal(t, "Bearer t", s.auth)
	require.Equal(t, "v", s.custom)
	require.True(t, strings.HasPrefix(s.host, "example.com:"), "the Host header is the URL's host: %s", s.host)
	require.Equal(t, "buzz-relay-webhook", s.ua)
	require.Equal(t, []byte(`{"a":1}`), s.body)
	require.EqualValues(t, 1, res.calls.Load())
}

func TestRedirectIsReturnedNotFollowed(t *testing.T) {
	t.Parallel()
	var followed atomic.Int32
	srv, pool := tlsServer(t, func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/inner" {
			followed.Add(1)
			return
		}
		http.Redirect(w, r, "/inner", http.StatusFound)
	})
	client := New(Options{RootCAs: pool, AllowedNets: loopback})
	for _, method := range []string{"GET", "POST"} {
		resp, err := client.Do(context.Background(), Request{Method: method, URL: srv.URL + "/start"})
		require.NoError(t, err)
		require.Equal(t, http.StatusFound, resp.Status)
	}
	require.Zero(t, followed.Load())
}

func TestResponseBodyCap(t *testing.T) {
	t.Parallel()
	srv, pool := tlsServer(t, func(w http.ResponseWriter, r *http.Request) {
		size := DefaultMaxResponseBytes
		if r.URL.Path == "/over" {
			size++
		}
		_, _ = w.Write(make([]byte, size))
	})
	client := New(Options{RootCAs: pool, AllowedNets: loopback})

	resp, err := client.Do(context.Background(), Request{Method: "GET", URL: srv.URL + "/exact"})
	require.NoError(t, err)
	require.Len(t, resp.Body, DefaultMaxResponseBytes)

	_, err = client.Do(context.Background(), Request{Method: "GET", URL: srv.URL + "/over"})
	requireKind(t, err, KindResponseTooLarge)
}

func TestTimeout(t *testing.T) {
	t.Parallel()
	srv, pool := tlsServer(t, func(w http.ResponseWriter, r *http.Request) {
		// Never answers: returning once the client gives up would answer
		// 200, and the client can still read that late answer.
		<-r.Context().Done()
		panic(http.ErrAbortHandler)
	})
	client := New(Options{RootCAs: pool, AllowedNets: loopback, Timeout: 200 * time.Millisecond})
	_, err := client.Do(context.Background(), Request{URL: srv.URL})
	requireKind(t, err, KindTimeout)
}

func TestUntrustedCertificateFails(t *testing.T) {
	t.Parallel()
	srv, _ := tlsServer(t, func(http.ResponseWriter, *http.Request) {})
	client := New(Options{AllowedNets: loopback})
	_, err := client.Do(context.Background(), Request{URL: srv.URL + "/?token=s3cret"})
	requireKind(t, err, KindTransport)
	require.NotContains(t, err.Error(), "s3cret")
}

func TestConnectFailureHidesTheURL(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	require.NoError(t, ln.Close()) // nothing listens there now
	client := New(Options{AllowedNets: loopback})
	_, err = client.Do(context.Background(), Request{URL: "https://" + addr + "/p?token=s3cret"})
	requireKind(t, err, KindConnect)
	require.NotContains(t, err.Error(), "s3cret")
}

func TestInvalidRequests(t *testing.T) {
	t.Parallel()
	const secret = "s3cret-value"
	cases := []struct {
		name string
		req  Request
		want string
	}{
		{"plain http", Request{URL: "http://example.com/"}, "only https"},
		{"other scheme", Request{URL: "file:///etc/passwd"}, "only https"},
		{"no host", Request{URL: "https:///path"}, "no host"},
		{"unparsable", Request{URL: "https://exa mple.com/\x7f"}, "does not parse"},
		{"credentials in URL", Request{URL: "https://user:" + secret + "@example.com/"}, "credentials"},
		{"method not allowed", Request{Method: "TRACE", URL: "https://example.com/"}, "not allowed"},
		{"CONNECT not allowed", Request{Method: "CONNECT", URL: "https://example.com/"}, "not allowed"},
		{"host header", Request{URL: "https://example.com/", Headers: map[string]string{"host": secret}}, "Host cannot be set"},
		{"transfer-encoding", Request{URL: "https://example.com/", Headers: map[string]string{"Transfer-Encoding": secret}}, "cannot be set"},
		{"connection", Request{URL: "https://example.com/", Headers: map[string]string{"connection": secret}}, "cannot be set"},
		{"upgrade", Request{URL: "https://example.com/", Headers: map[string]string{"Upgrade": secret}}, "cannot be set"},
		{"proxy-authorization", Request{URL: "https://example.com/", Headers: map[string]string{"Proxy-Authorization": secret}}, "cannot be set"},
		{"content-length", Request{URL: "https://example.com/", Headers: map[string]string{"Content-Length": "1"}}, "cannot be set"},
		{"bad header name", Request{URL: "https://example.com/", Headers: map[string]string{"X Bad": secret}}, "not valid"},
		{"CRLF in header value", Request{URL: "https://example.com/", Headers: map[string]string{"X-Token": secret + "\r\nEvil: 1"}}, "control character"},
	}
	client := New(Options{Resolver: &fakeResolver{}}) // never reached
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			_, err := client.Do(context.Background(), tc.req)
			e := requireKind(t, err, KindInvalidRequest)
			require.Contains(t, e.Detail, tc.want)
			require.NotContains(t, err.Error(), secret)
		})
	}
}

func TestDialedAddressIsCheckedAtTheSocket(t *testing.T) {
	t.Parallel()
	client := New(Options{})
	require.Error(t, client.checkDialedAddress("tcp4", "127.0.0.1:443", nil))
	require.Error(t, client.checkDialedAddress("tcp6", "[::1]:443", nil))
	require.Error(t, client.checkDialedAddress("tcp4", "169.254.169.254:80", nil))
	require.Error(t, client.checkDialedAddress("tcp4", "garbage", nil))
	require.NoError(t, client.checkDialedAddress("tcp4", "93.184.215.14:443", nil))
}

func TestEnvironmentProxyIsIgnored(t *testing.T) {
	t.Parallel()
	// A proxy would resolve and dial the host itself, past every check here.
	transport, ok := New(Options{}).http.Transport.(*http.Transport)
	require.True(t, ok)
	require.Nil(t, transport.Proxy)
}
