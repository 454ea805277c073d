package relay_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/buzzrelay/buzz/internal/config"
	"github.com/buzzrelay/buzz/internal/nostr"
	"github.com/buzzrelay/buzz/internal/relaytest"
)

// storedDigest fingerprints every stored row, so a bad input that changed
// anything (an insert, a soft delete, a replacement) is caught.
func storedDigest(t *testing.T, r *relaytest.Relay) string {
	t.Helper()
	var digest string
	require.NoError(t, r.Pool.QueryRow(context.Background(), `
		SELECT count(*) || ':' || coalesce(md5(string_agg(encode(id, 'hex') || coalesce(deleted_at::text, ''), ',' ORDER BY id)), '')
		FROM events`).Scan(&digest))
	return digest
}

// TestBadInputCatalogue sends malformed or abusive frames on one
// authenticated connection. Each must get a clear, prefixed answer in the
// most specific form the protocol allows, the connection must stay usable,
// and nothing stored may change.
func TestBadInputCatalogue(t *testing.T) {
	t.Parallel()
	r := relaytest.Start(t, func(c *config.Config) {
		c.MaxContentLength = 1000
		c.MaxEventTags = 20
		c.MaxMessageBytes = 8 << 10
	})
	c := r.Dial(t, "")
	key := c.Auth(nil)
	for i := 0; i < 3; i++ {
		require.True(t, c.Publish(c.Sign(1, fmt.Sprint("seed ", i), nil, 0)).OK)
	}
	before := storedDigest(t, r)

	valid := func(mutate func(m map[string]any)) string {
		ev := relaytest.SignEvent(t, key, 1, "hello", nostr.Tags{{"t", "x"}}, 0)
		var m map[string]any
		b, _ := json.Marshal(ev)
		require.NoError(t, json.Unmarshal(b, &m))
		mutate(m)
		out, _ := json.Marshal([]any{"EVENT", m})
		return string(out)
	}
	resigned := func(kind int, content string, tags nostr.Tags, createdAt int64) string {
		ev := relaytest.SignEvent(t, key, kind, content, tags, createdAt)
		out, _ := json.Marshal([]any{"EVENT", ev})
		return string(out)
	}
	hex64 := strings.Repeat("a", 64)
	manyTags := make(nostr.Tags, 21)
	for i := range manyTags {
		manyTags[i] = nostr.Tag{"t", fmt.Sprint(i)}
	}
	manyKinds := make([]int, 1001)
	manyFilters := `["REQ","s"` + strings.Repeat(`,{}`, 11) + `]`

	cases := []struct {
		name  string
		frame string
		verb  string // NOTICE, OK or CLOSED
		want  string // prefix of the message
	}{
		{"not json", `hello`, "NOTICE", "invalid: "},
		{"object not array", `{"EVENT":1}`, "NOTICE", "invalid: "},
		{"empty array", `[]`, "NOTICE", "invalid: "},
		{"verb not a string", `[1,2]`, "NOTICE", "invalid: "},
		{"unknown verb", `["PUBLISH",{}]`, "NOTICE", "invalid: unknown message type"},
		{"lowercase verb", `["event",{}]`, "NOTICE", "invalid: unknown message type"},
		{"truncated json", `["REQ","s",{"kinds":[1]`, "CLOSED", "invalid: malformed JSON"},
		{"EVENT without event", `["EVENT"]`, "NOTICE", "invalid: "},
		{"EVENT with string", `["EVENT","x"]`, "NOTICE", "invalid: "},
		{"EVENT empty object", `["EVENT",{}]`, "NOTICE", "invalid: "},
		{"EVENT extra element", strings.TrimSuffix(valid(func(map[string]any) {}), "]") + `,"extra"]`, "OK", "invalid: "},
		{"id does not match", valid(func(m map[string]any) { m["content"] = "tampered" }), "OK", "invalid: event id does not match"},
		{"bad signature", valid(func(m map[string]any) { m["sig"] = strings.Repeat("b", 128) }), "OK", "invalid: bad signature"},
		{"uppercase id", valid(func(m map[string]any) { m["id"] = strings.ToUpper(m["id"].(string)) }), "OK", "invalid: id must be"},
		{"short id", valid(func(m map[string]any) { m["id"] = "abcd" }), "OK", "invalid: id must be"},
		{"numeric id", valid(func(m map[string]any) { m["id"] = 7 }), "NOTICE", "invalid: id must be"},
		{"pubkey not hex", valid(func(m map[string]any) { m["pubkey"] = strings.Repeat("z", 64) }), "OK", "invalid: "},
		{"sig too short", valid(func(m map[string]any) { m["sig"] = hex64 }), "OK", "invalid: "},
		{"missing sig", valid(func(m map[string]any) { delete(m, "sig") }), "OK", "invalid: "},
		{"missing content", valid(func(m map[string]any) { delete(m, "content") }), "OK", "invalid: "},
		{"negative kind", valid(func(m map[string]any) { m["kind"] = -1 }), "OK", "invalid: "},
		{"kind too large", valid(func(m map[string]any) { m["kind"] = 70000 }), "OK", "invalid: "},
		{"fractional kind", valid(func(m map[string]any) { m["kind"] = 1.5 }), "OK", "invalid: "},
		{"kind as string", valid(func(m map[string]any) { m["kind"] = "1" }), "OK", "invalid: "},
		{"created_at as string", valid(func(m map[string]any) { m["created_at"] = "now" }), "OK", "invalid: "},
		{"negative created_at", valid(func(m map[string]any) { m["created_at"] = -5 }), "OK", "invalid: "},
		{"huge created_at", valid(func(m map[string]any) { m["created_at"] = 1e30 }), "OK", "invalid: "},
		{"tags not array", valid(func(m map[string]any) { m["tags"] = "t" }), "OK", "invalid: "},
		{"tag not array", valid(func(m map[string]any) { m["tags"] = []any{"t"} }), "OK", "invalid: "},
		{"tag value number", valid(func(m map[string]any) { m["tags"] = []any{[]any{"t", 1}} }), "OK", "invalid: "},
		{"empty tag", valid(func(m map[string]any) { m["tags"] = []any{[]any{}} }), "OK", "invalid: "},
		{"nested tag arrays", valid(func(m map[string]any) { m["tags"] = []any{[]any{[]any{[]any{"deep"}}}} }), "OK", "invalid: "},
		{"content not string", valid(func(m map[string]any) { m["content"] = 42 }), "OK", "invalid: "},
		{"content too long", resigned(1, strings.Repeat("x", 1001), nil, 0), "OK", "invalid: "},
		{"too many tags", resigned(1, "tags", manyTags, 0), "OK", "invalid: "},
		{"created_at far future", resigned(1, "future", nil, time.Now().Add(time.Hour).Unix()), "OK", "invalid: created_at is more than"},
		{"NUL in content", resigned(1, "nul\x00byte", nil, 0), "OK", "invalid: content must not contain NUL"},
		{"NUL in tag", resigned(1, "tag nul", nostr.Tags{{"t", "a\x00b"}}, 0), "OK", "invalid: tags must not contain NUL"},
		{"AUTH kind via EVENT", resigned(nostr.KindAuth, "", nostr.Tags{{"challenge", c.Challenge}}, 0), "OK", "invalid: kind 22242"},
		// Credentials, ephemeral by kind: relaying one would hand it to
		// every live subscriber. Kills: validate without the case.
		{"Blossom auth via EVENT", resigned(nostr.KindBlossomAuth, "upload", nostr.Tags{{"t", "upload"}, {"expiration", "4102444800"}}, 0), "OK", "invalid: kind 24242 is an HTTP authorization"},
		// Kept for every reader, in memory and Redis: bounded in size.
		// Kills: validate without the presence size check.
		{"oversized presence", resigned(20001, "here", nostr.Tags{{"h", hex64[:36]}, {"status", strings.Repeat("x", 4200)}}, 0), "OK", "invalid: a presence announcement is at most 4096 bytes"},
		{"NIP-98 auth via EVENT", resigned(nostr.KindHTTPAuth, "", nostr.Tags{{"u", "https://x.example/"}, {"method", "GET"}}, 0), "OK", "invalid: kind 27235 is an HTTP authorization"},
		{"REQ without subid", `["REQ"]`, "NOTICE", "invalid: "},
		{"REQ without filters", `["REQ","s"]`, "CLOSED", "invalid: "},
		{"REQ numeric subid", `["REQ",5,{}]`, "NOTICE", "invalid: "},
		{"REQ empty subid", `["REQ","",{}]`, "NOTICE", "invalid: "},
		{"REQ subid too long", `["REQ","` + strings.Repeat("s", 65) + `",{}]`, "NOTICE", "invalid: "},
		{"filter not object", `["REQ","s",[]]`, "CLOSED", "invalid: "},
		{"short id filter", `["REQ","s",{"ids":["abc"]}]`, "CLOSED", "invalid: "},
		{"uppercase author", `["REQ","s",{"authors":["` + strings.Repeat("A", 64) + `"]}]`, "CLOSED", "invalid: "},
		{"kind as string filter", `["REQ","s",{"kinds":["1"]}]`, "CLOSED", "invalid: "},
		{"kind out of range filter", `["REQ","s",{"kinds":[70000]}]`, "CLOSED", "invalid: "},
		{"negative limit", `["REQ","s",{"limit":-1}]`, "CLOSED", "invalid: "},
		{"fractional limit", `["REQ","s",{"limit":1.5}]`, "CLOSED", "invalid: "},
		{"since as string", `["REQ","s",{"since":"yesterday"}]`, "CLOSED", "invalid: "},
		{"multi-letter tag filter", `["REQ","s",{"#ee":["x"]}]`, "CLOSED", "invalid: "},
		{"tag filter numbers", `["REQ","s",{"#e":[1]}]`, "CLOSED", "invalid: "},
		{"unknown filter key", `["REQ","s",{"colour":"red"}]`, "CLOSED", "invalid: "},
		{"too many filters", manyFilters, "CLOSED", "invalid: "},
		{"too many filter values", func() string {
			b, _ := json.Marshal([]any{"REQ", "s", map[string]any{"kinds": manyKinds}})
			return string(b)
		}(), "CLOSED", "invalid: "},
		{"tag filter value too long", `["REQ","s",{"#t":["` + strings.Repeat("v", 1025) + `"]}]`, "CLOSED", "invalid: "},
		{"search not a string", `["REQ","s",{"search":5}]`, "CLOSED", "invalid: "},
		{"NUL in a tag filter", `["REQ","s",{"#t":["x\u0000y"]}]`, "CLOSED", "invalid: "},
		{"NUL in search", `["REQ","s",{"search":"x\u0000y"}]`, "CLOSED", "invalid: "},
		{"NUL in a COUNT filter", `["COUNT","c",{"#t":["x\u0000y"]}]`, "CLOSED", "invalid: "},
		{"CLOSE without subid", `["CLOSE"]`, "NOTICE", "invalid: "},
		{"CLOSE numeric subid", `["CLOSE",1]`, "NOTICE", "invalid: "},
		{"COUNT without filters", `["COUNT","c"]`, "CLOSED", "invalid: "},
		{"AUTH with string", `["AUTH","token"]`, "NOTICE", "invalid: "},
		{"oversized REQ", `["REQ","big",{"#t":["` + strings.Repeat("v", 9<<10) + `"]}]`, "CLOSED", "invalid: message of"},
		{"oversized frame", `["NOTICE","` + strings.Repeat("v", 9<<10) + `"]`, "NOTICE", "invalid: message of"},
	}
	require.GreaterOrEqual(t, len(cases), 40)
	for _, tc := range cases {
		c.SendRaw(tc.frame)
		reply := c.NextReply()
		t.Logf("%-28s -> %s %q", tc.name, reply.Verb, reply.Msg)
		require.Equal(t, tc.verb, reply.Verb, "%s: got %+v", tc.name, reply)
		require.True(t, strings.HasPrefix(reply.Msg, tc.want), "%s: message %q lacks prefix %q", tc.name, reply.Msg, tc.want)
		require.Greater(t, len(reply.Msg), len("invalid: "), "%s: the reason must say what is wrong", tc.name)
		if tc.verb == "CLOSED" {
			require.NotEmpty(t, reply.SubID, tc.name)
		}
		// The connection is still usable and in step.
		c.Send("COUNT", "alive", map[string]any{"kinds": []int{1}})
		require.Equal(t, int64(3), c.Expect("COUNT").Count, "%s: connection must stay usable", tc.name)
	}

	// An EVENT over the limit whose id comes after its content (nostr-tools
	// writes it there) is answered with the OK its client waits for: the id
	// is read from the whole message as it streams past, not from the part
	// kept. Mutation killed: readMessage dropping the rest unread.
	var late map[string]any
	lateID := valid(func(m map[string]any) { m["content"] = strings.Repeat("v", 9<<10); late = m })
	require.Greater(t, strings.Index(lateID, `"id"`), 9<<10, "keys marshal in order: content before id")
	c.SendRaw(lateID)
	refused := c.Expect("OK")
	require.Equal(t, late["id"], refused.ID)
	require.False(t, refused.OK)
	require.True(t, strings.HasPrefix(refused.Msg, "invalid: message of"), refused.Msg)

	// Binary frames are refused with a NOTICE too.
	ctx, cancel := context.WithTimeout(context.Background(), relaytest.Patience)
	defer cancel()
	require.NoError(t, c.WS.Write(ctx, websocket.MessageBinary, []byte(`["REQ","s",{}]`)))
	require.True(t, strings.HasPrefix(c.Expect("NOTICE").Msg, "invalid: binary frames"))

	require.Equal(t, before, storedDigest(t, r), "bad input must not change stored data")
}

