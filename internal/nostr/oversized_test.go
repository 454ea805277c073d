package nostr

import (
	"encoding/json"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestOversizedMessageRefusal: the refusal of a message too large to keep
// names what its client waits for, read as the message streams past in
// pieces of any size: the event id wherever the event object holds it, or
// the subscription id; a NOTICE when neither can be read.
func TestOversizedMessageRefusal(t *testing.T) {
	id := strings.Repeat("ab", 32)
	big := strings.Repeat("x", 1000)
	const reason = "invalid: too big"
	cases := []struct {
		name, msg, want string
	}{
		{"id first (go-nostr)", `["EVENT",{"kind":1,"id":"` + id + `","content":"` + big + `"}]`, `["OK","` + id + `",false,"invalid: too big"]`},
		{"id after the content (nostr-tools)", `["EVENT", {"content":"` + big + `","tags":[["id","` + strings.Repeat("cd", 32) + `"]],"id" : "` + id + `","sig":"00"}]`, `["OK","` + id + `",false,"invalid: too big"]`},
		{"tags with escaped quotes and brackets", `["EVENT",{"tags":[["e","\"]}\\","\\\"` + big + `\"]}"],["t","\"}"]],"id":"` + id + `"}]`, `["OK","` + id + `",false,"invalid: too big"]`},
		{"id cut off", `["EVENT",{"content":"` + big, `["NOTICE","invalid: too big"]`},
		{"id only inside a tag", `["EVENT",{"tags":[["id","` + id + `"]],"content":"` + big + `"}]`, `["NOTICE","invalid: too big"]`},
		{"content that looks like a key", `["EVENT",{"content":"\",\"id\":\"` + id + `","x":"` + big + `"}]`, `["NOTICE","invalid: too big"]`},
		{"id in uppercase, as the parser names it", `["EVENT",{"id":"` + strings.ToUpper(id) + `","content":"` + big + `"}]`, `["OK","` + strings.ToUpper(id) + `",false,"invalid: too big"]`},
		{"id of 65 characters", `["EVENT",{"id":"` + id + `a","content":"` + big + `"}]`, `["NOTICE","invalid: too big"]`},
		{"id empty", `["EVENT",{"id":"","content":"` + big + `"}]`, `["NOTICE","invalid: too big"]`},
		{"id not a string", `["EVENT",{"id":["` + id + `"],"content":"` + big + `"}]`, `["NOTICE","invalid: too big"]`},
		{"REQ", `["REQ","sub 1",{"#t":["` + big + `"]}]`, `["CLOSED","sub 1","invalid: too big"]`},
		{"COUNT", `["COUNT","c",{"#t":["` + big + `"]}]`, `["CLOSED","c","invalid: too big"]`},
		{"REQ id too long", `["REQ","` + strings.Repeat("s", 65) + `",{"#t":["` + big + `"]}]`, `["NOTICE","invalid: too big"]`},
		{"REQ id escaped", `["REQ","a\"b",{"#t":["` + big + `"]}]`, `["CLOSED","a\"b","invalid: too big"]`},
		{"REQ id with a \\u escape", `["REQ","a\u0041",{"#t":["` + big + `"]}]`, `["CLOSED","aA","invalid: too big"]`},
		{"COUNT id with an escaped slash", `["COUNT","a\/b",{"#t":["` + big + `"]}]`, `["CLOSED","a/b","invalid: too big"]`},
		{"REQ id of 20 emoji (80 bytes)", `["REQ","` + strings.Repeat("🤙", 20) + `",{}]` + big, `["CLOSED","` + strings.Repeat("🤙", 20) + `","invalid: too big"]`},
		{"REQ id of 64 escaped surrogate pairs", `["REQ","` + strings.Repeat(`\ud83e\udd19`, 64) + `",{}]` + big, `["CLOSED","` + strings.Repeat("🤙", 64) + `","invalid: too big"]`},
		{"REQ id of 65 emoji", `["REQ","` + strings.Repeat("🤙", 65) + `",{}]` + big, `["NOTICE","invalid: too big"]`},
		{"REQ id with a lone surrogate", `["REQ","a\ud83e",{}]` + big, `["NOTICE","invalid: too big"]`},
		{"REQ id with a control character", "[\"REQ\",\"a\tb\",{}]" + big, `["NOTICE","invalid: too big"]`},
		{"escaped verb", `["\u0052EQ","s",{"#t":["` + big + `"]}]`, `["CLOSED","s","invalid: too big"]`},
		{"escaped id key and value", `["EVENT",{"content":"` + big + `","\u0069d":"\u0061` + id[1:] + `"}]`, `["OK","` + "a" + id[1:] + `",false,"invalid: too big"]`},
		{"CLOSE", `["CLOSE","s` + big + `"]`, `["NOTICE","invalid: too big"]`},
		{"REQ id empty", `["REQ","",{"#t":["` + big + `"]}]`, `["NOTICE","invalid: too big"]`},
		{"AUTH", `["AUTH",{"id":"` + id + `","content":"` + big + `"}]`, `["NOTICE","invalid: too big"]`},
		{"REQ inside an object", `{"x":["REQ","s",{"#t":["` + big + `"]}]}`, `["NOTICE","invalid: too big"]`},
		{"REQ after the array", `[] ["REQ","s",{"#t":["` + big + `"]}]`, `["NOTICE","invalid: too big"]`},
		{"not an array", `{"id":"` + id + `","content":"` + big + `"}`, `["NOTICE","invalid: too big"]`},
	}
	for _, tc := range cases {
		for _, piece := range []int{1, 7, len(tc.msg)} {
			var m OversizedMessage
			for rest := tc.msg; rest != ""; {
				n := min(piece, len(rest))
				_, _ = m.Write([]byte(rest[:n]))
				rest = rest[n:]
			}
			require.Equal(t, tc.want, string(m.Refusal(reason)), "%s, fed %d bytes at a time", tc.name, piece)
		}
	}
}

// FuzzOversizedMessageAgreesWithTheParser: on any message, the refusal is
// the same however the message is split into writes, and is a valid NIP-01
// answer; on a message the full parser reads, it names what the parser
// would have: the EVENT's id, the REQ's or COUNT's subscription id.
func FuzzOversizedMessageAgreesWithTheParser(f *testing.F) {
	for _, s := range fuzzMessageSeeds {
		f.Add([]byte(s), uint16(7))
	}
	// Ids the parser reads through escapes, multibyte characters and
	// surrogate pairs, and ones it refuses.
	for _, s := range []string{
		`["REQ","a\u0041",{}]`,
		`["COUNT","a\/b",{}]`,
		`["REQ","a\"\\\b\f\n\r\t",{}]`,
		`["REQ","` + strings.Repeat("🤙", 20) + `",{}]`,
		`["REQ","` + strings.Repeat("é", 64) + `",{}]`,
		`["REQ","` + strings.Repeat("é", 65) + `",{}]`,
		`["REQ","` + strings.Repeat(`\ud83e\udd19`, 64) + `",{}]`,
		`["REQ","\ud83e\udd19\u00e9\u65e5",{}]`,
		`["REQ","a\ud83e",{}]`,
		`["REQ","a\udd19\ud83e",{}]`,
		`["REQ","a\u00",{}]`,
		"[\"REQ\",\"a\xffb\",{}]",
		`["\u0052EQ","s",{}]`,
		`["\u0043OUNT","s",{}]`,
		`["\u0045VENT",` + goodEv + `]`,
		`["EVENT",` + strings.Replace(goodEv, `"id"`, `"\u0069d"`, 1) + `]`,
		`["EVENT",` + strings.Replace(goodEv, fID, `"id":"\u00`+strconv.FormatInt(int64(hexA[0]), 16)+hexA[1:]+`"`, 1) + `]`,
	} {
		f.Add([]byte(s), uint16(7))
		f.Add([]byte(s), uint16(0))
	}
	lim := DefaultLimits()
	f.Fuzz(func(t *testing.T, data []byte, split uint16) {
		var whole, pieces OversizedMessage
		_, _ = whole.Write(data)
		piece := int(split)%100 + 1 // past 16 bytes too, where string bodies are skipped by memchr
		for rest := data; len(rest) > 0; rest = rest[min(piece, len(rest)):] {
			_, _ = pieces.Write(rest[:min(piece, len(rest))])
		}
		refusal := whole.Refusal("invalid: too big")
		require.Equal(t, string(refusal), string(pieces.Refusal("invalid: too big")), "split every %d bytes", piece)
		require.True(t, json.Valid(refusal), "%s", refusal)

		m, err := ParseClientMessage(data, lim)
		if err != nil {
			return
		}
		switch m := m.(type) {
		case *EventMessage:
			require.Equal(t, string(EncodeOK(m.Event.ID, false, "invalid: too big")), string(refusal))
		case *ReqMessage:
			require.Equal(t, string(EncodeClosed(m.SubID, "invalid: too big")), string(refusal))
		case *CountMessage:
			require.Equal(t, string(EncodeClosed(m.SubID, "invalid: too big")), string(refusal))
		}
	})
}

// BenchmarkOversizedMessage: what reading past an oversized message costs
// the relay per byte an attacker sends, fed as the connection reads it.
func BenchmarkOversizedMessage(b *testing.B) {
	id := strings.Repeat("ab", 32)
	big := strings.Repeat("x", 1<<20)
	values := strings.Repeat(`"v",`, 1<<18)
	for _, bc := range []struct{ name, msg string }{
		{"EVENT id last", `["EVENT",{"content":"` + big + `","tags":[],"id":"` + id + `","sig":"00"}]`},
		{"REQ", `["REQ","sub",{"#t":[` + values + `"v"]}]`},
		// The worst for the string skip: an escape every other byte, and
		// tags of one-byte strings.
		{"EVENT escapes, id last", `["EVENT",{"content":"` + strings.Repeat(`\\`, 1<<19) + `","id":"` + id + `"}]`},
		{"EVENT short tags, id last", `["EVENT",{"tags":[[` + values + `"v"]],"id":"` + id + `"}]`},
	} {
		b.Run(bc.name, func(b *testing.B) {
			msg := []byte(bc.msg)
			b.SetBytes(int64(len(msg)))
			b.ReportAllocs()
			for b.Loop() {
				var m OversizedMessage
				for rest := msg; len(rest) > 0; rest = rest[min(32<<10, len(rest)):] {
					_, _ = m.Write(rest[:min(32<<10, len(rest))])
				}
				if string(m.Refusal("x")) == `["NOTICE","x"]` {
					b.Fatal("nothing read")
				}
			}
		})
	}
}
