package main

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/stretchr/testify/require"

	"github.com/buzzrelay/buzz/internal/nostr"
)

// Tests against fake relays that misbehave in ways the real one does not
// (or only under load), to pin how the CLI reports each case.

// scriptedRelay is a fake relay: it sends an AUTH challenge, accepts any
// AUTH with OK true and hands every later message to onMsg. onHTTP, when
// set, serves the plain HTTP requests (the NIP-98 commands).
func scriptedRelay(t *testing.T, onMsg func(ctx context.Context, ws *websocket.Conn, verb string, parts []json.RawMessage), onHTTP http.HandlerFunc) (wsURL string) {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !strings.EqualFold(r.Header.Get("Upgrade"), "websocket") {
			if onHTTP != nil {
				onHTTP(w, r)
			}
			return
		}
		ws, err := websocket.Accept(w, r, nil)
		if err != nil {
			return
		}
		defer ws.CloseNow()
		ws.SetReadLimit(16 << 20)
		ctx := r.Context()
		_ = ws.Write(ctx, websocket.MessageText, []byte(`["AUTH","challenge"]`))
		for {
			_, data, err := ws.Read(ctx)
			if err != nil {
				return
			}
			var parts []json.RawMessage
			var verb string
			if json.Unmarshal(data, &parts) != nil || len(parts) < 2 || json.Unmarshal(parts[0], &verb) != nil {
				return
			}
			if verb == "AUTH" {
				writeOK(ctx, ws, parts[1], true, "")
				continue
			}
			onMsg(ctx, ws, verb, parts)
		}
	}))
	t.Cleanup(srv.Close)
	return "ws" + strings.TrimPrefix(srv.URL, "http")
}

// writeOK answers the event in raw with an OK message.
func writeOK(ctx context.Context, ws *websocket.Conn, raw json.RawMessage, ok bool, msg string) {
	var ev struct {
		ID string `json:"id"`
	}
	_ = json.Unmarshal(raw, &ev)
	reply, _ := json.Marshal([]any{"OK", ev.ID, ok, msg})
	_ = ws.Write(ctx, websocket.MessageText, reply)
}

// fakeRelayEnv is a fresh key and relay URL as the CLI's environment.
func fakeRelayEnv(t *testing.T, relay string) map[string]string {
	t.Helper()
	key, err := nostr.GenerateSecretKey()
	require.NoError(t, err)
	return map[string]string{"BUZZ_PRIVATE_KEY": key.Hex(), "BUZZ_RELAY_URL": relay}
}

// A relay refusing the WebSocket upgrade (429 per address, 503 at its
// connection limit, 404 for an unknown community host) has refused: exit
// 3, its NIP-01 prefix as the code (else http_STATUS) and its reason in
// the message. Mutation killed: Dial ignoring the failed upgrade's
// response reports code "network" with the library's "expected handshake
// response status code 101" and drops the relay's reason.
func TestUpgradeRefusalIsReportedAsRefusal(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		status   int
		body     string
		wantCode string
		wantMsg  string
	}{
		{http.StatusTooManyRequests, `{"error":"rate-limited: at most 50 connections per client address"}`, "rate-limited", "at most 50 connections"},
		{http.StatusServiceUnavailable, `{"error":"error: relay is at its limit of 10 connections; try again later"}`, "error", "at its limit of 10"},
		{http.StatusServiceUnavailable, `{"error":"overloaded"}`, "http_503", "overloaded"}, // unprefixed: a proxy's, say
		{http.StatusNotFound, `<html>not found</html>`, "http_404", "404 Not Found"},
	} {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(tc.status)
			_, _ = w.Write([]byte(tc.body))
		}))
		t.Cleanup(srv.Close)
		e := buzz(t, fakeRelayEnv(t, "ws"+strings.TrimPrefix(srv.URL, "http")), "", "channels", "list").fail(t, 3)
		require.Equal(t, tc.wantCode, e.Code, e.Error)
		require.Contains(t, e.Error, tc.wantMsg)
	}
}

