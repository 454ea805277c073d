package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/stretchr/testify/require"

	"github.com/buzzrelay/buzz/internal/dbtest"
	"github.com/buzzrelay/buzz/internal/nostr"
	"github.com/buzzrelay/buzz/internal/relaytest"
)

func TestMain(m *testing.M) { dbtest.Main(m) }

// outcome is one in-process run of the CLI.
type outcome struct {
	code           int
	stdout, stderr string
}

// buzz runs the CLI with env as its whole environment.
func buzz(t *testing.T, env map[string]string, stdin string, args ...string) outcome {
	t.Helper()
	return buzzCtx(context.Background(), t, env, stdin, args...)
}

func buzzCtx(ctx context.Context, t *testing.T, env map[string]string, stdin string, args ...string) outcome {
	t.Helper()
	var out, errOut bytes.Buffer
	code := run(ctx, args, func(k string) string { return env[k] }, strings.NewReader(stdin), &out, &errOut)
	return outcome{code: code, stdout: out.String(), stderr: errOut.String()}
}

// ok requires success and decodes the single JSON document on stdout.
func (o outcome) ok(t *testing.T, v any) {
	t.Helper()
	require.Equal(t, 0, o.code, "stderr: %s", o.stderr)
	require.Empty(t, o.stderr)
	decodeOne(t, o.stdout, v)
}

// fail requires exit status code and returns the JSON error object.
func (o outcome) fail(t *testing.T, code int) errorJSON {
	t.Helper()
	require.Equal(t, code, o.code, "stdout: %s stderr: %s", o.stdout, o.stderr)
	require.Empty(t, o.stdout, "a failed command prints nothing on stdout")
	var e errorJSON
	decodeOne(t, o.stderr, &e)
	require.NotEmpty(t, e.Error)
	require.NotEmpty(t, e.Code)
	return e
}

func decodeOne(t *testing.T, s string, v any) {
	t.Helper()
	require.True(t, strings.HasSuffix(s, "\n") && strings.Count(s, "\n") == 1, "want one JSON line, got %q", s)
	dec := json.NewDecoder(strings.NewReader(s))
	dec.DisallowUnknownFields()
	require.NoError(t, dec.Decode(v), "output: %s", s)
}

type keyPair struct {
	SecretKey string `json:"secret_key"`
	PubKey    string `json:"pubkey"`
}

type created struct {
	ID         string `json:"id"`
	Name       string `json:"name"`
	Visibility string `json:"visibility"`
	EventID    string `json:"event_id"`
}

// newUser makes a key with buzz keygen and returns its environment.
func newUser(t *testing.T, r *relaytest.Relay) (map[string]string, keyPair) {
	t.Helper()
	var kp keyPair
	buzz(t, nil, "", "keygen").ok(t, &kp)
	require.True(t, nostr.IsHex64(kp.SecretKey) && nostr.IsHex64(kp.PubKey))
	return map[string]string{"BUZZ_PRIVATE_KEY": kp.SecretKey, "BUZZ_RELAY_URL": r.URL}, kp
}

func createChannel(t *testing.T, env map[string]string, args ...string) created {
	t.Helper()
	var ch created
	buzz(t, env, "", append([]string{"channels", "create"}, args...)...).ok(t, &ch)
	require.Len(t, ch.ID, 36)
	require.True(t, nostr.IsHex64(ch.EventID))
	return ch
}

// verified parses raw events and checks every id and signature.
func verified(t *testing.T, raws []json.RawMessage) []*nostr.Event {
	t.Helper()
	events := make([]*nostr.Event, len(raws))
	for i, raw := range raws {
		ev, err := nostr.ParseEvent(raw, nostr.Limits{})
		require.NoError(t, err)
		require.NoError(t, ev.Verify(), "event %d", i)
		events[i] = ev
	}
	return events
}

