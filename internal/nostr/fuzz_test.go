package nostr

import (
	"bytes"
	"encoding/json"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

var fuzzMessageSeeds = []string{
	`["EVENT",` + goodEv + `]`,
	`["AUTH",` + evJSON(fID, fPubKey, fCreated, `"kind":22242`, `"tags":[["relay","wss://r"],["challenge","c"]]`, `"content":""`, fSig) + `]`,
	`["EVENT",` + evJSON(fID, fPubKey, fCreated, fKind, `"tags":[["\u00e9","\ud83e\udd19"]]`, `"content":"\"\\\/\b\f\n\r\t\u0000"`, fSig, `"x":[{}]`) + `]`,
	`["REQ","s",{"ids":["` + hexA + `"],"authors":[],"kinds":[1,7],"#e":["x"],"since":1,"until":2,"limit":10,"search":"q"}]`,
	`["REQ","s",{},{"#t":["a","b"]}]`,
	`["REQ","s",{"kinds":[0]},{"agent_owner":"` + hexA + `","authors":["` + hexB + `"]}]`,
	`["COUNT","c",{"agent_owner":"xyz"}]`,
	`["COUNT","c",{"kinds":[3]}]`,
	`["CLOSE","s"]`,
	`["CLOSE","\u00e9\u65e5\ud83e\udd19é日🤙"]`,
	`["EVENT",{"id":1}]`,
	`[]`,
	`["EVENT",{"id":"` + hexA + `","kind":1.5}]`,
}

var fuzzFilterSeeds = []string{
	`{}`,
	`{"ids":["` + hexA + `"],"authors":["` + hexB + `"]}`,
	`{"kinds":[0,65535],"limit":0}`,
	`{"#e":["x"],"#E":[],"#p":["` + hexC + `"]}`,
	`{"since":0,"until":9223372036854775807}`,
	`{"search":"\u00e9 <&> \ud83e\udd19"}`,
	`{"ids":[]}`,
	`{"kinds":[1e3]}`,
	`{"#ab":["x"]}`,
	`{"limit":-1}`,
	`{"kinds":[0],"search":"Honey","agent_owner":"` + hexA + `"}`,
	`{"authors":["` + hexB + `"],"agent_owner":null}`,
	`{"agent_owner":"` + strings.ToUpper(hexA) + `"}`,
	`{"agent_owner":["` + hexA + `"]}`,
}

func FuzzParseClientMessage(f *testing.F) {
	for _, s := range fuzzMessageSeeds {
		f.Add([]byte(s))
	}
	lim := DefaultLimits()
	f.Fuzz(func(t *testing.T, data []byte) {
		m, err := ParseClientMessage(data, lim)
		if err != nil {
			require.Nil(t, m)
			pe, ok := err.(*ParseError)
			require.True(t, ok, "error type %T", err)
			require.NotEmpty(t, pe.Msg)
			if pe.EventID != "" {
				require.True(t, answerableID([]byte(pe.EventID)), "%q", pe.EventID)
				require.Contains(t, []string{"EVENT", "AUTH"}, pe.Verb)
			}
			if pe.SubID != "" {
				require.Contains(t, []string{"REQ", "COUNT", "CLOSE"}, pe.Verb)
				require.LessOrEqual(t, len(pe.SubID), lim.MaxSubIDLength)
			}
			return
		}
		// Everything accepted is valid JSON, and agrees with encoding/json.
		require.True(t, json.Valid(data), "accepted invalid JSON")
		var arr []json.RawMessage
		require.NoError(t, json.Unmarshal(data, &arr))

		switch m := m.(type) {
		case *EventMessage:
			require.Len(t, arr, 2)
			checkEvent(t, m.Event, arr[1], lim)
		case *AuthMessage:
			require.Len(t, arr, 2)
			checkEvent(t, m.Event, arr[1], lim)
		case *ReqMessage:
			require.Len(t, arr, 2+len(m.Filters))
			checkFilters(t, m.Filters)
		case *CountMessage:
			require.Len(t, arr, 2+len(m.Filters))
			checkFilters(t, m.Filters)
		case *CloseMessage:
			require.Len(t, arr, 2)
			require.NotEmpty(t, m.SubID)
		default:
			t.Fatalf("unexpected message %T", m)
		}
	})
}

// checkEvent verifies an accepted event against encoding/json's reading of
// the same bytes, then checks the marshal/parse round trip.
func checkEvent(t *testing.T, ev *Event, raw json.RawMessage, lim Limits) {
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var obj map[string]any
	require.NoError(t, dec.Decode(&obj))
	require.Equal(t, ev.ID, obj["id"])
	require.Equal(t, ev.PubKey, obj["pubkey"])
	require.Equal(t, ev.Sig, obj["sig"])
	require.Equal(t, ev.Content, obj["content"])
	require.Equal(t, json.Number(strconv.FormatInt(ev.CreatedAt, 10)), obj["created_at"])
	require.Equal(t, json.Number(strconv.Itoa(ev.Kind)), obj["kind"])
	stdTags := obj["tags"].([]any)
	require.Len(t, ev.Tags, len(stdTags))
	for i, tag := range stdTags {
		require.Len(t, ev.Tags[i], len(tag.([]any)))
		for j, v := range tag.([]any) {
			require.Equal(t, ev.Tags[i][j], v)
		}
	}

	out, err := ev.MarshalJSON()
	require.NoError(t, err)
	require.True(t, json.Valid(out))
	back, err := ParseEvent(out, lim)
	require.NoError(t, err)
	require.Equal(t, ev, back)
	require.Equal(t, ev.ComputeID(), back.ComputeID())
	require.True(t, json.Valid(ev.Serialize()))
}

func checkFilters(t *testing.T, fs Filters) {
	for i := range fs {
		out, err := fs[i].MarshalJSON()
		require.NoError(t, err)
		require.True(t, json.Valid(out))
		var back Filter
		require.NoError(t, back.UnmarshalJSON(out), string(out))
		require.Equal(t, fs[i], back)
	}
}

func FuzzFilterUnmarshal(f *testing.F) {
	for _, s := range fuzzFilterSeeds {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		var fl Filter
		if err := fl.UnmarshalJSON(data); err != nil {
			require.Equal(t, Filter{}, fl)
			return
		}
		require.True(t, json.Valid(data), "accepted invalid JSON")
		var obj map[string]json.RawMessage
		require.NoError(t, json.Unmarshal(data, &obj))
		n := len(fl.Tags)
		for _, present := range []bool{fl.IDs != nil, fl.Authors != nil, fl.Kinds != nil,
			fl.Since != nil, fl.Until != nil, fl.Limit != nil} {
			if present {
				n++
			}
		}
		for _, key := range []string{"search", "agent_owner"} {
			if _, ok := obj[key]; ok {
				n++
			}
		}
		require.Equal(t, len(obj), n, "every key was understood exactly once")

		checkFilters(t, Filters{fl})
		// Matching never panics, whatever the filter holds.
		fl.Matches(&Event{Tags: Tags{{"e"}, {"e", "x"}}})
	})
}

// FuzzCompactStoredTags: tags printed the way PostgreSQL prints a jsonb
// array (", " between elements, appendQuoted's escapes inside strings)
// compact to exactly what appendTags makes, whatever the strings hold; any
// other input, however broken, is copied without a panic.
func FuzzCompactStoredTags(f *testing.F) {
	f.Add("t", "go", "  a, b  ")
	f.Add(`"`, `\`, "\x1f\n\t")
	f.Add(`", "`, `\", \"`, "[\"x\", \"y\"]")
	f.Add("café 🐝", "\u2028", "")
	f.Fuzz(func(t *testing.T, a, b, c string) {
		appendCompactJSON(nil, []byte(a+b+c))
		tags := Tags{{a, b}, {c}, {a, c, b}}
		printed := []byte{'['}
		for i, tag := range tags {
			if i > 0 {
				printed = append(printed, ", "...)
			}
			printed = append(printed, '[')
			for j, v := range tag {
				if j > 0 {
					printed = append(printed, ", "...)
				}
				printed = appendQuoted(printed, v)
			}
			printed = append(printed, ']')
		}
		printed = append(printed, ']')
		require.Equal(t, string(appendTags(nil, tags)), string(appendCompactJSON(nil, printed)))
	})
}