// A relay that answers "duplicate:" to the first dupes EVENTs it sees and
// OK to the rest; it returns the events it received, in order.
func duplicatingRelay(t *testing.T, dupes int) (wsURL string, received func() []nostr.Event) {
	t.Helper()
	var mu sync.Mutex
	var events []nostr.Event
	relay := scriptedRelay(t, func(ctx context.Context, ws *websocket.Conn, verb string, parts []json.RawMessage) {
		if verb != "EVENT" {
			return
		}
		var ev nostr.Event
		require.NoError(t, json.Unmarshal(parts[1], &ev))
		mu.Lock()
		events = append(events, ev)
		n := len(events)
		mu.Unlock()
		if n <= dupes {
			writeOK(ctx, ws, parts[1], true, "duplicate: already have this event")
			return
		}
		writeOK(ctx, ws, parts[1], true, "")
	}, nil)
	return relay, func() []nostr.Event {
		mu.Lock()
		defer mu.Unlock()
		return append([]nostr.Event(nil), events...)
	}
}

// A send the relay answers "duplicate:" (the same text sent in the same
// second before) is signed again one second later, so the agent's second
// message is stored rather than merged into the first. Mutation killed:
// publish returning the relay's duplicate answer as success prints the
// first message's id and the second message is lost.
func TestSendResignsADuplicate(t *testing.T) {
	t.Parallel()
	relay, received := duplicatingRelay(t, 1)
	var sent sentJSON
	buzz(t, fakeRelayEnv(t, relay), "", "send", "00000000-0000-0000-0000-000000000001", "ok").ok(t, &sent)
	events := received()
	require.Len(t, events, 2)
	require.Equal(t, events[0].CreatedAt+1, events[1].CreatedAt)
	require.Equal(t, events[1].ID, sent.ID)
	require.Equal(t, events[1].CreatedAt, sent.CreatedAt)
	require.False(t, sent.Duplicate)
}

// When re-signing never gets past the relay's duplicate answer, or the
// command is one that is not re-signed (a join), the output says so with
// the relay's message. Mutation killed: dropping the duplicate field makes
// a merged message look like a stored one.
func TestDuplicateIsReported(t *testing.T) {
	t.Parallel()
	relay, received := duplicatingRelay(t, 1000)
	var sent sentJSON
	buzz(t, fakeRelayEnv(t, relay), "", "send", "00000000-0000-0000-0000-000000000001", "ok").ok(t, &sent)
	require.Len(t, received(), maxResigns+1)
	require.True(t, sent.Duplicate)
	require.Equal(t, "duplicate: already have this event", sent.Message)

	var joined joinedJSON
	buzz(t, fakeRelayEnv(t, relay), "", "channels", "join", "00000000-0000-0000-0000-000000000001").ok(t, &joined)
	require.True(t, joined.Duplicate)
	require.Equal(t, "duplicate: already have this event", joined.Message)
	require.Len(t, received(), maxResigns+2, "a join is not re-signed")
}

// floodingRelay answers every REQ with an endless run of distinct, validly
// signed events of contentBytes each, and never sends EOSE.
func floodingRelay(t *testing.T, contentBytes int) string {
	t.Helper()
	key, err := nostr.GenerateSecretKey()
	require.NoError(t, err)
	padding := strings.Repeat("x", contentBytes)
	return scriptedRelay(t, func(ctx context.Context, ws *websocket.Conn, verb string, parts []json.RawMessage) {
		if verb != "REQ" {
			return
		}
		var sub string
		_ = json.Unmarshal(parts[1], &sub)
		for i := 0; ctx.Err() == nil; i++ {
			ev := &nostr.Event{Kind: 1, CreatedAt: time.Now().Unix(), Content: strconv.Itoa(i) + padding, Tags: nostr.Tags{}}
			if ev.Sign(key) != nil {
				return
			}
			msg, _ := json.Marshal([]any{"EVENT", sub, ev})
			if ws.Write(ctx, websocket.MessageText, msg) != nil {
				return
			}
		}
	}, nil)
}