func TestOpenChannelEndToEnd(t *testing.T) {
	t.Parallel()
	r := relaytest.Start(t)
	alice, aliceKey := newUser(t, r)
	bob, bobKey := newUser(t, r)

	var who struct {
		PubKey string `json:"pubkey"`
	}
	buzz(t, alice, "", "whoami").ok(t, &who)
	require.Equal(t, aliceKey.PubKey, who.PubKey)

	ch := createChannel(t, alice, "general", "--about", "all hands <&>")
	require.Equal(t, "general", ch.Name)
	require.Equal(t, "open", ch.Visibility)

	var joined struct {
		Channel string `json:"channel"`
		EventID string `json:"event_id"`
	}
	buzz(t, bob, "", "channels", "join", ch.ID).ok(t, &joined)
	require.Equal(t, ch.ID, joined.Channel)
	require.True(t, nostr.IsHex64(joined.EventID))

	var first, second sentJSON
	buzz(t, alice, "", "send", ch.ID, "hello from alice").ok(t, &first)
	require.Equal(t, ch.ID, first.Channel)
	require.True(t, nostr.IsHex64(first.ID))
	for time.Now().Unix() <= first.CreatedAt { // so "newest first" is unambiguous
		time.Sleep(20 * time.Millisecond)
	}
	// Flags after the positionals, text with HTML-ish characters.
	buzz(t, bob, "", "send", ch.ID, "hi alice <3 & welcome", "--reply-to", first.ID, "--mention", aliceKey.PubKey).ok(t, &second)
	require.Greater(t, second.CreatedAt, first.CreatedAt)

	filter := `{"kinds":[9],"#h":["` + ch.ID + `"]}`
	var raws []json.RawMessage
	buzz(t, alice, "", "req", filter).ok(t, &raws)
	events := verified(t, raws)
	require.Len(t, events, 2)
	require.Equal(t, second.ID, events[0].ID, "newest first")
	require.Equal(t, first.ID, events[1].ID)
	require.Equal(t, bobKey.PubKey, events[0].PubKey)
	require.Equal(t, aliceKey.PubKey, events[1].PubKey)
	require.Equal(t, "hi alice <3 & welcome", events[0].Content)
	require.Equal(t, nostr.Tags{{"h", ch.ID}, {"e", first.ID, "", "reply"}, {"p", aliceKey.PubKey}}, events[0].Tags)
	require.Equal(t, nostr.Tags{{"h", ch.ID}}, events[1].Tags)

	// The same query with the filters on stdin gives the same events.
	var fromStdin []json.RawMessage
	buzz(t, bob, "["+filter+"]", "req", "--json").ok(t, &fromStdin)
	require.Equal(t, []string{second.ID, first.ID}, ids(verified(t, fromStdin)))

	var channels []channelJSON
	buzz(t, bob, "", "channels", "list").ok(t, &channels)
	require.Contains(t, channels, channelJSON{ID: ch.ID, Name: "general", About: "all hands <&>", Visibility: "open"})

	var count struct {
		Count int64 `json:"count"`
	}
	buzz(t, bob, "", "req", "--count", filter).ok(t, &count)
	require.EqualValues(t, 2, count.Count)
	out := buzz(t, bob, "", "req", "--count", filter)
	require.JSONEq(t, `{"count":2}`, out.stdout, "an exact count says nothing more")

	// Two filters: the union, without duplicates.
	var union []json.RawMessage
	buzz(t, bob, "", "req", filter, `{"ids":["`+first.ID+`"]}`).ok(t, &union)
	require.Equal(t, []string{second.ID, first.ID}, ids(verified(t, union)))
}

func ids(events []*nostr.Event) []string {
	out := make([]string, len(events))
	for i, ev := range events {
		out[i] = ev.ID
	}
	return out
}

