package nostr

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// evJSON builds an event object from field/value fragments, in order.
func evJSON(fields ...string) string {
	return "{" + strings.Join(fields, ",") + "}"
}

var (
	fID      = `"id":"` + hexA + `"`
	fPubKey  = `"pubkey":"` + hexB + `"`
	fCreated = `"created_at":1700000000`
	fKind    = `"kind":1`
	fTags    = `"tags":[["e","` + hexC + `"],["t","nostr"]]`
	fContent = `"content":"hello <b>world</b>\n"`
	fSig     = `"sig":"` + sigX + `"`
	goodEv   = evJSON(fID, fPubKey, fCreated, fKind, fTags, fContent, fSig)
)

func TestParseClientMessageGood(t *testing.T) {
	lim := DefaultLimits()
	wantEv := &Event{ID: hexA, PubKey: hexB, CreatedAt: 1700000000, Kind: 1,
		Tags: Tags{{"e", hexC}, {"t", "nostr"}}, Content: "hello <b>world</b>\n", Sig: sigX}

	m, err := ParseClientMessage([]byte(`["EVENT",`+goodEv+`]`), lim)
	require.NoError(t, err)
	require.Equal(t, &EventMessage{Event: wantEv}, m)

	m, err = ParseClientMessage([]byte(" \n[ \"AUTH\" ,\t"+goodEv+" ] \n"), lim)
	require.NoError(t, err)
	require.Equal(t, &AuthMessage{Event: wantEv}, m)

	// Field order does not matter and unknown fields are ignored.
	reordered := evJSON(fSig, `"extra":{"a":[1,2.5,null,true,false,"x"]}`, fContent, fTags, fKind, fCreated, fPubKey, fID)
	m, err = ParseClientMessage([]byte(`["EVENT",`+reordered+`]`), lim)
	require.NoError(t, err)
	require.Equal(t, &EventMessage{Event: wantEv}, m)

	// Empty tags and content.
	m, err = ParseClientMessage([]byte(`["EVENT",`+evJSON(fID, fPubKey, `"created_at":0`, `"kind":0`, `"tags":[]`, `"content":""`, fSig)+`]`), lim)
	require.NoError(t, err)
	require.Equal(t, &EventMessage{Event: &Event{ID: hexA, PubKey: hexB, Tags: Tags{}, Sig: sigX}}, m)

	m, err = ParseClientMessage([]byte(`["REQ","sub1",{"kinds":[1]},{"authors":["`+hexB+`"],"#e":["x"]}]`), lim)
	require.NoError(t, err)
	require.Equal(t, &ReqMessage{SubID: "sub1", Filters: Filters{
		{Kinds: []int{1}},
		{Authors: []string{hexB}, Tags: map[string][]string{"e": {"x"}}},
	}}, m)

	m, err = ParseClientMessage([]byte(`["REQ","s",{}]`), lim)
	require.NoError(t, err)
	require.Equal(t, &ReqMessage{SubID: "s", Filters: Filters{{}}}, m)

	m, err = ParseClientMessage([]byte(`["COUNT","c",{"kinds":[3],"search":"x"}]`), lim)
	require.NoError(t, err)
	require.Equal(t, &CountMessage{SubID: "c", Filters: Filters{{Kinds: []int{3}, Search: "x"}}}, m)

	m, err = ParseClientMessage([]byte(`["CLOSE","sub1"]`), lim)
	require.NoError(t, err)
	require.Equal(t, &CloseMessage{SubID: "sub1"}, m)

	// Any string is a valid subscription id, up to the limit.
	m, err = ParseClientMessage([]byte(`["CLOSE","`+strings.Repeat("x", 64)+`"]`), lim)
	require.NoError(t, err)
	require.Equal(t, &CloseMessage{SubID: strings.Repeat("x", 64)}, m)

	// NIP-01 (and NIP-11's max_subid_length) count characters, not
	// bytes: 64 of them in two-byte UTF-8 are 128 bytes.
	// Mutation killed: comparing len(sub), the bytes, with the limit.
	m, err = ParseClientMessage([]byte(`["CLOSE","`+strings.Repeat("é", 64)+`"]`), lim)
	require.NoError(t, err)
	require.Equal(t, &CloseMessage{SubID: strings.Repeat("é", 64)}, m)
	_, err = ParseClientMessage([]byte(`["CLOSE","`+strings.Repeat("é", 65)+`"]`), lim)
	require.EqualError(t, err, "subscription id too long (max 64 characters)")

	m, err = ParseClientMessage([]byte(`["REQ","\"q\" \u00e9",{}]`), lim)
	require.NoError(t, err)
	require.Equal(t, "\"q\" é", m.(*ReqMessage).SubID)

	// Exactly at the limits.
	small := Limits{MaxFilters: 2, MaxEventTags: 2, MaxContentLength: 5}
	_, err = ParseClientMessage([]byte(`["REQ","s",{},{}]`), small)
	require.NoError(t, err)
	_, err = ParseClientMessage([]byte(`["EVENT",`+evJSON(fID, fPubKey, fCreated, fKind, `"tags":[["a"],["b"]]`, `"content":"12345"`, fSig)+`]`), small)
	require.NoError(t, err)
}