// A one-shot req stops once it holds the events its limit asked for, even
// from a relay that ignores the limit and never sends EOSE. Mutation
// killed: Query waiting for EOSE regardless of the limit runs to the
// timeout (and holds every event meanwhile).
func TestReqStopsAtItsLimit(t *testing.T) {
	t.Parallel()
	relay := floodingRelay(t, 10)
	var raws []json.RawMessage
	buzz(t, fakeRelayEnv(t, relay), "", "req", "--timeout", "20s", `{"kinds":[1],"limit":3}`, `{"kinds":[2],"limit":2}`).ok(t, &raws)
	require.Len(t, verified(t, raws), 5)
}

// Without a limit a flood ends as a protocol error once the query holds
// queryEventsPerFilter events, or queryMaxBytes of them, instead of growing
// the CLI's memory until --timeout (or forever with --timeout 0).
// Mutation killed: dropping either bound in Query lets the flood run on.
func TestReqBoundsAFlood(t *testing.T) {
	t.Parallel()
	e := buzz(t, fakeRelayEnv(t, floodingRelay(t, 0)), "", "req", "--timeout", "0", `{"kinds":[1]}`).fail(t, 1)
	require.Equal(t, "protocol", e.Code, e.Error)
	require.Contains(t, e.Error, strconv.Itoa(queryEventsPerFilter)+" events")

	e = buzz(t, fakeRelayEnv(t, floodingRelay(t, 1<<20)), "", "req", "--timeout", "0", `{"kinds":[1],"limit":500}`).fail(t, 1)
	require.Equal(t, "protocol", e.Code, e.Error)
	require.Contains(t, e.Error, "MiB")
}

// A stream's duplicate check remembers a fixed number of recent ids.
// Mutation killed: an idWindow that never forgets grows with the stream.
func TestStreamSeenIDsAreAFixedWindow(t *testing.T) {
	t.Parallel()
	w := newIDWindow(3)
	for _, id := range []string{"a", "b", "c"} {
		require.True(t, w.add(id))
	}
	require.False(t, w.add("a"), "a repeat within the window is dropped")
	require.True(t, w.add("d"))
	require.Len(t, w.ids, 3)
	require.True(t, w.add("a"), "the oldest id was forgotten")
	require.False(t, w.add("d"))
}

// A workflow command the relay accepted (OK true) with a response that is
// not JSON is a protocol error saying the command took effect, never a
// "network" error a script would retry into a second run. Mutation
// killed: publishCommand passing the response through unchecked fails
// while printing it, as code "network".
func TestAcceptedCommandWithBadResponseIsProtocol(t *testing.T) {
	t.Parallel()
	relay := scriptedRelay(t, func(ctx context.Context, ws *websocket.Conn, verb string, parts []json.RawMessage) {
		if verb == "EVENT" {
			writeOK(ctx, ws, parts[1], true, "response:{not json")
		}
	}, nil)
	e := buzz(t, fakeRelayEnv(t, relay), "", "workflows", "trigger", "00000000-0000-0000-0000-000000000001").fail(t, 1)
	require.Equal(t, "protocol", e.Code, e.Error)
	require.Contains(t, e.Error, "accepted")
	require.Contains(t, e.Error, "do not retry")
}