func TestPrivateChannelRefusesNonMembers(t *testing.T) {
	t.Parallel()
	r := relaytest.Start(t)
	owner, _ := newUser(t, r)
	outsider, _ := newUser(t, r)

	ch := createChannel(t, owner, "secret plans", "--private")
	require.Equal(t, "private", ch.Visibility)

	var sent sentJSON
	buzz(t, owner, "", "send", ch.ID, "members only").ok(t, &sent)

	e := buzz(t, outsider, "", "send", ch.ID, "let me in").fail(t, 3)
	require.Equal(t, "restricted", e.Code)
	require.True(t, strings.HasPrefix(e.Error, "restricted: "), e.Error)

	e = buzz(t, outsider, "", "channels", "join", ch.ID).fail(t, 3)
	require.Equal(t, "restricted", e.Code)

	var channels []channelJSON
	buzz(t, owner, "", "channels", "list").ok(t, &channels)
	require.Contains(t, channels, channelJSON{ID: ch.ID, Name: "secret plans", Visibility: "private"})

	// Reads are scoped too: a query pinned to the channel is CLOSED, and
	// the channel is not listed for the outsider.
	e = buzz(t, outsider, "", "req", `{"kinds":[9],"#h":["`+ch.ID+`"]}`).fail(t, 3)
	require.Equal(t, "restricted", e.Code)
	buzz(t, outsider, "", "channels", "list").ok(t, &channels)
	for _, c := range channels {
		require.NotEqual(t, ch.ID, c.ID)
	}
}

func TestSendFromStdin(t *testing.T) {
	t.Parallel()
	r := relaytest.Start(t)
	alice, _ := newUser(t, r)
	_, bobKey := newUser(t, r)
	ch := createChannel(t, alice, "agents")

	in, err := json.Marshal(map[string]any{
		"channel":  ch.ID,
		"content":  "multi-line\nreport from an agent",
		"tags":     [][]string{{"t", "report"}},
		"mentions": []string{bobKey.PubKey},
	})
	require.NoError(t, err)
	var sent sentJSON
	buzz(t, alice, string(in), "send", "--json").ok(t, &sent)
	require.Equal(t, ch.ID, sent.Channel)

	// "-" is the same as --json.
	var again sentJSON
	buzz(t, alice, `{"channel":"`+ch.ID+`","content":"second","reply_to":"`+sent.ID+`"}`, "send", "-").ok(t, &again)

	var raws []json.RawMessage
	buzz(t, alice, "", "req", `{"ids":["`+sent.ID+`","`+again.ID+`"]}`).ok(t, &raws)
	events := verified(t, raws)
	require.Len(t, events, 2)
	byID := map[string]*nostr.Event{events[0].ID: events[0], events[1].ID: events[1]}
	require.Equal(t, "multi-line\nreport from an agent", byID[sent.ID].Content)
	require.Equal(t, nostr.Tags{{"h", ch.ID}, {"p", bobKey.PubKey}, {"t", "report"}}, byID[sent.ID].Tags)
	require.Equal(t, nostr.Tags{{"h", ch.ID}, {"e", sent.ID, "", "reply"}}, byID[again.ID].Tags)

	// A misspelt field is a local error, not a silently empty message.
	e := buzz(t, alice, `{"channel":"`+ch.ID+`","text":"oops"}`, "send", "--json").fail(t, 2)
	require.Equal(t, "invalid", e.Code)
	require.Contains(t, e.Error, "text")
	e = buzz(t, alice, `not json`, "send", "--json").fail(t, 2)
	require.Equal(t, "invalid", e.Code)
}