func TestParseClientMessageBad(t *testing.T) {
	lim := DefaultLimits()
	lim.MaxFilters = 2
	lim.MaxEventTags = 3
	lim.MaxContentLength = 20
	bigSub := strings.Repeat("s", 65)

	ev := func(fields ...string) string { return `["EVENT",` + evJSON(fields...) + `]` }
	tests := []struct {
		name, in string
		want     ParseError
	}{
		// Framing.
		{"empty frame", ``, ParseError{Msg: "message must be a JSON array"}},
		{"object", `{"EVENT":1}`, ParseError{Msg: "message must be a JSON array"}},
		{"string", `"EVENT"`, ParseError{Msg: "message must be a JSON array"}},
		{"empty array", `[]`, ParseError{Msg: "empty message array"}},
		{"number verb", `[1,"x"]`, ParseError{Msg: "message type must be a string"}},
		{"null verb", `[null]`, ParseError{Msg: "message type must be a string"}},
		{"unknown verb", `["PUBLISH",{}]`, ParseError{Msg: `unknown message type "PUBLISH"`}},
		{"lowercase verb", `["event",{}]`, ParseError{Msg: `unknown message type "event"`}},
		{"unterminated", `["EVENT"`, ParseError{Verb: "EVENT", Msg: "EVENT message must have 2 elements"}},
		{"trailing data", `["CLOSE","s"] x`, ParseError{Verb: "CLOSE", SubID: "s", Msg: "unexpected data after end of message"}},
		{"two messages", `["CLOSE","s"]["CLOSE","t"]`, ParseError{Verb: "CLOSE", SubID: "s", Msg: "unexpected data after end of message"}},

		// EVENT shape.
		{"event missing", `["EVENT"]`, ParseError{Verb: "EVENT", Msg: "EVENT message must have 2 elements"}},
		{"event not object", `["EVENT","x"]`, ParseError{Verb: "EVENT", Msg: "event must be a JSON object"}},
		{"event extra element", `["EVENT",` + goodEv + `,1]`, ParseError{Verb: "EVENT", EventID: hexA, Msg: "EVENT message must have exactly 2 elements"}},
		{"missing id", ev(fPubKey, fCreated, fKind, fTags, fContent, fSig), ParseError{Verb: "EVENT", Msg: `missing field "id"`}},
		{"missing pubkey", ev(fID, fCreated, fKind, fTags, fContent, fSig), ParseError{Verb: "EVENT", EventID: hexA, Msg: `missing field "pubkey"`}},
		{"missing created_at", ev(fID, fPubKey, fKind, fTags, fContent, fSig), ParseError{Verb: "EVENT", EventID: hexA, Msg: `missing field "created_at"`}},
		{"missing kind", ev(fID, fPubKey, fCreated, fTags, fContent, fSig), ParseError{Verb: "EVENT", EventID: hexA, Msg: `missing field "kind"`}},
		{"missing tags", ev(fID, fPubKey, fCreated, fKind, fContent, fSig), ParseError{Verb: "EVENT", EventID: hexA, Msg: `missing field "tags"`}},
		{"missing content", ev(fID, fPubKey, fCreated, fKind, fTags, fSig), ParseError{Verb: "EVENT", EventID: hexA, Msg: `missing field "content"`}},
		{"missing sig", ev(fID, fPubKey, fCreated, fKind, fTags, fContent), ParseError{Verb: "EVENT", EventID: hexA, Msg: `missing field "sig"`}},
		// An id refused for its form is still the one the client waits
		// on an OK for, up to 64 characters, escapes decoded.
		{"uppercase id", ev(`"id":"`+strings.ToUpper(hexA)+`"`, fPubKey, fCreated, fKind, fTags, fContent, fSig), ParseError{Verb: "EVENT", EventID: strings.ToUpper(hexA), Msg: "id must be 64-char lowercase hex"}},
		{"short id", ev(`"id":"abc"`, fPubKey, fCreated, fKind, fTags, fContent, fSig), ParseError{Verb: "EVENT", EventID: "abc", Msg: "id must be 64-char lowercase hex"}},
		{"escaped id", ev(`"id":"a\u0042c"`, fPubKey, fCreated, fKind, fTags, fContent, fSig), ParseError{Verb: "EVENT", EventID: "aBc", Msg: "id must be 64-char lowercase hex"}},
		{"64-character id", ev(`"id":"`+strings.Repeat("é", 64)+`"`, fPubKey, fCreated, fKind, fTags, fContent, fSig), ParseError{Verb: "EVENT", EventID: strings.Repeat("é", 64), Msg: "id must be 64-char lowercase hex"}},
		{"65-character id", ev(`"id":"`+strings.Repeat("a", 65)+`"`, fPubKey, fCreated, fKind, fTags, fContent, fSig), ParseError{Verb: "EVENT", Msg: "id must be 64-char lowercase hex"}},
		{"empty id", ev(`"id":""`, fPubKey, fCreated, fKind, fTags, fContent, fSig), ParseError{Verb: "EVENT", Msg: "id must be 64-char lowercase hex"}},
		{"uppercase id after a bad field", ev(`"kind":"x"`, `"id":"`+strings.ToUpper(hexA)+`"`, fPubKey, fCreated, fTags, fContent, fSig), ParseError{Verb: "EVENT", EventID: strings.ToUpper(hexA), Msg: "kind must be an integer between 0 and 65535"}},
		{"numeric id", ev(`"id":1`, fPubKey, fCreated, fKind, fTags, fContent, fSig), ParseError{Verb: "EVENT", Msg: "id must be 64-char lowercase hex"}},
		{"bad pubkey, id after", ev(`"pubkey":"xyz"`, fCreated, fKind, fTags, fContent, fSig, fID), ParseError{Verb: "EVENT", EventID: hexA, Msg: "pubkey must be 64-char lowercase hex"}},
		{"short sig", ev(fID, fPubKey, fCreated, fKind, fTags, fContent, `"sig":"`+hexA+`"`), ParseError{Verb: "EVENT", EventID: hexA, Msg: "sig must be 128-char lowercase hex"}},
		{"float created_at", ev(fID, fPubKey, `"created_at":1.5`, fKind, fTags, fContent, fSig), ParseError{Verb: "EVENT", EventID: hexA, Msg: "created_at must be a non-negative integer"}},
		{"string created_at", ev(fID, fPubKey, `"created_at":"1700000000"`, fKind, fTags, fContent, fSig), ParseError{Verb: "EVENT", EventID: hexA, Msg: "created_at must be a non-negative integer"}},
		{"negative created_at", ev(fID, fPubKey, `"created_at":-1`, fKind, fTags, fContent, fSig), ParseError{Verb: "EVENT", EventID: hexA, Msg: "created_at must be a non-negative integer"}},
		{"exponent created_at", ev(fID, fPubKey, `"created_at":1.7e9`, fKind, fTags, fContent, fSig), ParseError{Verb: "EVENT", EventID: hexA, Msg: "created_at must be a non-negative integer"}},
		{"kind too big", ev(fID, fPubKey, fCreated, `"kind":65536`, fTags, fContent, fSig), ParseError{Verb: "EVENT", EventID: hexA, Msg: "kind must be an integer between 0 and 65535"}},
		{"kind null", ev(fID, fPubKey, fCreated, `"kind":null`, fTags, fContent, fSig), ParseError{Verb: "EVENT", EventID: hexA, Msg: "kind must be an integer between 0 and 65535"}},
		{"tags object", ev(fID, fPubKey, fCreated, fKind, `"tags":{}`, fContent, fSig), ParseError{Verb: "EVENT", EventID: hexA, Msg: "tags must be an array of arrays of strings"}},
		{"tags null", ev(fID, fPubKey, fCreated, fKind, `"tags":null`, fContent, fSig), ParseError{Verb: "EVENT", EventID: hexA, Msg: "tags must be an array of arrays of strings"}},
		{"tag not array", ev(fID, fPubKey, fCreated, fKind, `"tags":["e"]`, fContent, fSig), ParseError{Verb: "EVENT", EventID: hexA, Msg: "tags must be an array of arrays of strings"}},
		{"tag number value", ev(fID, fPubKey, fCreated, fKind, `"tags":[["e",1]]`, fContent, fSig), ParseError{Verb: "EVENT", EventID: hexA, Msg: "tags must be an array of arrays of strings"}},
		{"empty tag", ev(fID, fPubKey, fCreated, fKind, `"tags":[[]]`, fContent, fSig), ParseError{Verb: "EVENT", EventID: hexA, Msg: "tags must not contain empty tags"}},
		{"too many tags", ev(fID, fPubKey, fCreated, fKind, `"tags":[["a"],["b"],["c"],["d"],["e"]]`, fContent, fSig), ParseError{Verb: "EVENT", EventID: hexA, Msg: "too many tags (max 3)"}},
		{"content number", ev(fID, fPubKey, fCreated, fKind, fTags, `"content":5`, fSig), ParseError{Verb: "EVENT", EventID: hexA, Msg: "content must be a string"}},
		{"content too long", ev(fID, fPubKey, fCreated, fKind, fTags, `"content":"123456789012345678901"`, fSig), ParseError{Verb: "EVENT", EventID: hexA, Msg: "content too long (max 20 characters)"}},
		{"duplicate content", ev(fID, fPubKey, fCreated, fKind, fTags, fContent, fContent, fSig), ParseError{Verb: "EVENT", EventID: hexA, Msg: `duplicate field "content"`}},
		{"duplicate id keeps first", ev(fID, `"id":"`+hexC+`"`, fPubKey, fCreated, fKind, fTags, fContent, fSig), ParseError{Verb: "EVENT", EventID: hexA, Msg: `duplicate field "id"`}},
		{"first error wins", ev(fID, `"kind":"x"`, `"content":1`), ParseError{Verb: "EVENT", EventID: hexA, Msg: "kind must be an integer between 0 and 65535"}},
		{"invalid utf8 content", ev(fID, fPubKey, fCreated, fKind, fTags, "\"content\":\"\xc3\x28\"", fSig), ParseError{Verb: "EVENT", EventID: hexA, Msg: "invalid UTF-8 in string"}},
		{"raw newline in content", ev(fID, fPubKey, fCreated, fKind, fTags, "\"content\":\"a\nb\"", fSig), ParseError{Verb: "EVENT", EventID: hexA, Msg: "malformed JSON: control character in string at offset 299"}},
		{"truncated event", `["EVENT",{"id":"` + hexA + `","pubkey":`, ParseError{Verb: "EVENT", EventID: hexA, Msg: "malformed JSON: unexpected end of input"}},
		{"unquoted key", `["EVENT",{id:"x"}]`, ParseError{Verb: "EVENT", Msg: "malformed JSON at offset 10"}},
		{"deep unknown field", ev(fID, `"x":`+strings.Repeat("[", 100)+strings.Repeat("]", 100)), ParseError{Verb: "EVENT", EventID: hexA, Msg: "malformed JSON: nested too deeply"}},
		{"auth not object", `["AUTH","challenge"]`, ParseError{Verb: "AUTH", Msg: "event must be a JSON object"}},
		{"auth missing sig", `["AUTH",` + evJSON(fID, fPubKey, fCreated, `"kind":22242`, fTags, fContent) + `]`, ParseError{Verb: "AUTH", EventID: hexA, Msg: `missing field "sig"`}},

		// REQ / COUNT / CLOSE.
		{"req no subid", `["REQ"]`, ParseError{Verb: "REQ", Msg: "missing subscription id"}},
		{"req numeric subid", `["REQ",1,{}]`, ParseError{Verb: "REQ", Msg: "subscription id must be a string"}},
		{"req empty subid", `["REQ","",{}]`, ParseError{Verb: "REQ", Msg: "subscription id must not be empty"}},
		{"req long subid", `["REQ","` + bigSub + `",{}]`, ParseError{Verb: "REQ", Msg: "subscription id too long (max 64 characters)"}},
		{"req no filters", `["REQ","s"]`, ParseError{Verb: "REQ", SubID: "s", Msg: "at least one filter is required"}},
		{"req too many filters", `["REQ","s",{},{},{}]`, ParseError{Verb: "REQ", SubID: "s", Msg: "too many filters (max 2)"}},
		{"req filter not object", `["REQ","s",[]]`, ParseError{Verb: "REQ", SubID: "s", Msg: "filter must be a JSON object"}},
		{"req bad ids", `["REQ","s",{"ids":["abc"]}]`, ParseError{Verb: "REQ", SubID: "s", Msg: "ids must be 64-char lowercase hex"}},
		{"req unknown key", `["REQ","s",{"kind":[1]}]`, ParseError{Verb: "REQ", SubID: "s", Msg: `unknown filter field "kind"`}},
		{"req second filter bad", `["REQ","s",{},{"limit":-1}]`, ParseError{Verb: "REQ", SubID: "s", Msg: "limit must be a non-negative integer"}},
		{"req trailing comma", `["REQ","s",{},]`, ParseError{Verb: "REQ", SubID: "s", Msg: "malformed JSON at offset 14"}},
		{"count no filters", `["COUNT","c"]`, ParseError{Verb: "COUNT", SubID: "c", Msg: "at least one filter is required"}},
		{"count bad filter", `["COUNT","c",{"since":"yesterday"}]`, ParseError{Verb: "COUNT", SubID: "c", Msg: "since must be a non-negative integer"}},
		{"close no subid", `["CLOSE"]`, ParseError{Verb: "CLOSE", Msg: "missing subscription id"}},
		{"close extra", `["CLOSE","s",{}]`, ParseError{Verb: "CLOSE", SubID: "s", Msg: "CLOSE message must have exactly 2 elements"}},
		{"close object subid", `["CLOSE",{}]`, ParseError{Verb: "CLOSE", Msg: "subscription id must be a string"}},
	}
	require.GreaterOrEqual(t, len(tests), 30)
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m, err := ParseClientMessage([]byte(tt.in), lim)
			require.Nil(t, m)
			require.Error(t, err)
			var pe *ParseError
			require.ErrorAs(t, err, &pe)
			require.Equal(t, tt.want, *pe)
			require.Equal(t, tt.want.Msg, err.Error())
		})
	}
}

