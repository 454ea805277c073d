// Package safehttp is the HTTP client of the call_webhook workflow step.
//
// A workflow owner chooses the URL, and the request leaves from inside the
// operator's network, so the client must not become a way to reach what
// only the relay can reach (server-side request forgery):
//   - HTTPS only, so the request cannot be read or changed on the way;
//   - the client resolves the host itself and refuses the request when any
//     resolved address is not public unicast (loopback, private, link-local
//     and cloud metadata, carrier-grade NAT, multicast, ...) or inside a
//     network the operator trusts, then dials exactly the address it
//     checked, and checks the dialed address again at the socket, so a
//     second DNS answer (rebinding) cannot slip in;
//   - proxies from the environment are ignored, since the proxy would do
//     its own resolution;
//   - redirects are never followed: a 3xx is the result, because following
//     it would send the request to a host nobody checked;
//   - the response body is capped and the whole exchange has a timeout, so a
//     hostile server cannot exhaust memory or hold a worker;
//   - error texts name the host and the failure, never the URL's path or
//     query, a header value or the body, which may hold secrets.
package safehttp

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"strconv"
	"strings"
	"syscall"
	"time"
)

const (
	// DefaultTimeout bounds one request from dial to the last body byte.
	DefaultTimeout = 10 * time.Second
	// DefaultMaxResponseBytes caps the response body kept as step output.
	DefaultMaxResponseBytes = 1 << 20
)

// Options configure a Client. The zero value is the production policy.
type Options struct {
	// Timeout bounds a whole request; 0 means DefaultTimeout.
	Timeout time.Duration
	// MaxResponseBytes caps the response body; 0 means
	// DefaultMaxResponseBytes. A longer body is an error.
	MaxResponseBytes int64
	// AllowedNets are networks the operator trusts although they are not
	// public (an internal service on a private address, say): addresses in
	// them may be dialed too. Cloud metadata addresses stay refused unless
	// an entry names exactly that address (see Allowed).
	AllowedNets []netip.Prefix
	// Resolver resolves host names; nil means net.DefaultResolver.
	Resolver Resolver
	// RootCAs verifies servers; nil means the system roots.
	RootCAs *x509.CertPool
}

// Resolver is the part of *net.Resolver the client uses.
type Resolver interface {
	LookupNetIP(ctx context.Context, network, host string) ([]netip.Addr, error)
}

// Request is one webhook call.
type Request struct {
	Method  string // "" means POST
	URL     string
	Headers map[string]string
	Body    []byte
	// Depth is sent as DepthHeader: how many webhook calls of workflows
	// led to this one, counting it (1 for a run no webhook started).
	Depth int
}

// DepthHeader carries a call's Request.Depth, so that a workflow webhook
// reached by a workflow's call (its own, say) knows how deep the chain is
// and can refuse to start one more run past a bound. Definitions cannot
// set it.
const DepthHeader = "X-Buzz-Workflow-Depth"

// Response is what the server answered, redirects included.
type Response struct {
	Status int
	Body   []byte
}

// Kind classifies a failure.
type Kind string

const (
	KindInvalidRequest   Kind = "invalid_request"
	KindBlockedAddress   Kind = "blocked_address"
	KindResolve          Kind = "resolve_failed"
	KindConnect          Kind = "connect_failed"
	KindTimeout          Kind = "timeout"
	KindResponseTooLarge Kind = "response_too_large"
	KindTransport        Kind = "transport_failed"
)

// Error is a failed webhook call. Its text holds no secret: only the kind,
// the host and a description of the failure.
type Error struct {
	Kind   Kind
	Host   string
	Detail string
}

func (e *Error) Error() string {
	if e.Host == "" {
		return fmt.Sprintf("webhook %s: %s", e.Kind, e.Detail)
	}
	return fmt.Sprintf("webhook %s (host %s): %s", e.Kind, e.Host, e.Detail)
}

// Client sends webhook requests under the policy above. It is safe for
// concurrent use.
type Client struct {
	timeout  time.Duration
	maxBytes int64
	trusted  []netip.Prefix
	resolver Resolver
	http     *http.Client
}