func TestLimitAbuseIsCapped(t *testing.T) {
	t.Parallel()
	r := relaytest.Start(t, func(c *config.Config) { c.MaxLimit = 5 })
	c := r.Dial(t, "")
	c.Auth(nil)
	for i := 0; i < 8; i++ {
		require.True(t, c.Publish(c.Sign(1, "n", nil, int64(1700000000+i))).OK)
	}
	require.Len(t, c.Req("huge", map[string]any{"limit": 1000000000}), 5)
	require.Len(t, c.Req("none", map[string]any{}), 5, "no limit means the relay's maximum")
	// Timestamps far beyond any date PostgreSQL can hold are not an error.
	require.Empty(t, c.Req("far-since", map[string]any{"since": int64(1) << 62}))
	require.Len(t, c.Req("far-until", map[string]any{"until": int64(1) << 62}), 5)
}

// Frames beyond the hard cap (4x the advertised maximum) cannot be read
// at all: the connection is closed with 1009, and the relay keeps serving.
func TestFrameBeyondHardCapClosesWith1009(t *testing.T) {
	t.Parallel()
	r := relaytest.Start(t, func(c *config.Config) { c.MaxMessageBytes = 1 << 10 })
	c := r.Dial(t, "")
	c.SendRaw(`["NOTICE","` + strings.Repeat("x", 5<<10) + `"]`)
	_, err := c.TryNext(relaytest.Patience)
	require.Equal(t, websocket.StatusMessageTooBig, websocket.CloseStatus(err), "got %v", err)
	again := r.Dial(t, "")
	again.Auth(nil)
}

