package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"sync"
	"time"

	"github.com/coder/websocket"

	"github.com/buzzrelay/buzz/internal/nostr"
)

// relayConn is one authenticated WebSocket connection to the relay, shared
// by several goroutines: a single reader routes each incoming frame to the
// subscription or the publish waiting for it, so a verification query can
// run while live events keep arriving.
type relayConn struct {
	ws       *websocket.Conn
	relayURL string
	key      *nostr.SecretKey

	mu     sync.Mutex
	subs   map[string]*subscription // subscription id -> where its frames go
	oks    map[string]chan frame    // event id -> its OK
	nextID uint64
	closed bool
	err    error         // why the reader stopped
	done   chan struct{} // closed when the reader stops
	note   string        // the relay's message on a successful AUTH, if any
}

// subscription receives its EVENT, EOSE and CLOSED frames in order on
// frames; gone is closed when its consumer no longer reads.
type subscription struct {
	frames chan frame
	gone   chan struct{}
}

// frame is one relay message, decoded enough to route it.
type frame struct {
	verb  string
	event *nostr.Event
	ok    bool
	msg   string
	count int64     // a COUNT's answer
	at    time.Time // when it was read off the socket
}

// errConnClosed is returned by calls on a connection whose reader stopped.
var errConnClosed = errors.New("relay connection closed")

// dialRelay connects and authenticates as key (NIP-42), carrying authTag (the
// owner's NIP-OA attestation) on the AUTH event when there is one.
func dialRelay(ctx context.Context, relayURL string, key *nostr.SecretKey, authTag nostr.Tag) (*relayConn, error) {
	ws, _, err := websocket.Dial(ctx, relayURL, nil)
	if err != nil {
		return nil, fmt.Errorf("connect to %s: %w", relayURL, err)
	}
	ws.SetReadLimit(16 << 20)
	c := &relayConn{
		ws: ws, relayURL: relayURL, key: key,
		subs: map[string]*subscription{}, oks: map[string]chan frame{},
		done: make(chan struct{}),
	}
	challenge, err := c.readChallenge(ctx)
	if err != nil {
		ws.CloseNow()
		return nil, err
	}
	go c.readLoop()
	auth := &nostr.Event{
		Kind:      nostr.KindAuth,
		CreatedAt: time.Now().Unix(),
		Tags:      nostr.Tags{{"relay", relayURL}, {"challenge", challenge}},
	}
	if authTag != nil {
		auth.Tags = append(auth.Tags, authTag)
	}
	if err := auth.Sign(key); err != nil {
		c.close()
		return nil, err
	}
	msg, err := c.send(ctx, "AUTH", auth)
	if err != nil {
		c.close()
		return nil, fmt.Errorf("AUTH: %w", err)
	}
	if msg != "" {
		// The relay authenticated us but says something about it, e.g. an
		// owner attestation it did not apply.
		c.note = msg
	}
	return c, nil
}

func (c *relayConn) readChallenge(ctx context.Context) (string, error) {
	for {
		_, data, err := c.ws.Read(ctx)
		if err != nil {
			return "", fmt.Errorf("waiting for the AUTH challenge: %w", err)
		}
		var parts []json.RawMessage
		if json.Unmarshal(data, &parts) != nil || len(parts) == 0 {
			return "", fmt.Errorf("relay sent a non-array message before its AUTH challenge")
		}
		var verb, challenge string
		_ = json.Unmarshal(parts[0], &verb)
		switch verb {
		case "AUTH":
			if len(parts) < 2 || json.Unmarshal(parts[1], &challenge) != nil || challenge == "" {
				return "", fmt.Errorf("relay sent a malformed AUTH challenge")
			}
			return challenge, nil
		case "NOTICE":
		default:
			return "", fmt.Errorf("relay sent %s before its AUTH challenge", verb)
		}
	}
}

