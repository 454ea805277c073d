package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"regexp"
	"strconv"
	"time"

	"github.com/coder/websocket"

	"github.com/buzzrelay/buzz/internal/nipoa"
	"github.com/buzzrelay/buzz/internal/nostr"
)

// Client is one authenticated NIP-01 connection to a relay. It is used from
// a single goroutine: every method writes a request and then reads until
// the matching reply, so replies never need to be routed.
type Client struct {
	ws         *websocket.Conn
	raw        net.Conn // under ws; nil if the dial went another way
	relayURL   string
	key        *nostr.SecretKey
	att        *nipoa.Attestation // sent on AUTH when not nil
	lastNotice string             // the most recent NOTICE, reported if a reply never comes
}

// RelayError is a refusal by the relay (OK false, CLOSED, or a refused
// AUTH). Prefix is the NIP-01 machine-readable prefix ("restricted", ...)
// or "rejected" when the message has none.
type RelayError struct {
	Prefix string
	Msg    string
}

func (e *RelayError) Error() string { return e.Msg }

var prefixRE = regexp.MustCompile(`^([a-z][a-z0-9-]*): `)

func relayError(msg string) *RelayError {
	if m := prefixRE.FindStringSubmatch(msg); m != nil {
		return &RelayError{Prefix: m[1], Msg: msg}
	}
	if msg == "" {
		msg = "the relay refused without a reason"
	}
	return &RelayError{Prefix: "rejected", Msg: msg}
}

// ProtocolError is a relay reply that breaks NIP-01 (or the relay's own
// documented behaviour), such as a missing AUTH challenge.
type ProtocolError struct{ Msg string }

func (e *ProtocolError) Error() string { return e.Msg }

// Received is one event as the relay sent it: Raw is the relay's JSON object,
// Event its parsed and verified form.
type Received struct {
	Raw   json.RawMessage
	Event *nostr.Event
}

// Dial connects to relayURL, waits for the relay's AUTH challenge and
// authenticates as key (NIP-42), with the owner attestation att when not
// nil. The relay accepts nothing before AUTH.
func Dial(ctx context.Context, relayURL string, key *nostr.SecretKey, att *nipoa.Attestation) (*Client, error) {
	// The raw connection is kept so that Close can cut a closing handshake
	// the relay never answers (the library would wait 5 s or more).
	var raw net.Conn
	transport := http.DefaultTransport.(*http.Transport).Clone()
	dialer := &net.Dialer{Timeout: 30 * time.Second, KeepAlive: 30 * time.Second}
	transport.DialContext = func(ctx context.Context, network, addr string) (net.Conn, error) {
		conn, err := dialer.DialContext(ctx, network, addr)
		raw = conn
		return conn, err
	}
	ws, resp, err := websocket.Dial(ctx, relayURL, &websocket.DialOptions{HTTPClient: &http.Client{Transport: transport}})
	if err != nil {
		if failure := upgradeFailure(relayURL, resp); failure != nil {
			return nil, failure
		}
		return nil, fmt.Errorf("connect to %s: %w", redactedURL(relayURL), err)
	}
	ws.SetReadLimit(16 << 20)
	c := &Client{ws: ws, raw: raw, relayURL: relayURL, key: key, att: att}
	if err := c.auth(ctx); err != nil {
		ws.CloseNow()
		return nil, err
	}
	return c, nil
}

// redactedURL is relayURL for an error message, its password (a proxy's
// basic auth in wss://user:password@host) replaced by xxxxx.
func redactedURL(relayURL string) string {
	u, err := url.Parse(relayURL)
	if err != nil {
		return "the relay URL"
	}
	return u.Redacted()
}

// upgradeFailure is what an HTTP answer other than the WebSocket upgrade
// means, or nil when the dial failed without one. An error status is the
// relay refusing (429 rate-limited, 503 at its connection limit, 404
// unknown community): a RelayError. The relay words the reason as
// {"error": "prefix: message"}; its prefix is the code, else http_STATUS as
// for the HTTP commands. Any other answer (a web page's 200, a redirect the
// client does not follow) comes from something that is not a relay: a
// ProtocolError, not a refusal a script might retry.
func upgradeFailure(relayURL string, resp *http.Response) error {
	if resp == nil || resp.StatusCode == http.StatusSwitchingProtocols {
		return nil
	}
	if resp.StatusCode < http.StatusBadRequest {
		return &ProtocolError{Msg: fmt.Sprintf("no relay at %s: it answered the WebSocket upgrade with %d %s",
			redactedURL(relayURL), resp.StatusCode, http.StatusText(resp.StatusCode))}
	}
	var body struct {
		Error string `json:"error"`
	}
	if resp.Body != nil {
		// The library keeps at most the first 1024 bytes of a refused body.
		raw, _ := io.ReadAll(resp.Body)
		_ = json.Unmarshal(raw, &body)
	}
	msg := fmt.Sprintf("relay refused the connection (%d %s)", resp.StatusCode, http.StatusText(resp.StatusCode))
	if body.Error != "" {
		msg += ": " + body.Error
	}
	prefix := "http_" + strconv.Itoa(resp.StatusCode)
	if m := prefixRE.FindStringSubmatch(body.Error); m != nil {
		prefix = m[1]
	}
	return &RelayError{Prefix: prefix, Msg: msg}
}

