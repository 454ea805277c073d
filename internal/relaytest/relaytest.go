// Package relaytest starts a real relay (real PostgreSQL, real HTTP and
// WebSocket on loopback) for tests, and offers a small raw-protocol client
// for tests that need to send exactly the bytes they mean.
package relaytest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/buzzrelay/buzz/internal/community"
	"github.com/buzzrelay/buzz/internal/config"
	"github.com/buzzrelay/buzz/internal/db"
	"github.com/buzzrelay/buzz/internal/dbtest"
	"github.com/buzzrelay/buzz/internal/nostr"
	"github.com/buzzrelay/buzz/internal/relay"
)

// Patience bounds every wait for something the relay must do (dial, write,
// the next reply): long, because it is a failure bound only. A test runs
// under the race detector beside every other package on a loaded 2-core
// machine, where a publish that takes milliseconds alone has taken seconds.
// A test that expects silence passes its own short window to TryNext or
// ExpectSilence; a short window there only weakens the check.
const Patience = time.Minute

// Relay is a running relay with its own database.
type Relay struct {
	URL         string // ws://127.0.0.1:port
	HTTPURL     string // http://127.0.0.1:port
	MetricsURL  string // the operator listener serving /metrics
	Host        string // the home community's host (localhost:port)
	CommunityID uuid.UUID
	Server      *relay.Server
	Pool        *pgxpool.Pool
	// StopCrossRelay stops the relay's Redis bus (and its other
	// background work) as a clean shutdown does, goodbye included.
	StopCrossRelay func()
	http           *httptest.Server
}

// Start runs a relay on a fresh database; adjust tweaks the configuration.
// The relay and its database are torn down when the test ends.
func Start(t testing.TB, adjust ...func(*config.Config)) *Relay {
	t.Helper()
	return StartOn(t, dbtest.Pool(t), adjust...)
}

// StartOn runs a relay on a pool the test built itself (to observe its
// queries, say).
func StartOn(t testing.TB, pool *pgxpool.Pool, adjust ...func(*config.Config)) *Relay {
	t.Helper()
	return StartWith(t, pool, nil, adjust...)
}

// StartWith is StartOn with relay options (a stubbed clock, say).
func StartWith(t testing.TB, pool *pgxpool.Pool, opts []relay.Option, adjust ...func(*config.Config)) *Relay {
	t.Helper()
	cfg := config.Default()
	// Tests publish from a few keys as fast as they can, send messages as
	// fast as they can and dial from one address, as often as they like;
	// the tests of those bounds set them back.
	cfg.PublishPerMinute, cfg.PublishBurst = 1<<30, 1<<20
	cfg.MaxConnectionsPerAddr = 1 << 20
	cfg.HandshakesPerSecond = 1 << 20
	cfg.MessagesPerSecond = 1 << 20
	for _, f := range adjust {
		f(&cfg)
	}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	if testing.Verbose() {
		log = slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	srv := relay.New(cfg, pool, log, opts...)
	// The production server, timeouts included, on a loopback port.
	hs := httptest.NewUnstartedServer(nil)
	hs.Config = srv.HTTPServer()
	hs.Start()
	metrics := httptest.NewServer(srv.MetricsHandler())
	t.Cleanup(metrics.Close)
	r := &Relay{
		URL:        "ws://" + hs.Listener.Addr().String(),
		HTTPURL:    hs.URL,
		MetricsURL: metrics.URL,
		Host:       community.NormalizeHost(hs.Listener.Addr().String()),
		Server:     srv,
		Pool:       pool,
		http:       hs,
	}
	r.CommunityID = r.AddCommunity(t, r.Host)
	// With BUZZ_REDIS_URL set the relay joins the others on that Redis.
	busCtx, stopBus := context.WithCancel(context.Background())
	r.StopCrossRelay = stopBus
	require.NoError(t, srv.StartCrossRelay(busCtx))
	// With BUZZ_READ_DATABASE_URL set reads may route to that standby.
	require.NoError(t, srv.StartReadReplica(busCtx))
	watching := make(chan struct{})
	go func() { srv.WatchCommunityClosures(busCtx); close(watching) }()
	t.Cleanup(func() {
		defer func() {
			stopBus()
			<-watching // its own database session is closed before the database is dropped
		}()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(ctx)
		hs.Close()
	})
	return r
}

// AddCommunity provisions another community served by this relay.
func (r *Relay) AddCommunity(t testing.TB, host string) uuid.UUID {
	t.Helper()
	row, err := db.New(r.Pool).CommunityCreate(context.Background(), host)
	require.NoError(t, err)
	return row.ID
}

// Shutdown stops the relay the way SIGTERM does.
func (r *Relay) Shutdown(ctx context.Context) error { return r.Server.Shutdown(ctx) }

type testWriter struct{ t testing.TB }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// Client is a raw NIP-01 client for protocol tests.
type Client struct {
	t         testing.TB
	WS        *websocket.Conn
	Challenge string
	Key       *nostr.SecretKey
	relayURL  string
	// closed holds the wire ids of subscriptions Req has closed. NIP-01 has
	// no acknowledgement of CLOSE, so a live event the relay sent before it
	// read the CLOSE may still arrive; it is dropped, not mistaken for a
	// reply to whatever the test sends next.
	closed map[string]bool
}

// Dial connects to the relay as host ("" = the home community) and reads the
// AUTH challenge the relay sends first.
func (r *Relay) Dial(t testing.TB, host string) *Client {
	t.Helper()
	return r.DialWith(t, host, nil)
}

// DialWith is Dial with extra request headers (an X-Forwarded-For, say).
func (r *Relay) DialWith(t testing.TB, host string, header http.Header) *Client {
	t.Helper()
	c, err := r.tryDial(host, header)
	require.NoError(t, err)
	c.t = t
	t.Cleanup(func() { c.WS.CloseNow() })
	msg := c.Next()
	require.Equal(t, `"AUTH"`, string(msg[0]), "first message must be the AUTH challenge")
	require.NoError(t, json.Unmarshal(msg[1], &c.Challenge))
	return c
}

// TryDial connects without reading anything; it fails for unknown hosts.
func (r *Relay) TryDial(host string) (*Client, error) {
	return r.tryDial(host, nil)
}

func (r *Relay) tryDial(host string, header http.Header) (*Client, error) {
	ctx, cancel := context.WithTimeout(context.Background(), Patience)
	defer cancel()
	if host == "" {
		host = r.Host
	}
	ws, _, err := websocket.Dial(ctx, r.URL, &websocket.DialOptions{Host: host, HTTPHeader: header})
	if err != nil {
		return nil, err
	}
	ws.SetReadLimit(16 << 20)
	return &Client{WS: ws, relayURL: "ws://" + host}, nil
}

// SendRaw writes one text frame.
func (c *Client) SendRaw(frame string) {
	c.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), Patience)
	defer cancel()
	require.NoError(c.t, c.WS.Write(ctx, websocket.MessageText, []byte(frame)))
}