func (c *relayConn) readLoop() {
	var err error
	defer func() {
		c.mu.Lock()
		c.closed, c.err = true, err
		for _, sub := range c.subs {
			close(sub.frames)
		}
		for _, ch := range c.oks {
			close(ch)
		}
		c.subs, c.oks = map[string]*subscription{}, map[string]chan frame{}
		c.mu.Unlock()
		close(c.done)
	}()
	for {
		var data []byte
		_, data, err = c.ws.Read(context.Background())
		if err != nil {
			return
		}
		at := time.Now()
		var parts []json.RawMessage
		if json.Unmarshal(data, &parts) != nil || len(parts) < 2 {
			continue
		}
		var verb, first string
		_ = json.Unmarshal(parts[0], &verb)
		if json.Unmarshal(parts[1], &first) != nil {
			continue
		}
		f := frame{verb: verb, at: at}
		switch verb {
		case "EVENT":
			if len(parts) < 3 {
				continue
			}
			ev := new(nostr.Event)
			if json.Unmarshal(parts[2], ev) != nil {
				continue // the parser refused it: nothing to route
			}
			f.event = ev
		case "CLOSED":
			if len(parts) >= 3 {
				_ = json.Unmarshal(parts[2], &f.msg)
			}
		case "OK":
			if len(parts) < 4 {
				continue
			}
			_ = json.Unmarshal(parts[2], &f.ok)
			_ = json.Unmarshal(parts[3], &f.msg)
		case "COUNT":
			var n struct {
				Count int64 `json:"count"`
			}
			if len(parts) < 3 || json.Unmarshal(parts[2], &n) != nil {
				continue
			}
			f.count = n.Count
		case "EOSE":
		default:
			continue
		}
		c.mu.Lock()
		if verb == "OK" {
			dst := c.oks[first]
			delete(c.oks, first)
			c.mu.Unlock()
			if dst != nil {
				dst <- f // buffered for exactly this one reply
			}
			continue
		}
		sub := c.subs[first]
		if verb == "CLOSED" || verb == "COUNT" {
			delete(c.subs, first) // a COUNT has one answer
		}
		c.mu.Unlock()
		if sub == nil {
			continue
		}
		// Waiting keeps a subscription's frames in order; a consumer that
		// stopped reading has closed gone, so the reader never hangs on it.
		select {
		case sub.frames <- f:
		case <-sub.gone:
		}
		if verb == "CLOSED" || verb == "COUNT" {
			close(sub.frames)
		}
	}
}

// close ends the connection; the reader then stops.
func (c *relayConn) close() {
	_ = c.ws.Close(websocket.StatusNormalClosure, "")
	<-c.done
}

// Done is closed when the connection is gone.
func (c *relayConn) Done() <-chan struct{} { return c.done }

// Err says why the connection ended.
func (c *relayConn) Err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.err == nil {
		return errConnClosed
	}
	return c.err
}

func (c *relayConn) write(ctx context.Context, parts ...any) error {
	b, err := json.Marshal(parts)
	if err != nil {
		return err
	}
	return c.ws.Write(ctx, websocket.MessageText, b)
}

// send writes an EVENT or AUTH and waits for its OK; OK false is a
// *relayRefusal.
func (c *relayConn) send(ctx context.Context, verb string, ev *nostr.Event) (string, error) {
	wait := make(chan frame, 1)
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return "", errConnClosed
	}
	c.oks[ev.ID] = wait
	c.mu.Unlock()
	if err := c.write(ctx, verb, ev); err != nil {
		c.forgetOK(ev.ID)
		return "", err
	}
	select {
	case f, ok := <-wait:
		if !ok {
			return "", errConnClosed
		}
		if !f.ok {
			return "", &relayRefusal{Msg: f.msg}
		}
		return f.msg, nil
	case <-ctx.Done():
		c.forgetOK(ev.ID)
		return "", ctx.Err()
	}
}

func (c *relayConn) forgetOK(id string) {
	c.mu.Lock()
	delete(c.oks, id)
	c.mu.Unlock()
}

// relayRefusal is OK false or CLOSED from the relay, with its NIP-01 message.
type relayRefusal struct{ Msg string }

func (e *relayRefusal) Error() string { return "relay refused: " + e.Msg }

// Publish signs nothing: ev is already signed by the agent's key.
func (c *relayConn) Publish(ctx context.Context, ev *nostr.Event) error {
	_, err := c.send(ctx, "EVENT", ev)
	return err
}