// closeGrace is how long Close waits for the relay to answer the closing
// handshake; a live relay answers in milliseconds.
const closeGrace = 500 * time.Millisecond

// Close ends the connection with a normal closure, waiting for the relay's
// answer at most closeGrace and never past ctx (the command's --timeout);
// then it drops the connection.
func (c *Client) Close(ctx context.Context) {
	done := make(chan struct{})
	go func() {
		_ = c.ws.Close(websocket.StatusNormalClosure, "")
		close(done)
	}()
	grace := time.NewTimer(closeGrace)
	defer grace.Stop()
	select {
	case <-done:
		return
	case <-grace.C:
	case <-ctx.Done():
	}
	if c.raw != nil {
		_ = c.raw.Close()
	}
	select {
	case <-done:
	case <-time.After(100 * time.Millisecond): // the library's own waits; the process ends anyway
	}
}

func (c *Client) auth(ctx context.Context) error {
	var challenge string
	for challenge == "" {
		verb, parts, err := c.next(ctx, "the AUTH challenge")
		if err != nil {
			return err
		}
		switch verb {
		case "AUTH":
			if len(parts) < 2 || json.Unmarshal(parts[1], &challenge) != nil || challenge == "" {
				return &ProtocolError{Msg: "relay sent a malformed AUTH challenge"}
			}
		case "NOTICE":
		default:
			return &ProtocolError{Msg: fmt.Sprintf("relay sent %s before its AUTH challenge", verb)}
		}
	}
	ev := &nostr.Event{
		Kind:      nostr.KindAuth,
		CreatedAt: time.Now().Unix(),
		Tags:      nostr.Tags{{"relay", c.relayURL}, {"challenge", challenge}},
	}
	if c.att != nil {
		ev.Tags = append(ev.Tags, c.att.Tag())
	}
	if err := ev.Sign(c.key); err != nil {
		return err
	}
	if err := c.write(ctx, "AUTH", ev); err != nil {
		return err
	}
	_, err := c.awaitOK(ctx, ev.ID, "the reply to AUTH")
	return err
}

// Publish sends ev, already signed with the client's key (see Sign), and
// returns the relay's OK message: OK true (including "duplicate:") is
// success, OK false is a *RelayError.
func (c *Client) Publish(ctx context.Context, ev *nostr.Event) (string, error) {
	if err := c.write(ctx, "EVENT", ev); err != nil {
		return "", err
	}
	return c.awaitOK(ctx, ev.ID, "the OK for event "+ev.ID)
}

// Sign fills in the event's pubkey, id and signature with the client's key.
func (c *Client) Sign(ev *nostr.Event) error { return ev.Sign(c.key) }

func (c *Client) awaitOK(ctx context.Context, id, what string) (string, error) {
	for {
		verb, parts, err := c.next(ctx, what)
		if err != nil {
			return "", err
		}
		if verb != "OK" {
			continue
		}
		var gotID, msg string
		var ok bool
		if len(parts) < 4 || json.Unmarshal(parts[1], &gotID) != nil ||
			json.Unmarshal(parts[2], &ok) != nil || json.Unmarshal(parts[3], &msg) != nil {
			return "", &ProtocolError{Msg: "relay sent a malformed OK message"}
		}
		if gotID != id {
			continue
		}
		if !ok {
			return "", relayError(msg)
		}
		return msg, nil
	}
}

// Bounds on what one-shot queries and streams keep in memory, so a relay
// that floods (never sending EOSE, or ignoring the limit) cannot grow the
// CLI without bound, whatever --timeout says.
const (
	// queryEventsPerFilter stands in for a filter's missing limit; the
	// relay's own per-filter cap (BUZZ_MAX_LIMIT) defaults to 500.
	queryEventsPerFilter = 10000
	// queryMaxBytes bounds the events one query holds (the relay's
	// default event is at most 256 KiB, so this is hundreds of them).
	queryMaxBytes = 64 << 20
	// streamSeenWindow is how many recent ids a stream remembers to drop
	// a relay's repeats; older ids are forgotten.
	streamSeenWindow = 4096
)