// TestRefusedREQEndsTheSubscriptionOfItsID: a REQ reusing an open
// subscription's id replaces it whatever becomes of the new one, so one
// refused before it is read (malformed, or too large to keep) and answered
// CLOSED for that id ends the old subscription too: the client was told
// the id is closed, and nothing more is sent under it. A refused COUNT
// reusing the id answers the same CLOSED, which go-nostr and nostr-tools
// read as the end of their REQ, so it ends the REQ too, whether it was
// refused unread or by the read scope. The writer's OK comes after its
// event's local fan-out, so the reader's COUNT answer, asked after that
// OK, would come after an EVENT for the old subscription.
//
// Mutation killed: any of the refusals answering CLOSED without ending the
// subscription (the EVENT for "s" arrives before the COUNT).
func TestRefusedREQEndsTheSubscriptionOfItsID(t *testing.T) {
	t.Parallel()
	r := relaytest.Start(t, func(c *config.Config) { c.MaxMessageBytes = 4 << 10 })
	reader, writer := r.Dial(t, ""), r.Dial(t, "")
	reader.Auth(nil)
	writer.Auth(nil)
	author := writer.Key.PublicKeyHex()
	for _, refused := range []struct{ name, frame, prefix string }{
		{"malformed REQ", `["REQ","s",{"kinds":["1"]}]`, "invalid: "},
		{"oversized REQ", `["REQ","s",{"#t":["` + strings.Repeat("v", 8<<10) + `"]}]`, "invalid: "},
		{"malformed COUNT", `["COUNT","s",{"kinds":["1"]}]`, "invalid: "},
		{"oversized COUNT", `["COUNT","s",{"#t":["` + strings.Repeat("v", 8<<10) + `"]}]`, "invalid: "},
		{"COUNT the read scope refuses", `["COUNT","s",{"kinds":[1059]}]`, "restricted: "},
	} {
		reader.Send("REQ", "s", map[string]any{"authors": []string{author}, "limit": 0})
		require.Equal(t, "s", reader.Expect("EOSE").SubID)
		reader.SendRaw(refused.frame)
		closed := reader.Expect("CLOSED")
		require.Equal(t, "s", closed.SubID, refused.name)
		require.True(t, strings.HasPrefix(closed.Msg, refused.prefix), "%s: %q", refused.name, closed.Msg)

		require.True(t, writer.Publish(writer.Sign(1, refused.name, nil, 0)).OK)
		reader.Send("COUNT", "after", map[string]any{"authors": []string{author}})
		reply := reader.NextReply()
		require.Equal(t, "COUNT", reply.Verb, "%s: the subscription the CLOSED named still delivered %+v", refused.name, reply)
	}
}