// Send writes a JSON array message.
func (c *Client) Send(parts ...any) {
	c.t.Helper()
	b, err := json.Marshal(parts)
	require.NoError(c.t, err)
	c.SendRaw(string(b))
}

// Next reads the next message as its array elements.
func (c *Client) Next() []json.RawMessage {
	c.t.Helper()
	msg, err := c.TryNext(Patience)
	require.NoError(c.t, err)
	return msg
}

// TryNext reads the next message or fails after wait. A timeout closes the
// connection (coder/websocket closes on a cancelled read), so a test that
// expects silence checks it last.
func (c *Client) TryNext(wait time.Duration) ([]json.RawMessage, error) {
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	for {
		_, data, err := c.WS.Read(ctx)
		if err != nil {
			return nil, err
		}
		var parts []json.RawMessage
		if err := json.Unmarshal(data, &parts); err != nil || len(parts) == 0 {
			return nil, fmt.Errorf("relay sent a non-array message %q", data)
		}
		if !c.lateEvent(parts) {
			return parts, nil
		}
	}
}

// lateEvent reports whether parts is an EVENT for a subscription Req closed.
func (c *Client) lateEvent(parts []json.RawMessage) bool {
	if len(c.closed) == 0 || len(parts) < 2 || string(parts[0]) != `"EVENT"` {
		return false
	}
	var subID string
	return json.Unmarshal(parts[1], &subID) == nil && c.closed[subID]
}

// ExpectSilence requires that the relay sends nothing for wait and keeps the
// connection open meanwhile: a connection the relay closed (or that failed)
// is not silence. The read's timeout closes the connection from this side
// (coder/websocket closes on a cancelled read), so a test checks silence
// last on a client. why says what a frame would have meant.
func (c *Client) ExpectSilence(wait time.Duration, why string) {
	c.t.Helper()
	msg, err := c.TryNext(wait)
	switch {
	case err == nil:
		c.t.Fatalf("%s: got %s", why, joinParts(msg))
	case !errors.Is(err, context.DeadlineExceeded):
		c.t.Fatalf("%s: expected %s of silence on an open connection, but the read failed: %v", why, wait, err)
	}
}

func joinParts(parts []json.RawMessage) string {
	b, _ := json.Marshal(parts)
	return string(b)
}

// Reply is a decoded relay message.
type Reply struct {
	Verb  string
	SubID string // EVENT, EOSE, CLOSED, COUNT
	ID    string // OK
	OK    bool
	Msg   string // OK, CLOSED, NOTICE message
	Event *nostr.Event
	Count int64
}