// subscribe opens a subscription and returns its id and frames. The
// channel is closed by CLOSED or when the connection ends.
func (c *relayConn) subscribe(ctx context.Context, prefix string, filters ...map[string]any) (string, <-chan frame, error) {
	return c.open(ctx, "REQ", prefix, filters)
}

// open sends a REQ or COUNT under a fresh id whose frames come on the
// returned channel.
func (c *relayConn) open(ctx context.Context, verb, prefix string, filters []map[string]any) (string, <-chan frame, error) {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return "", nil, errConnClosed
	}
	c.nextID++
	id := prefix + strconv.FormatUint(c.nextID, 10)
	sub := &subscription{frames: make(chan frame, 256), gone: make(chan struct{})}
	c.subs[id] = sub
	c.mu.Unlock()
	parts := []any{verb, id}
	for _, f := range filters {
		parts = append(parts, f)
	}
	if err := c.write(ctx, parts...); err != nil {
		c.unsubscribe(id)
		return "", nil, err
	}
	return id, sub.frames, nil
}

// unsubscribe closes a subscription; frames already routed to it are
// discarded by its consumer.
func (c *relayConn) unsubscribe(id string) {
	c.mu.Lock()
	sub, ok := c.subs[id]
	delete(c.subs, id)
	c.mu.Unlock()
	if !ok {
		return
	}
	close(sub.gone)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = c.write(ctx, "CLOSE", id)
}

// Query reads stored events up to EOSE (doorbell.Querier).
func (c *relayConn) Query(ctx context.Context, filter map[string]any) ([]*nostr.Event, error) {
	id, frames, err := c.subscribe(ctx, "q", filter)
	if err != nil {
		return nil, err
	}
	defer c.unsubscribe(id)
	var out []*nostr.Event
	for {
		select {
		case f, ok := <-frames:
			if !ok {
				return nil, c.Err()
			}
			switch f.verb {
			case "EVENT":
				out = append(out, f.event)
			case "EOSE":
				return out, nil
			case "CLOSED":
				return nil, &relayRefusal{Msg: f.msg}
			}
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}

// Count asks the relay how many stored events match filter (NIP-45).
func (c *relayConn) Count(ctx context.Context, filter map[string]any) (int64, error) {
	id, frames, err := c.open(ctx, "COUNT", "n", []map[string]any{filter})
	if err != nil {
		return 0, err
	}
	defer c.unsubscribe(id) // only when no answer came
	select {
	case f, ok := <-frames:
		if !ok {
			return 0, c.Err()
		}
		if f.verb != "COUNT" {
			return 0, &relayRefusal{Msg: f.msg}
		}
		return f.count, nil
	case <-ctx.Done():
		return 0, ctx.Err()
	}
}

// relayInfo is what buzz-acp reads from the relay's NIP-11 document: its
// key ("self"), which signs doorbells and channel member lists, and its
// limits on one event, to which answers are cut.
type relayInfo struct {
	Self       string `json:"self"`
	Limitation struct {
		MaxMessageLength    int   `json:"max_message_length"`
		MaxContentLength    int   `json:"max_content_length"`
		CreatedAtLowerLimit int64 `json:"created_at_lower_limit"`
	} `json:"limitation"`
}

func (i relayInfo) answerLimits() answerLimits {
	return answerLimits{maxContentChars: i.Limitation.MaxContentLength, maxMessageBytes: i.Limitation.MaxMessageLength,
		createdAtFloor: i.Limitation.CreatedAtLowerLimit}.orDefaults()
}

// fetchRelayInfo reads the community's NIP-11 document.
func fetchRelayInfo(ctx context.Context, relayURL string) (relayInfo, error) {
	var info relayInfo
	u, err := url.Parse(relayURL)
	if err != nil {
		return info, err
	}
	switch u.Scheme {
	case "wss":
		u.Scheme = "https"
	case "ws":
		u.Scheme = "http"
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
	if err != nil {
		return info, err
	}
	req.Header.Set("Accept", "application/nostr+json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return info, fmt.Errorf("relay information document: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return info, fmt.Errorf("relay information document: HTTP %d", resp.StatusCode)
	}
	if err := json.NewDecoder(io.LimitReader(resp.Body, 1<<20)).Decode(&info); err != nil {
		return relayInfo{}, fmt.Errorf("relay information document: %w", err)
	}
	return info, nil
}