// A filter the relay would refuse fails locally and never opens a connection.
func TestBadFilterNeverReachesRelay(t *testing.T) {
	t.Parallel()
	var hits atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		http.Error(w, "no", http.StatusTeapot)
	}))
	t.Cleanup(srv.Close)
	key, err := nostr.GenerateSecretKey()
	require.NoError(t, err)
	env := map[string]string{"BUZZ_PRIVATE_KEY": key.Hex(), "BUZZ_RELAY_URL": "ws" + strings.TrimPrefix(srv.URL, "http")}

	for _, tc := range []struct {
		name, stdin string
		args        []string
		want        string
	}{
		{"kind not a number", "", []string{"req", `{"kinds":["x"]}`}, "kinds must be integers"},
		{"misspelt field", "", []string{"req", `{"kind":[1]}`}, `unknown filter field "kind"`},
		{"second filter", "", []string{"req", `{"kinds":[1]}`, `{"authors":["ABC"]}`}, "filter 2: authors"},
		{"not JSON", "", []string{"req", `{kinds:[1]}`}, "filter 1"},
		{"count", "", []string{"req", "--count", `{"limit":-1}`}, "limit"},
		{"stdin", `[{"kinds":[1]},{"#hh":["x"]}]`, []string{"req", "--json"}, "filter 2"},
		{"stdin not an array", `"x"`, []string{"req", "-"}, "JSON array"},
		{"empty stdin array", `[]`, []string{"req", "--json"}, "at least one filter"},
	} {
		e := buzz(t, env, tc.stdin, tc.args...).fail(t, 2)
		require.Equal(t, "invalid", e.Code, tc.name)
		require.Contains(t, e.Error, tc.want, tc.name)
	}
	require.Zero(t, hits.Load(), "no invalid filter may reach the relay")

	// A valid filter does reach it (and the teapot's answer to the upgrade
	// is a refusal).
	e := buzz(t, env, "", "req", `{"kinds":[1]}`).fail(t, 3)
	require.Equal(t, "http_418", e.Code)
	require.EqualValues(t, 1, hits.Load())
}

// A URL that answers the upgrade with a web page is not a relay refusing
// (exit 3, which a script may treat as final or retry on its code) but no
// relay at all: exit 1, code protocol, saying what answered.
// Mutation killed: every non-101 answer taken for a refusal (exit 3,
// code http_200).
func TestWebPageIsNoRelay(t *testing.T) {
	t.Parallel()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.WriteString(w, "<html>welcome</html>")
	}))
	t.Cleanup(srv.Close)
	key, err := nostr.GenerateSecretKey()
	require.NoError(t, err)
	relayURL := "ws" + strings.TrimPrefix(srv.URL, "http")
	env := map[string]string{"BUZZ_PRIVATE_KEY": key.Hex(), "BUZZ_RELAY_URL": relayURL}

	e := buzz(t, env, "", "req", `{"kinds":[1]}`).fail(t, 1)
	require.Equal(t, "protocol", e.Code)
	require.Equal(t, "no relay at "+relayURL+": it answered the WebSocket upgrade with 200 OK", e.Error)
}

func TestUsageErrors(t *testing.T) {
	t.Parallel()
	key, err := nostr.GenerateSecretKey()
	require.NoError(t, err)
	env := map[string]string{"BUZZ_PRIVATE_KEY": key.Hex(), "BUZZ_RELAY_URL": "ws://127.0.0.1:1"}
	for _, args := range [][]string{
		{},
		{"frobnicate"},
		{"channels"},
		{"channels", "delete", "x"},
		{"channels", "create"},
		{"channels", "create", "a", "b"},
		{"channels", "join"},
		{"channels", "list", "extra"},
		{"send", "only-a-channel"},
		{"send", "a", "b", "c"},
		{"send", "--json", "extra"},
		{"req"},
		{"req", "--count", "--stream", "{}"},
		{"req", "--bogus", "{}"},
		{"req", "--timeout", "soon", "{}"},
		{"--timeout", "-1s", "whoami"},
		{"whoami", "extra"},
		{"keygen", "extra"},
	} {
		e := buzz(t, env, "", args...).fail(t, 2)
		require.Equal(t, "usage", e.Code, "%q: %s", args, e.Error)
	}

	// Invalid input and configuration are exit 2 too, before any network use.
	for _, tc := range []struct {
		env  map[string]string
		args []string
		code string
	}{
		{env, []string{"send", "not-a-uuid", "hi"}, "invalid"},
		{env, []string{"send", "0b7c8c5e-5f6a-4c1e-9f7e-2d3c4b5a6978", ""}, "invalid"},
		{env, []string{"send", "0b7c8c5e-5f6a-4c1e-9f7e-2d3c4b5a6978", "hi", "--mention", "npub1xyz"}, "invalid"},
		{env, []string{"send", "0b7c8c5e-5f6a-4c1e-9f7e-2d3c4b5a6978", "hi", "--reply-to", "abc"}, "invalid"},
		{env, []string{"channels", "join", "nope"}, "invalid"},
		{env, []string{"channels", "create", strings.Repeat("n", 256)}, "invalid"},
		{map[string]string{"BUZZ_RELAY_URL": "ws://127.0.0.1:1"}, []string{"channels", "list"}, "config"},
		{map[string]string{"BUZZ_PRIVATE_KEY": "nsec1abc", "BUZZ_RELAY_URL": "ws://127.0.0.1:1"}, []string{"whoami"}, "config"},
		{map[string]string{"BUZZ_PRIVATE_KEY": key.Hex()}, []string{"channels", "list"}, "config"},
		{map[string]string{"BUZZ_PRIVATE_KEY": key.Hex(), "BUZZ_RELAY_URL": "http://127.0.0.1:1"}, []string{"channels", "list"}, "config"},
	} {
		e := buzz(t, tc.env, "", tc.args...).fail(t, 2)
		require.Equal(t, tc.code, e.Code, "%q: %s", tc.args, e.Error)
	}

	var help map[string]string
	buzz(t, nil, "", "help").ok(t, &help)
	require.Contains(t, help["usage"], "channels create NAME")
	buzz(t, nil, "", "send", "-h").ok(t, &help)
}