// New builds a Client.
func New(opts Options) *Client {
	c := &Client{
		timeout:  opts.Timeout,
		maxBytes: opts.MaxResponseBytes,
		trusted:  normalizePrefixes(opts.AllowedNets),
		resolver: opts.Resolver,
	}
	if c.timeout <= 0 {
		c.timeout = DefaultTimeout
	}
	if c.maxBytes <= 0 {
		c.maxBytes = DefaultMaxResponseBytes
	}
	if c.resolver == nil {
		c.resolver = net.DefaultResolver
	}
	transport := &http.Transport{
		Proxy:               nil,
		DialContext:         c.dial,
		TLSClientConfig:     &tls.Config{RootCAs: opts.RootCAs, MinVersion: tls.VersionTLS12},
		TLSHandshakeTimeout: c.timeout,
		ForceAttemptHTTP2:   true,
		MaxIdleConns:        16,
		IdleConnTimeout:     30 * time.Second,
	}
	c.http = &http.Client{
		Transport: transport,
		Timeout:   c.timeout,
		CheckRedirect: func(*http.Request, []*http.Request) error {
			return http.ErrUseLastResponse
		},
	}
	return c
}

// dial resolves the host, refuses it unless every address is allowed, and
// connects to the checked addresses only.
func (c *Client) dial(ctx context.Context, network, address string) (net.Conn, error) {
	host, port, err := net.SplitHostPort(address)
	if err != nil {
		return nil, &Error{Kind: KindInvalidRequest, Detail: "bad address"}
	}
	var addrs []netip.Addr
	literal, err := netip.ParseAddr(host)
	named := err != nil
	if !named {
		addrs = []netip.Addr{literal}
	} else {
		addrs, err = c.resolver.LookupNetIP(ctx, "ip", host)
		if err != nil || len(addrs) == 0 {
			return nil, &Error{Kind: KindResolve, Host: host, Detail: "the host name did not resolve"}
		}
	}
	for _, a := range addrs {
		if !Allowed(a, c.trusted) {
			return nil, &Error{Kind: KindBlockedAddress, Host: host, Detail: blockedDetail(named, a)}
		}
	}
	dialer := &net.Dialer{Control: c.checkDialedAddress}
	var lastErr error
	for _, a := range addrs {
		conn, err := dialer.DialContext(ctx, network, net.JoinHostPort(a.Unmap().String(), port))
		if err == nil {
			return conn, nil
		}
		lastErr = err
	}
	return nil, lastErr
}

// blockedDetail says why a host was refused. The address a name resolved
// to stays out of it: the detail is stored in the run, which channel
// members read, and the relay's resolver may be a private network's, so
// naming the answer would make call_webhook a lookup service for internal
// host names. An address the URL itself named is no secret.
func blockedDetail(named bool, a netip.Addr) string {
	if named {
		return "resolves to an address that is not public (loopback, private, link-local or the like)"
	}
	return fmt.Sprintf("%s is not a public address", a.Unmap())
}

// checkDialedAddress runs on the socket about to connect: whatever path led
// here, only an allowed address is ever dialed.
func (c *Client) checkDialedAddress(_, address string, _ syscall.RawConn) error {
	ap, err := netip.ParseAddrPort(address)
	if err != nil || !Allowed(ap.Addr(), c.trusted) {
		return &Error{Kind: KindBlockedAddress, Detail: "refused to dial " + address}
	}
	return nil
}

// hopByHop are headers that describe one connection, not the request, and
// that a caller must not set; Host and Content-Length belong to the client.
var forbiddenHeaders = map[string]bool{
	"Host": true, "Content-Length": true, "Connection": true, "Keep-Alive": true,
	"Proxy-Authenticate": true, "Proxy-Authorization": true, "Proxy-Connection": true,
	"Te": true, "Trailer": true, "Transfer-Encoding": true, "Upgrade": true,
	DepthHeader: true,
}

var allowedMethods = map[string]bool{
	http.MethodGet: true, http.MethodPost: true, http.MethodPut: true,
	http.MethodPatch: true, http.MethodDelete: true, http.MethodHead: true,
}

