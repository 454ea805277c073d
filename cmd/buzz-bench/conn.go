package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"time"

	"github.com/coder/websocket"

	"github.com/buzzrelay/buzz/internal/nostr"
)

// opTimeout bounds every single protocol exchange (dial, AUTH, one EVENT/OK,
// one REQ/EOSE), so a stuck relay shows up as an error, not a hang.
const opTimeout = 10 * time.Second

// maxFrame is the largest relay message accepted.
const maxFrame = 4 << 20

// relayConn is one NIP-42-authenticated connection. It belongs to one
// goroutine at a time. Reads reuse one buffer, so a decoded relayMsg is
// valid only until the next read.
type relayConn struct {
	ws     *websocket.Conn
	signer *signer
	buf    bytes.Buffer
	// tcp is the plain (ws://) connection under ws, for a subscriber to
	// take over once subscribed; nil over TLS.
	tcp *net.TCPConn
}

// dialedConn receives the connection a dial opened.
type dialedConn struct{ conn net.Conn }

type dialedConnKey struct{}

// wsHTTPClient dials like the default client and hands the connection it
// opened to a dialedConn in the request's context.
var wsHTTPClient = &http.Client{Transport: func() http.RoundTripper {
	t := http.DefaultTransport.(*http.Transport).Clone()
	var d net.Dialer
	t.DialContext = func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := d.DialContext(ctx, network, addr)
		if into, ok := ctx.Value(dialedConnKey{}).(*dialedConn); ok && err == nil {
			into.conn = c
		}
		return c, err
	}
	return t
}()}

// dialAuthed connects to url and authenticates as s: the relay sends its
// challenge first, and every EVENT/REQ/COUNT needs AUTH before it.
func dialAuthed(ctx context.Context, url string, s *signer) (*relayConn, error) {
	ctx, cancel := context.WithTimeout(ctx, opTimeout)
	defer cancel()
	var dialed dialedConn
	ws, _, err := websocket.Dial(context.WithValue(ctx, dialedConnKey{}, &dialed), url,
		&websocket.DialOptions{CompressionMode: websocket.CompressionDisabled, HTTPClient: wsHTTPClient})
	if err != nil {
		return nil, fmt.Errorf("dial: %w", err)
	}
	ws.SetReadLimit(maxFrame)
	c := &relayConn{ws: ws, signer: s}
	c.tcp, _ = dialed.conn.(*net.TCPConn)
	if err := c.auth(ctx, url); err != nil {
		c.close()
		return nil, err
	}
	return c, nil
}

func (c *relayConn) auth(ctx context.Context, url string) error {
	msg, err := c.next(ctx)
	if err != nil {
		return fmt.Errorf("read AUTH challenge: %w", err)
	}
	if msg.Verb != verbAuth {
		return fmt.Errorf("expected an AUTH challenge first, got %s", msg.Verb)
	}
	ev := &nostr.Event{
		Kind:      nostr.KindAuth,
		CreatedAt: time.Now().Unix(),
		// The relay checks the relay tag against the community it serves at this URL.
		Tags: nostr.Tags{{"relay", url}, {"challenge", string(msg.Text)}},
	}
	if err := c.signer.sign(ev); err != nil {
		return err
	}
	if err := c.send(ctx, eventFrame("AUTH", ev)); err != nil {
		return fmt.Errorf("send AUTH: %w", err)
	}
	ok, reason, err := c.awaitOK(ctx, ev.ID)
	if err != nil {
		return fmt.Errorf("AUTH: %w", err)
	}
	if !ok {
		return fmt.Errorf("AUTH refused: %s", reason)
	}
	return nil
}

func (c *relayConn) close() { c.ws.CloseNow() }

func (c *relayConn) send(ctx context.Context, frame []byte) error {
	return c.ws.Write(ctx, websocket.MessageText, frame)
}

// next reads and decodes one message.
func (c *relayConn) next(ctx context.Context) (relayMsg, error) {
	_, r, err := c.ws.Reader(ctx)
	if err != nil {
		return relayMsg{}, err
	}
	c.buf.Reset()
	if _, err := c.buf.ReadFrom(r); err != nil {
		return relayMsg{}, err
	}
	return decodeRelayMsg(c.buf.Bytes())
}

// awaitOK reads until the OK for id, skipping anything else (NOTICEs, live
// events). reason is set only when the relay refused.
func (c *relayConn) awaitOK(ctx context.Context, id string) (ok bool, reason string, err error) {
	for {
		msg, err := c.next(ctx)
		if err != nil {
			return false, "", err
		}
		if msg.Verb == verbOK && string(msg.ID) == id {
			if !msg.OK {
				reason = string(msg.Text)
			}
			return msg.OK, reason, nil
		}
	}
}

// publish sends one pre-signed EVENT and waits for its OK.
func (c *relayConn) publish(ctx context.Context, ev signedEvent) (ok bool, reason string, err error) {
	ctx, cancel := context.WithTimeout(ctx, opTimeout)
	defer cancel()
	if err := c.send(ctx, ev.frame); err != nil {
		return false, "", err
	}
	return c.awaitOK(ctx, ev.id)
}

// errClosed is returned when the relay ends a subscription with CLOSED.
var errClosed = errors.New("subscription CLOSED by the relay")

// subscribe sends a REQ and waits for its EOSE, discarding stored events.
func (c *relayConn) subscribe(ctx context.Context, subID string, filter any) error {
	ctx, cancel := context.WithTimeout(ctx, opTimeout)
	defer cancel()
	if err := c.send(ctx, clientFrame("REQ", subID, filter)); err != nil {
		return err
	}
	_, err := c.untilEOSE(ctx, subID)
	return err
}

// untilEOSE reads the stored events of subID up to its EOSE and returns how
// many there were.
func (c *relayConn) untilEOSE(ctx context.Context, subID string) (events int, err error) {
	for {
		msg, err := c.next(ctx)
		if err != nil {
			return events, err
		}
		if string(msg.SubID) != subID {
			continue
		}
		switch msg.Verb {
		case verbEvent:
			events++
		case verbEOSE:
			return events, nil
		case verbClosed:
			return events, fmt.Errorf("%w: %s", errClosed, msg.Text)
		}
	}
}

// count asks for the NIP-45 count of events matching filter.
func (c *relayConn) count(ctx context.Context, filter any) (int64, error) {
	ctx, cancel := context.WithTimeout(ctx, opTimeout)
	defer cancel()
	const subID = "bench-count"
	if err := c.send(ctx, clientFrame("COUNT", subID, filter)); err != nil {
		return 0, err
	}
	for {
		msg, err := c.next(ctx)
		if err != nil {
			return 0, err
		}
		if string(msg.SubID) != subID {
			continue
		}
		switch msg.Verb {
		case verbCount:
			return msg.Count, nil
		case verbClosed:
			return 0, fmt.Errorf("%w: %s", errClosed, msg.Text)
		}
	}
}

// clientFrame encodes [verb, args...]; only for setup messages, where the
// cost of encoding/json does not matter.
func clientFrame(verb string, args ...any) []byte {
	b, err := json.Marshal(append([]any{verb}, args...))
	if err != nil {
		panic(err) // only bench-built maps and strings are passed
	}
	return b
}

// eventFrame encodes [verb, event] with the event's own encoder, which writes
// exactly the bytes that were signed.
func eventFrame(verb string, ev *nostr.Event) []byte {
	b := make([]byte, 0, 600+len(ev.Content))
	b = append(b, `["`...)
	b = append(b, verb...)
	b = append(b, `",`...)
	b = ev.AppendJSON(b)
	return append(b, ']')
}