func TestKeys(t *testing.T) {
	t.Parallel()
	var kp keyPair
	buzz(t, nil, "", "keygen").ok(t, &kp)
	key, err := nostr.SecretKeyFromHex(kp.SecretKey)
	require.NoError(t, err)
	require.Equal(t, key.PublicKeyHex(), kp.PubKey)

	var who struct {
		PubKey string `json:"pubkey"`
	}
	buzz(t, map[string]string{"BUZZ_PRIVATE_KEY": kp.SecretKey}, "", "whoami").ok(t, &who)
	require.Equal(t, kp.PubKey, who.PubKey)

	// --key-file overrides the environment.
	other, err := nostr.GenerateSecretKey()
	require.NoError(t, err)
	path := filepath.Join(t.TempDir(), "key")
	require.NoError(t, os.WriteFile(path, []byte(other.Hex()+"\n"), 0o600))
	buzz(t, map[string]string{"BUZZ_PRIVATE_KEY": kp.SecretKey}, "", "--key-file", path, "whoami").ok(t, &who)
	require.Equal(t, other.PublicKeyHex(), who.PubKey)
}

func TestStream(t *testing.T) {
	t.Parallel()
	r := relaytest.Start(t)
	alice, _ := newUser(t, r)
	ch := createChannel(t, alice, "live")
	var stored sentJSON
	buzz(t, alice, "", "send", ch.ID, "before the stream").ok(t, &stored)
	filter := `{"kinds":[9],"#h":["` + ch.ID + `"]}`

	// --timeout ends a stream normally: the stored events, one per line.
	o := buzz(t, alice, "", "req", "--stream", "--timeout", "5s", filter)
	require.Equal(t, 0, o.code, o.stderr)
	lines := strings.Split(strings.TrimSuffix(o.stdout, "\n"), "\n")
	require.Len(t, lines, 1)
	require.Equal(t, []string{stored.ID}, ids(verified(t, []json.RawMessage{json.RawMessage(lines[0])})))

	// A live event arrives while the stream is open; cancelling (SIGINT)
	// ends it with status 0.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	pr, pw := io.Pipe()
	done := make(chan int, 1)
	var errOut bytes.Buffer
	go func() {
		code := run(ctx, []string{"req", "--stream", "--timeout", "30s", filter},
			func(k string) string { return alice[k] }, strings.NewReader(""), pw, &errOut)
		pw.Close()
		done <- code
	}()
	rd := bufio.NewReader(pr)
	readEvent := func() *nostr.Event {
		line, err := rd.ReadBytes('\n')
		require.NoError(t, err, errOut.String())
		return verified(t, []json.RawMessage{line})[0]
	}
	// The relay subscribes before reading history, so once the stored event
	// is out the live subscription is in place.
	require.Equal(t, stored.ID, readEvent().ID)
	var live sentJSON
	buzz(t, alice, "", "send", ch.ID, "during the stream").ok(t, &live)
	ev := readEvent()
	require.Equal(t, live.ID, ev.ID)
	require.Equal(t, "during the stream", ev.Content)
	cancel()
	_, _ = io.Copy(io.Discard, pr)
	require.Equal(t, 0, <-done, errOut.String())
}