// Do sends the request and returns the response as received.
func (c *Client) Do(ctx context.Context, req Request) (Response, error) {
	httpReq, host, err := c.build(ctx, req)
	if err != nil {
		return Response{}, err
	}
	ctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	httpReq = httpReq.WithContext(ctx)

	resp, err := c.http.Do(httpReq)
	if err != nil {
		return Response{}, c.classify(ctx, host, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, c.maxBytes+1))
	if err != nil {
		return Response{}, c.classify(ctx, host, err)
	}
	if int64(len(body)) > c.maxBytes {
		return Response{}, &Error{Kind: KindResponseTooLarge, Host: host, Detail: fmt.Sprintf("response body exceeds %d bytes", c.maxBytes)}
	}
	return Response{Status: resp.StatusCode, Body: body}, nil
}

func (c *Client) build(ctx context.Context, req Request) (*http.Request, string, error) {
	invalid := func(host, detail string) (*http.Request, string, error) {
		return nil, host, &Error{Kind: KindInvalidRequest, Host: host, Detail: detail}
	}
	method := strings.ToUpper(req.Method)
	if method == "" {
		method = http.MethodPost
	}
	if !allowedMethods[method] {
		return invalid("", fmt.Sprintf("method %q is not allowed", req.Method))
	}
	u, err := url.Parse(req.URL)
	if err != nil {
		return invalid("", "the URL does not parse")
	}
	if u.Scheme != "https" {
		return invalid("", "only https URLs are allowed")
	}
	host := u.Hostname()
	if host == "" {
		return invalid("", "the URL has no host")
	}
	if u.User != nil {
		return invalid(host, "credentials in the URL are not allowed; send them in a header")
	}
	var body io.Reader
	if len(req.Body) > 0 {
		body = bytes.NewReader(req.Body)
	}
	httpReq, err := http.NewRequestWithContext(ctx, method, u.String(), body)
	if err != nil {
		return invalid(host, "the request cannot be built")
	}
	for name, value := range req.Headers {
		if !validHeaderName(name) {
			return invalid(host, fmt.Sprintf("header name %q is not valid", name))
		}
		canonical := http.CanonicalHeaderKey(name)
		if forbiddenHeaders[canonical] {
			return invalid(host, fmt.Sprintf("header %s cannot be set", canonical))
		}
		if strings.ContainsAny(value, "\r\n\x00") {
			return invalid(host, fmt.Sprintf("header %s has a control character in its value", canonical))
		}
		httpReq.Header.Set(canonical, value)
	}
	if httpReq.Header.Get("User-Agent") == "" {
		httpReq.Header.Set("User-Agent", "buzz-relay-webhook")
	}
	if req.Depth > 0 {
		httpReq.Header.Set(DepthHeader, strconv.Itoa(req.Depth))
	}
	return httpReq, host, nil
}

// classify turns a transport error into an *Error without the URL, which
// net/http puts in its own error texts.
func (c *Client) classify(ctx context.Context, host string, err error) error {
	var own *Error
	if errors.As(err, &own) {
		if own.Host == "" {
			own.Host = host
		}
		return own
	}
	var netErr net.Error
	if errors.Is(ctx.Err(), context.DeadlineExceeded) || (errors.As(err, &netErr) && netErr.Timeout()) {
		return &Error{Kind: KindTimeout, Host: host, Detail: fmt.Sprintf("no complete response within %s", c.timeout)}
	}
	if ctx.Err() != nil {
		return &Error{Kind: KindTransport, Host: host, Detail: "the request was canceled"}
	}
	var urlErr *url.Error
	if errors.As(err, &urlErr) {
		err = urlErr.Err
	}
	var opErr *net.OpError
	if errors.As(err, &opErr) && opErr.Op == "dial" {
		return &Error{Kind: KindConnect, Host: host, Detail: opErr.Err.Error()}
	}
	return &Error{Kind: KindTransport, Host: host, Detail: err.Error()}
}

// validHeaderName accepts an HTTP token.
func validHeaderName(name string) bool {
	if name == "" {
		return false
	}
	for i := 0; i < len(name); i++ {
		b := name[i]
		switch {
		case b >= 'a' && b <= 'z', b >= 'A' && b <= 'Z', b >= '0' && b <= '9':
		case strings.IndexByte("!#$%&'*+-.^_`|~", b) >= 0:
		default:
			return false
		}
	}
	return true
}

// Timeout is the longest one request may take (dial to last body byte).
func (c *Client) Timeout() time.Duration { return c.timeout }