// NextReply reads and decodes the next message.
func (c *Client) NextReply() Reply {
	c.t.Helper()
	return decodeReply(c.t, c.Next())
}

func decodeReply(t testing.TB, parts []json.RawMessage) Reply {
	t.Helper()
	var r Reply
	require.NoError(t, json.Unmarshal(parts[0], &r.Verb))
	str := func(i int) string {
		var s string
		require.Greater(t, len(parts), i, "%s message too short", r.Verb)
		require.NoError(t, json.Unmarshal(parts[i], &s))
		return s
	}
	switch r.Verb {
	case "OK":
		r.ID = str(1)
		require.NoError(t, json.Unmarshal(parts[2], &r.OK))
		r.Msg = str(3)
	case "EVENT":
		r.SubID = str(1)
		r.Event = new(nostr.Event)
		require.NoError(t, json.Unmarshal(parts[2], r.Event))
	case "EOSE":
		r.SubID = str(1)
	case "CLOSED":
		r.SubID, r.Msg = str(1), str(2)
	case "NOTICE":
		r.Msg = str(1)
	case "COUNT":
		r.SubID = str(1)
		var body struct{ Count int64 }
		require.NoError(t, json.Unmarshal(parts[2], &body))
		r.Count = body.Count
	}
	return r
}

// Expect reads the next message and requires its verb.
func (c *Client) Expect(verb string) Reply {
	c.t.Helper()
	r := c.NextReply()
	require.Equal(c.t, verb, r.Verb, "unexpected %s: %+v", r.Verb, r)
	return r
}

// AuthEvent builds a NIP-42 AUTH event for this connection.
func (c *Client) AuthEvent(key *nostr.SecretKey) *nostr.Event {
	ev := &nostr.Event{
		Kind:      nostr.KindAuth,
		CreatedAt: time.Now().Unix(),
		Tags:      nostr.Tags{{"relay", c.relayURL}, {"challenge", c.Challenge}},
	}
	require.NoError(c.t, ev.Sign(key))
	return ev
}

// Auth authenticates as key (a new key when nil) and requires success.
func (c *Client) Auth(key *nostr.SecretKey) *nostr.SecretKey {
	c.t.Helper()
	if key == nil {
		key = NewKey(c.t)
	}
	ev := c.AuthEvent(key)
	c.Send("AUTH", ev)
	r := c.Expect("OK")
	require.True(c.t, r.OK, "AUTH refused: %s", r.Msg)
	c.Key = key
	return key
}

// Publish sends an event and returns the relay's OK.
func (c *Client) Publish(ev *nostr.Event) Reply {
	c.t.Helper()
	c.Send("EVENT", ev)
	r := c.Expect("OK")
	require.Equal(c.t, ev.ID, r.ID)
	return r
}

// Sign builds and signs an event with the client's key.
func (c *Client) Sign(kind int, content string, tags nostr.Tags, createdAt int64) *nostr.Event {
	c.t.Helper()
	return SignEvent(c.t, c.Key, kind, content, tags, createdAt)
}

// Req runs a one-shot query: it subscribes, collects the stored events up
// to EOSE, then closes the subscription.
func (c *Client) Req(subID string, filters ...map[string]any) []*nostr.Event {
	c.t.Helper()
	// Each call gets its own wire id, so a late live event of an earlier
	// call with the same subID cannot land in this one's history.
	if c.closed == nil {
		c.closed = map[string]bool{}
	}
	subID = fmt.Sprintf("%s.%d", subID, len(c.closed))
	parts := []any{"REQ", subID}
	for _, f := range filters {
		parts = append(parts, f)
	}
	c.Send(parts...)
	var events []*nostr.Event
	for {
		r := c.NextReply()
		switch r.Verb {
		case "EVENT":
			require.Equal(c.t, subID, r.SubID)
			events = append(events, r.Event)
		case "EOSE":
			require.Equal(c.t, subID, r.SubID)
			c.Send("CLOSE", subID)
			c.closed[subID] = true
			return events
		default:
			c.t.Fatalf("REQ %s: unexpected %+v", subID, r)
		}
	}
}

// NewKey returns a fresh secret key.
func NewKey(t testing.TB) *nostr.SecretKey {
	k, err := nostr.GenerateSecretKey()
	require.NoError(t, err)
	return k
}

// SignEvent builds and signs an event; createdAt 0 means now.
func SignEvent(t testing.TB, key *nostr.SecretKey, kind int, content string, tags nostr.Tags, createdAt int64) *nostr.Event {
	t.Helper()
	if createdAt == 0 {
		createdAt = time.Now().Unix()
	}
	if tags == nil {
		tags = nostr.Tags{}
	}
	ev := &nostr.Event{Kind: kind, Content: content, Tags: tags, CreatedAt: createdAt}
	require.NoError(t, ev.Sign(key))
	return ev
}