// errQueryFull ends a one-shot query that holds every event its filters'
// limits allow.
var errQueryFull = errors.New("query holds every event its limits allow")

// Query runs a one-shot REQ: the stored events up to EOSE, then CLOSE.
// Events are returned in the relay's order (newest first), without
// duplicates. Once the filters' limits are met it stops without waiting
// for EOSE; more events than queryEventsPerFilter per unlimited filter, or
// more than queryMaxBytes in all, is a protocol error.
func (c *Client) Query(ctx context.Context, filters []json.RawMessage) ([]Received, error) {
	maxEvents, limited := queryEventBound(filters)
	events := []Received{}
	size := 0
	err := c.Subscribe(ctx, filters, func(r Received) error {
		if len(events) == maxEvents {
			if limited {
				return errQueryFull
			}
			return &ProtocolError{Msg: fmt.Sprintf("relay sent more than %d events for a query without a limit; add a limit", maxEvents)}
		}
		if size += len(r.Raw); size > queryMaxBytes {
			return &ProtocolError{Msg: fmt.Sprintf("relay sent more than %d MiB of events for one query; narrow the filter or lower its limit", queryMaxBytes>>20)}
		}
		events = append(events, r)
		if limited && len(events) == maxEvents {
			return errQueryFull
		}
		return nil
	}, true)
	if errors.Is(err, errQueryFull) {
		return events, nil
	}
	return events, err
}

// queryEventBound is the most events filters can ask for: the sum of
// their limits, with queryEventsPerFilter for a filter without one
// (limited is then false).
func queryEventBound(filters []json.RawMessage) (maxEvents int, limited bool) {
	limited = true
	for _, raw := range filters {
		var f nostr.Filter
		if f.UnmarshalJSON(raw) != nil || f.Limit == nil || *f.Limit > queryEventsPerFilter {
			maxEvents += queryEventsPerFilter
			limited = false
			continue
		}
		maxEvents += *f.Limit
	}
	return maxEvents, limited
}

// Subscribe sends a REQ and calls fn for every event. With oneShot it stops
// at EOSE and closes the subscription; otherwise it runs until ctx ends
// (returning ctx's error) or the relay closes the subscription. An error
// from fn ends the subscription with a CLOSE and is returned.
func (c *Client) Subscribe(ctx context.Context, filters []json.RawMessage, fn func(Received) error, oneShot bool) error {
	sub := newSubID()
	if err := c.write(ctx, reqMessage("REQ", sub, filters)...); err != nil {
		return err
	}
	seen := newIDWindow(streamSeenWindow)
	for {
		verb, parts, err := c.next(ctx, "events for subscription "+sub)
		if err != nil {
			return err
		}
		if len(parts) < 2 || !isSub(parts[1], sub) {
			continue
		}
		switch verb {
		case "EVENT":
			if len(parts) < 3 {
				return &ProtocolError{Msg: "relay sent an EVENT without an event"}
			}
			r, err := verifyEvent(parts[2])
			if err != nil {
				return err
			}
			if !seen.add(r.Event.ID) {
				continue
			}
			if err := fn(r); err != nil {
				_ = c.write(ctx, "CLOSE", sub)
				return err
			}
		case "EOSE":
			if oneShot {
				return c.write(ctx, "CLOSE", sub)
			}
		case "CLOSED":
			return relayError(stringAt(parts, 2))
		}
	}
}

// idWindow remembers the most recent ids it was given, up to a fixed
// number, so a long stream's duplicate check stays the same size.
type idWindow struct {
	ids  map[string]bool
	ring []string
	next int
}

func newIDWindow(size int) *idWindow {
	return &idWindow{ids: make(map[string]bool, size), ring: make([]string, size)}
}

// add records id and reports whether it was new within the window.
func (w *idWindow) add(id string) bool {
	if w.ids[id] {
		return false
	}
	delete(w.ids, w.ring[w.next])
	w.ring[w.next] = id
	w.next = (w.next + 1) % len(w.ring)
	w.ids[id] = true
	return true
}

// CountResult is a NIP-45 COUNT answer; Approximate: at least Count (a
// relay may stop counting).
type CountResult struct {
	Count       int64 `json:"count"`
	Approximate bool  `json:"approximate,omitempty"`
}