// TestOversizedEventIsCountedAsRejected: an EVENT refused by its size
// (answered OK false, "invalid: message of N bytes ...") counts in
// buzz_events_rejected_total under reason "invalid", as an event refused by
// its content's length does; an oversized REQ is not an event and does not.
//
// Mutation killed: the oversized refusal sent without counting (the count
// stays at the one content-length refusal).
func TestOversizedEventIsCountedAsRejected(t *testing.T) {
	t.Parallel()
	r := relaytest.Start(t, func(c *config.Config) { c.MaxMessageBytes = 4 << 10; c.MaxContentLength = 100 })
	c := r.Dial(t, "")
	c.Auth(nil)
	rejected := func() float64 {
		return testutil.ToFloat64(r.Server.Metrics().EventsRejected.WithLabelValues("invalid"))
	}

	long := c.Publish(c.Sign(1, strings.Repeat("x", 101), nil, 0))
	require.False(t, long.OK)
	require.Contains(t, long.Msg, "invalid: content too long")
	require.Equal(t, 1.0, rejected())

	c.SendRaw(`["REQ","big",{"#t":["` + strings.Repeat("v", 8<<10) + `"]}]`)
	require.Equal(t, "big", c.Expect("CLOSED").SubID)
	require.Equal(t, 1.0, rejected(), "an oversized REQ is no event")

	big := c.Publish(c.Sign(1, strings.Repeat("x", 100), nostr.Tags{{"t", strings.Repeat("v", 8<<10)}}, 0))
	require.False(t, big.OK)
	require.Contains(t, big.Msg, "invalid: message of ")
	require.Equal(t, 2.0, rejected())
}