// A relay that never answers is cut off by --timeout.
func TestTimeout(t *testing.T) {
	t.Parallel()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ws, err := websocket.Accept(w, r, nil)
		if err != nil {
			return
		}
		defer ws.CloseNow()
		_, _, _ = ws.Read(r.Context()) // never sends the AUTH challenge
	}))
	t.Cleanup(srv.Close)
	key, err := nostr.GenerateSecretKey()
	require.NoError(t, err)
	env := map[string]string{"BUZZ_PRIVATE_KEY": key.Hex(), "BUZZ_RELAY_URL": "ws" + strings.TrimPrefix(srv.URL, "http")}
	start := time.Now()
	e := buzz(t, env, "", "channels", "list", "--timeout", "300ms").fail(t, 1)
	require.Equal(t, "timeout", e.Code, e.Error)
	require.Contains(t, e.Error, "AUTH challenge")
	// Below the 10 s default, so an ignored --timeout fails here, with
	// room for a loaded machine.
	require.Less(t, time.Since(start), 9*time.Second)

	// Stdin that never closes is bounded too.
	pr, pw := io.Pipe()
	defer pw.Close()
	var out, errOut bytes.Buffer
	code := run(context.Background(), []string{"send", "--json", "--timeout", "200ms"},
		func(k string) string { return env[k] }, pr, &out, &errOut)
	require.Equal(t, 1, code)
	var te errorJSON
	require.NoError(t, json.Unmarshal(errOut.Bytes(), &te))
	require.Equal(t, "timeout", te.Code)
}

// startOfNextSecond sleeps until a new second begins, so the commands that
// follow share their created_at second.
func startOfNextSecond() {
	now := time.Now()
	time.Sleep(now.Truncate(time.Second).Add(time.Second).Sub(now))
}

// The same text sent twice within one second is two messages: the relay
// holds both and the CLI prints two ids. Mutation killed: publish without
// re-signing a duplicate prints the first id twice and stores one event.
func TestSameTextTwiceInOneSecondIsTwoMessages(t *testing.T) {
	t.Parallel()
	r := relaytest.Start(t)
	alice, _ := newUser(t, r)
	ch := createChannel(t, alice, "echo")
	var first, second sentJSON
	startOfNextSecond()
	buzz(t, alice, "", "send", ch.ID, "ok").ok(t, &first)
	buzz(t, alice, "", "send", ch.ID, "ok").ok(t, &second)
	require.NotEqual(t, first.ID, second.ID)
	require.False(t, second.Duplicate)
	var raws []json.RawMessage
	buzz(t, alice, "", "req", `{"kinds":[9],"#h":["`+ch.ID+`"]}`).ok(t, &raws)
	require.Len(t, verified(t, raws), 2)
}

// workflows runs checks --limit and the cursor locally (exit 2, nothing
// sent), as its help promises. Mutation killed: dropping the --limit range
// check sends --limit 0 to the relay, a network error here.
func TestWorkflowsRunsRefusesBadPagingLocally(t *testing.T) {
	t.Parallel()
	key, err := nostr.GenerateSecretKey()
	require.NoError(t, err)
	env := map[string]string{"BUZZ_PRIVATE_KEY": key.Hex(), "BUZZ_RELAY_URL": "ws://127.0.0.1:1"}
	wf := "00000000-0000-0000-0000-000000000001"
	for _, args := range [][]string{
		{"--limit", "0"},
		{"--limit", "101"},
		{"--before", "1700000000", "--before-id", wf},
		{"--before", "2026-01-02T03:04:05Z", "--before-id", "last"},
	} {
		e := buzz(t, env, "", append([]string{"workflows", "runs", wf}, args...)...).fail(t, 2)
		require.Equal(t, "invalid", e.Code, "%q: %s", args, e.Error)
	}
}

