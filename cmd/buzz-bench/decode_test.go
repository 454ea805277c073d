package main

import (
	"strings"
	"testing"

	"github.com/buzzrelay/buzz/internal/nostr"
)

func TestDecodeRelayMsg(t *testing.T) {
	event := `{"id":"ab","pubkey":"cd","created_at":1,"kind":1,"tags":[["t","x]"]],"content":"hi \"there\"","sig":"ef"}`
	cases := []struct {
		frame string
		want  relayMsg
	}{
		{`["AUTH","chal"]`, relayMsg{Verb: verbAuth, Text: []byte("chal")}},
		{`["OK","ab",true,""]`, relayMsg{Verb: verbOK, ID: []byte("ab"), OK: true, Text: []byte{}}},
		{` [ "OK" , "ab" , false , "blocked: no" ] `, relayMsg{Verb: verbOK, ID: []byte("ab"), Text: []byte("blocked: no")}},
		{`["EOSE","sub"]`, relayMsg{Verb: verbEOSE, SubID: []byte("sub")}},
		{`["CLOSED","sub","auth-required: x"]`, relayMsg{Verb: verbClosed, SubID: []byte("sub"), Text: []byte("auth-required: x")}},
		{`["NOTICE","caf\u00e9 \n"]`, relayMsg{Verb: verbNotice, Text: []byte("café \n")}},
		{`["COUNT","c",{"count":25000}]`, relayMsg{Verb: verbCount, SubID: []byte("c"), Count: 25000}},
		{`["COUNT","c",{"approximate":false,"count":3}]`, relayMsg{Verb: verbCount, SubID: []byte("c"), Count: 3}},
		{`["EVENT","s",` + event + `]`, relayMsg{Verb: verbEvent, SubID: []byte("s"), Event: []byte(event)}},
		{`["EOSE","sub","a future extra"]`, relayMsg{Verb: verbEOSE, SubID: []byte("sub")}},
		{`["WHATEVER",1,2]`, relayMsg{Verb: verbUnknown}},
	}
	for _, c := range cases {
		got, err := decodeRelayMsg([]byte(c.frame))
		if err != nil {
			t.Errorf("%s: %v", c.frame, err)
			continue
		}
		if !sameMsg(got, c.want) {
			t.Errorf("%s:\n got %+v\nwant %+v", c.frame, got, c.want)
		}
	}
}

func sameMsg(a, b relayMsg) bool {
	return a.Verb == b.Verb && string(a.SubID) == string(b.SubID) && string(a.ID) == string(b.ID) &&
		a.OK == b.OK && string(a.Text) == string(b.Text) && string(a.Event) == string(b.Event) && a.Count == b.Count
}

func TestDecodeRelayMsgRejectsMalformed(t *testing.T) {
	for _, frame := range []string{
		``, `{}`, `[]`, `[1]`, `["OK"]`, `["OK","id","yes",""]`, `["OK","id",true,""`,
		`["EOSE","unterminated]`, `["EVENT","s","not an object"]`, `["EVENT","s",{"id":"x"]`,
		`["COUNT","c",{}]`, `["COUNT","c",{"count":"many"}]`, `["NOTICE","bad \x escape"]`,
	} {
		if m, err := decodeRelayMsg([]byte(frame)); err == nil {
			t.Errorf("%q decoded without error: %+v", frame, m)
		}
	}
}

func TestEventFields(t *testing.T) {
	raw := `{"content":"run/1/2 {\"x\":[1]}","tags":[["e","}"]],"id":"abc","kind":1}`
	id, body, err := eventFields([]byte(raw))
	if err != nil || string(id) != "abc" || string(body) != `run/1/2 {"x":[1]}` {
		t.Errorf("eventFields = %q, %q, %v", id, body, err)
	}
	if _, _, err := eventFields([]byte(`{"id":"abc"}`)); err == nil {
		t.Error("an event without content should be an error")
	}
}

func TestMarkerRoundTrip(t *testing.T) {
	c := content("r1", 12, 3456, 200)
	if len(c) != 200 || !strings.HasPrefix(c, "r1/12/3456 lorem ipsum") {
		t.Fatalf("content = %q (%d bytes)", c, len(c))
	}
	if s, q, ok := parseMarker([]byte(c), "r1"); !ok || s != 12 || q != 3456 {
		t.Errorf("parseMarker = %d, %d, %v", s, q, ok)
	}
	if got := content("r1", 0, 0, 3); got != "r1/0/0 " {
		t.Errorf("content shorter than its marker = %q", got)
	}
	for _, other := range []string{"", "r1", "r2/1/2 x", "r1/1/2", "r1/x/2 ", "r1//2 ", "r10/1/2 ", "hello"} {
		if _, _, ok := parseMarker([]byte(other), "r1"); ok {
			t.Errorf("parseMarker(%q) accepted a foreign marker", other)
		}
	}
}

// The bench's own signer and frames must be what the relay's parser and
// verifier accept.
func TestSignedFramesVerify(t *testing.T) {
	s, err := newSigner()
	if err != nil {
		t.Fatal(err)
	}
	spec := eventSpec{signer: s, runID: "r", contentBytes: 64, tags: nostr.Tags{{"t", "fanout-r"}}}
	ev, err := spec.build(7)
	if err != nil {
		t.Fatal(err)
	}
	msg, err := nostr.ParseClientMessage(ev.frame, nostr.DefaultLimits())
	if err != nil {
		t.Fatalf("relay parser rejected %s: %v", ev.frame, err)
	}
	got := msg.(*nostr.EventMessage).Event
	if err := got.Verify(); err != nil {
		t.Fatalf("relay verifier rejected the event: %v", err)
	}
	if got.ID != ev.id || got.PubKey != s.pubHex || got.Tags.First("t")[1] != "fanout-r" {
		t.Errorf("round trip changed the event: %+v", got)
	}
}

func BenchmarkDecodeEventMessage(b *testing.B) {
	s, _ := newSigner()
	spec := eventSpec{signer: s, runID: "r", contentBytes: 200}
	ev, _ := spec.build(1)
	frame := []byte(`["EVENT","live",` + string(ev.frame[len(`["EVENT",`):]))
	b.SetBytes(int64(len(frame)))
	for b.Loop() {
		m, err := decodeRelayMsg(frame)
		if err != nil {
			b.Fatal(err)
		}
		if _, body, err := eventFields(m.Event); err != nil || len(body) == 0 {
			b.Fatal(err)
		}
	}
}