func TestParseEventAgreesWithStdlib(t *testing.T) {
	// Our decoder must read escapes exactly as encoding/json does.
	content := `"a\"b\\c\/d\b\f\n\r\t\u0000\u001F\u00e9\u65e5\ud83e\udd19 <>&"`
	raw := evJSON(fID, fPubKey, fCreated, fKind, `"tags":[[`+content+`]]`, `"content":`+content, fSig)
	ev, err := ParseEvent([]byte(raw), Limits{})
	require.NoError(t, err)
	var want string
	require.NoError(t, json.Unmarshal([]byte(content), &want))
	require.Equal(t, want, ev.Content)
	require.Equal(t, want, ev.Tags[0][0])
}

func TestEventTagsDoNotAlias(t *testing.T) {
	ev, err := ParseEvent([]byte(evJSON(fID, fPubKey, fCreated, fKind, `"tags":[["a","1"],["b","2"]]`, fContent, fSig)), Limits{})
	require.NoError(t, err)
	ev.Tags[0] = append(ev.Tags[0], "extra")
	require.Equal(t, Tag{"b", "2"}, ev.Tags[1])
}

func TestEncoders(t *testing.T) {
	require.Equal(t, `["OK","`+hexA+`",true,""]`, string(EncodeOK(hexA, true, "")))
	require.Equal(t, `["OK","`+hexA+`",false,"invalid: bad \"sig\" <x>"]`, string(EncodeOK(hexA, false, `invalid: bad "sig" <x>`)))
	require.Equal(t, `["EOSE","sub\n1"]`, string(EncodeEOSE("sub\n1")))
	require.Equal(t, `["CLOSED","s","auth-required: please"]`, string(EncodeClosed("s", "auth-required: please")))
	require.Equal(t, `["NOTICE","a&b"]`, string(EncodeNotice("a&b")))
	require.Equal(t, `["AUTH","chal"]`, string(EncodeAuthChallenge("chal")))
	require.Equal(t, `["COUNT","c",{"count":42}]`, string(EncodeCount("c", 42, false)))
	require.Equal(t, `["COUNT","c",{"count":10000,"approximate":true}]`, string(EncodeCount("c", 10000, true)))

	e := &Event{ID: hexA, PubKey: hexB, CreatedAt: 1, Kind: 1, Tags: Tags{}, Content: "<hi>", Sig: sigX}
	raw, _ := e.MarshalJSON()
	want := `["EVENT","s",` + string(raw) + `]`
	require.Equal(t, want, string(EncodeEvent("s", e)))
	require.Equal(t, want, string(EncodeEventRaw("s", raw)))
	for _, b := range [][]byte{EncodeOK("x", true, "\x00"), EncodeEvent("s", e), EncodeNotice("\u2028")} {
		require.True(t, json.Valid(b), string(b))
	}
}