// Count sends a NIP-45 COUNT and returns the relay's count.
func (c *Client) Count(ctx context.Context, filters []json.RawMessage) (CountResult, error) {
	sub := newSubID()
	if err := c.write(ctx, reqMessage("COUNT", sub, filters)...); err != nil {
		return CountResult{}, err
	}
	for {
		verb, parts, err := c.next(ctx, "the COUNT reply")
		if err != nil {
			return CountResult{}, err
		}
		if len(parts) < 2 || !isSub(parts[1], sub) {
			continue
		}
		switch verb {
		case "COUNT":
			var body struct {
				Count       *int64 `json:"count"`
				Approximate bool   `json:"approximate"`
			}
			if len(parts) < 3 || json.Unmarshal(parts[2], &body) != nil || body.Count == nil {
				return CountResult{}, &ProtocolError{Msg: "relay sent a malformed COUNT reply"}
			}
			return CountResult{Count: *body.Count, Approximate: body.Approximate}, nil
		case "CLOSED":
			return CountResult{}, relayError(stringAt(parts, 2))
		}
	}
}

// verifyEvent parses an event object from the relay and checks its id and
// signature, so nothing forged or corrupted reaches the output.
func verifyEvent(raw json.RawMessage) (Received, error) {
	ev, err := nostr.ParseEvent(raw, nostr.Limits{})
	if err != nil {
		return Received{}, &ProtocolError{Msg: "relay sent a malformed event: " + err.Error()}
	}
	if err := ev.Verify(); err != nil {
		return Received{}, &ProtocolError{Msg: fmt.Sprintf("relay sent event %s that fails verification: %v", ev.ID, err)}
	}
	return Received{Raw: raw, Event: ev}, nil
}

func reqMessage(verb, sub string, filters []json.RawMessage) []any {
	parts := []any{verb, sub}
	for _, f := range filters {
		parts = append(parts, f)
	}
	return parts
}

func isSub(raw json.RawMessage, sub string) bool {
	var s string
	return json.Unmarshal(raw, &s) == nil && s == sub
}

func stringAt(parts []json.RawMessage, i int) string {
	var s string
	if i < len(parts) {
		_ = json.Unmarshal(parts[i], &s)
	}
	return s
}

func newSubID() string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return "buzz-" + hex.EncodeToString(b[:])
}

// write sends one JSON array message, without HTML escaping so event
// content goes out byte for byte as signed.
func (c *Client) write(ctx context.Context, parts ...any) error {
	msg, err := marshal(parts)
	if err != nil {
		return err
	}
	if err := c.ws.Write(ctx, websocket.MessageText, msg); err != nil {
		return c.connErr(ctx, err, "send to relay")
	}
	return nil
}

// next reads the next relay message; what names the awaited reply for
// timeout errors.
func (c *Client) next(ctx context.Context, what string) (string, []json.RawMessage, error) {
	typ, data, err := c.ws.Read(ctx)
	if err != nil {
		if ctx.Err() != nil {
			return "", nil, c.waitErr(ctx, what)
		}
		return "", nil, c.connErr(ctx, err, "read from relay")
	}
	var parts []json.RawMessage
	var verb string
	if typ != websocket.MessageText || json.Unmarshal(data, &parts) != nil || len(parts) == 0 ||
		json.Unmarshal(parts[0], &verb) != nil {
		return "", nil, &ProtocolError{Msg: fmt.Sprintf("relay sent a message that is not a JSON array: %.200q", data)}
	}
	if verb == "NOTICE" {
		c.lastNotice = stringAt(parts, 1)
	}
	return verb, parts, nil
}

// waitErr wraps ctx's error with what was being waited for.
func (c *Client) waitErr(ctx context.Context, what string) error {
	msg := "waiting for " + what
	if c.lastNotice != "" {
		msg += fmt.Sprintf(" (last NOTICE from the relay: %q)", c.lastNotice)
	}
	return fmt.Errorf("%s: %w", msg, context.Cause(ctx))
}

func (c *Client) connErr(ctx context.Context, err error, op string) error {
	if ctx.Err() != nil {
		return c.waitErr(ctx, op)
	}
	if status := websocket.CloseStatus(err); status != -1 {
		var ce websocket.CloseError
		errors.As(err, &ce)
		return fmt.Errorf("relay closed the connection (%d %s)", status, ce.Reason)
	}
	return fmt.Errorf("%s: %w", op, err)
}

// marshal encodes v as compact JSON without HTML escaping.
func marshal(v any) ([]byte, error) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return nil, err
	}
	return bytes.TrimSuffix(buf.Bytes(), []byte("\n")), nil
}