// An HTTP answer of 200 that is not JSON (a proxy's page) or is longer
// than maxHTTPBody is a protocol error that says which. Mutation killed:
// httpGetSigned passing the body through unchecked reports code "network";
// signedGet cutting an oversized body at the bound calls it "not JSON".
func TestHTTPAnswerThatIsNotJSONIsProtocol(t *testing.T) {
	t.Parallel()
	for body, want := range map[string]string{
		"<html>bad gateway</html>":                              "not JSON",
		`{"runs":["` + strings.Repeat("a", maxHTTPBody) + `"]}`: "over 8 MiB",
	} {
		relay := scriptedRelay(t, func(context.Context, *websocket.Conn, string, []json.RawMessage) {}, func(w http.ResponseWriter, r *http.Request) {
			_, _ = w.Write([]byte(body))
		})
		e := buzz(t, fakeRelayEnv(t, relay), "", "workflows", "runs", "00000000-0000-0000-0000-000000000001").fail(t, 1)
		require.Equal(t, "protocol", e.Code, e.Error)
		require.Contains(t, e.Error, want)
	}
}

// --timeout bounds the whole command, the closing handshake included: a
// relay that acknowledges the event and then ignores the close frame does
// not hold the command past it. Mutation killed: Close waiting on the
// library's closing handshake alone takes 5 s or more.
func TestTimeoutBoundsTheClosingHandshake(t *testing.T) {
	t.Parallel()
	relay := scriptedRelay(t, func(ctx context.Context, ws *websocket.Conn, verb string, parts []json.RawMessage) {
		if verb == "EVENT" {
			writeOK(ctx, ws, parts[1], true, "")
			<-ctx.Done() // never reads the client's close frame
		}
	}, nil)
	start := time.Now()
	var sent sentJSON
	buzz(t, fakeRelayEnv(t, relay), "", "send", "--timeout", "1s", "00000000-0000-0000-0000-000000000001", "hi").ok(t, &sent)
	// The mutation takes 5 s or more; 4 s leaves a loaded machine 3 s
	// beyond the 1 s timeout.
	require.Less(t, time.Since(start), 4*time.Second)
}

// An upper-case scheme (WS://) is accepted and means ws:// everywhere, the
// HTTP commands included. Mutation killed: relayURL returning the URL as
// written makes the HTTP commands request "httpWS://...".
func TestUpperCaseSchemeWorksOverHTTP(t *testing.T) {
	t.Parallel()
	relay := scriptedRelay(t, func(context.Context, *websocket.Conn, string, []json.RawMessage) {}, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"runs":[]}`))
	})
	var page struct {
		Runs []json.RawMessage `json:"runs"`
	}
	buzz(t, fakeRelayEnv(t, "WS"+strings.TrimPrefix(relay, "ws")), "", "workflows", "runs", "00000000-0000-0000-0000-000000000001").ok(t, &page)
	require.Empty(t, page.Runs)
}

// req --stream prints one event per line whatever whitespace the relay's
// JSON carries. Mutation killed: writing the relay's raw bytes splits an
// indented event over many lines.
func TestStreamIsOneEventPerLine(t *testing.T) {
	t.Parallel()
	key, err := nostr.GenerateSecretKey()
	require.NoError(t, err)
	relay := scriptedRelay(t, func(ctx context.Context, ws *websocket.Conn, verb string, parts []json.RawMessage) {
		if verb != "REQ" {
			return
		}
		var sub string
		_ = json.Unmarshal(parts[1], &sub)
		for _, content := range []string{"one", "two\nlines"} {
			ev := &nostr.Event{Kind: 1, CreatedAt: time.Now().Unix(), Tags: nostr.Tags{{"t", "x"}}, Content: content}
			require.NoError(t, ev.Sign(key))
			msg, _ := json.MarshalIndent([]any{"EVENT", sub, ev}, "", "  ")
			_ = ws.Write(ctx, websocket.MessageText, msg)
		}
	}, nil)
	o := buzz(t, fakeRelayEnv(t, relay), "", "req", "--stream", "--timeout", "500ms", `{"kinds":[1]}`)
	require.Equal(t, 0, o.code, o.stderr)
	lines := strings.Split(strings.TrimSuffix(o.stdout, "\n"), "\n")
	require.Len(t, lines, 2, o.stdout)
	events := verified(t, []json.RawMessage{json.RawMessage(lines[0]), json.RawMessage(lines[1])})
	require.Equal(t, "two\nlines", events[1].Content)
}