// A --key-file value that is not a file (often the key itself, pasted in
// the wrong place) is never echoed. Mutation killed: quoting the path or
// the read error (which names the path) prints the secret on stderr.
func TestKeyFileErrorNeverEchoesTheValue(t *testing.T) {
	t.Parallel()
	key, err := nostr.GenerateSecretKey()
	require.NoError(t, err)
	o := buzz(t, nil, "", "--key-file", key.Hex(), "whoami")
	e := o.fail(t, 2)
	require.Equal(t, "config", e.Code)
	require.Contains(t, e.Error, "key file not found")
	require.NotContains(t, o.stderr, key.Hex())

	bad := filepath.Join(t.TempDir(), key.Hex()[:32])
	require.NoError(t, os.WriteFile(bad, []byte("not a key"), 0o600))
	o = buzz(t, nil, "", "--key-file", bad, "whoami")
	o.fail(t, 2)
	require.NotContains(t, o.stderr, key.Hex()[:32])
}

// A secret key given where the relay URL belongs (--relay or
// BUZZ_RELAY_URL) is not echoed in the error, as a key given for
// --key-file is not: the error JSON ends up in an agent's logs. The error
// still says what is wrong with the value.
// Mutation killed: quoting the raw value in relayURL's error (as before).
func TestRelayURLErrorNeverEchoesTheValue(t *testing.T) {
	t.Parallel()
	key, err := nostr.GenerateSecretKey()
	require.NoError(t, err)
	for _, env := range []map[string]string{
		{"BUZZ_PRIVATE_KEY": key.Hex(), "BUZZ_RELAY_URL": key.Hex()},
		{"BUZZ_PRIVATE_KEY": key.Hex(), "BUZZ_RELAY_URL": "wss:" + key.Hex()},
	} {
		o := buzz(t, env, "", "channels", "list")
		e := o.fail(t, 2)
		require.Equal(t, "config", e.Code)
		require.Contains(t, e.Error, "ws://HOST[:PORT] or wss://HOST[:PORT]")
		require.NotContains(t, o.stderr, key.Hex()[:16])
	}
	o := buzz(t, map[string]string{"BUZZ_PRIVATE_KEY": key.Hex()}, "", "--relay", "http://"+key.Hex()[:20], "channels", "list")
	e := o.fail(t, 2)
	require.Contains(t, e.Error, `scheme "http"`, "the scheme, which says what is wrong, is named")
	require.NotContains(t, o.stderr, key.Hex()[:20])
}

// A --timeout that is not a finite number of seconds is refused as such,
// not as "negative". Mutation killed: dropping the finiteness check (NaN
// and 1e300 were called negative).
func TestTimeoutMustBeFinite(t *testing.T) {
	t.Parallel()
	for _, v := range []string{"NaN", "Inf", "1e300"} {
		e := buzz(t, nil, "", "--timeout", v, "whoami").fail(t, 2)
		require.Equal(t, "usage", e.Code)
		require.NotContains(t, e.Error, "negative", v)
	}
}

// A relay URL's password (basic auth for a proxy in front of the relay)
// is not printed when the connection fails.
// Mutation killed: printing the URL as given in Dial's error.
func TestConnectErrorRedactsThePassword(t *testing.T) {
	t.Parallel()
	key, err := nostr.GenerateSecretKey()
	require.NoError(t, err)
	o := buzz(t, map[string]string{"BUZZ_PRIVATE_KEY": key.Hex(), "BUZZ_RELAY_URL": "ws://agent:s3cretpw@127.0.0.1:1"}, "", "channels", "list")
	e := o.fail(t, 1)
	require.Equal(t, "network", e.Code)
	require.Contains(t, e.Error, "agent:xxxxx@127.0.0.1:1")
	require.NotContains(t, o.stderr, "s3cretpw")
}
