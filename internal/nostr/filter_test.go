package nostr

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

func ptr[T any](v T) *T { return &v }

func TestFilterUnmarshalValid(t *testing.T) {
	tests := []struct {
		name string
		in   string
		want Filter
	}{
		{"empty", `{}`, Filter{}},
		{"whitespace", " \n{ \t} \r\n", Filter{}},
		{"ids", `{"ids":["` + hexA + `"]}`, Filter{IDs: []string{hexA}}},
		{"authors", `{"authors":["` + hexA + `","` + hexB + `"]}`, Filter{Authors: []string{hexA, hexB}}},
		{"kinds", `{"kinds":[0,1,65535]}`, Filter{Kinds: []int{0, 1, 65535}}},
		{"empty arrays kept non-nil", `{"ids":[],"authors":[],"kinds":[],"#e":[]}`,
			Filter{IDs: []string{}, Authors: []string{}, Kinds: []int{}, Tags: map[string][]string{"e": {}}}},
		{"tags", `{"#e":["x","y"],"#P":["` + hexA + `"]}`, Filter{Tags: map[string][]string{"e": {"x", "y"}, "P": {hexA}}}},
		{"since until", `{"since":0,"until":1700000000}`, Filter{Since: ptr[int64](0), Until: ptr[int64](1700000000)}},
		{"limit zero", `{"limit":0}`, Filter{Limit: ptr(0)}},
		{"limit big", `{"limit":9223372036854775807}`, Filter{Limit: ptr(int(^uint(0) >> 1))}},
		{"search", `{"search":"best nostr apps"}`, Filter{Search: "best nostr apps"}},
		{"escaped key", `{"\u006binds":[1]}`, Filter{Kinds: []int{1}}},
		{"escaped hex value", `{"ids":["\u0061` + hexA[1:] + `"]}`, Filter{IDs: []string{hexA}}},
		{"unicode tag value", `{"#t":["日本","\ud83e\udd19"]}`, Filter{Tags: map[string][]string{"t": {"日本", "🤙"}}}},
		{"everything", `{"ids":["` + hexA + `"],"authors":["` + hexB + `"],"kinds":[1],"#e":["` + hexC + `"],"since":1,"until":2,"limit":3,"search":"q"}`,
			Filter{IDs: []string{hexA}, Authors: []string{hexB}, Kinds: []int{1}, Tags: map[string][]string{"e": {hexC}},
				Since: ptr[int64](1), Until: ptr[int64](2), Limit: ptr(3), Search: "q"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var f Filter
			require.NoError(t, json.Unmarshal([]byte(tt.in), &f))
			require.Equal(t, tt.want, f)

			// Marshal and re-parse gives the same filter.
			raw, err := f.MarshalJSON()
			require.NoError(t, err)
			var back Filter
			require.NoError(t, back.UnmarshalJSON(raw), string(raw))
			require.Equal(t, f, back)
		})
	}
}

func TestFilterUnmarshalInvalid(t *testing.T) {
	tests := []struct{ in, err string }{
		{``, "unexpected end of input"},
		{`[]`, "filter must be a JSON object"},
		{`null`, "filter must be a JSON object"},
		{`"x"`, "filter must be a JSON object"},
		{`{`, "unexpected end"},
		{`{}x`, "unexpected data after end"},
		{`{"ids":["` + hexA[:63] + `"]}`, "ids must be 64-char lowercase hex"},
		{`{"ids":["` + strings.ToUpper(hexA) + `"]}`, "ids must be 64-char lowercase hex"},
		{`{"ids":["abcd"]}`, "ids must be 64-char lowercase hex"},
		{`{"ids":"` + hexA + `"}`, "ids must be 64-char lowercase hex"},
		{`{"ids":null}`, "ids must be 64-char lowercase hex"},
		{`{"ids":[1]}`, "ids must be 64-char lowercase hex"},
		{`{"authors":["` + hexA + `x"]}`, "authors must be 64-char lowercase hex"},
		{`{"authors":["` + hexA[:60] + `"]}`, "authors must be 64-char lowercase hex"},
		{`{"kinds":[-1]}`, "kinds must be integers between 0 and 65535"},
		{`{"kinds":[65536]}`, "kinds must be integers between 0 and 65535"},
		{`{"kinds":[1.5]}`, "kinds must be integers between 0 and 65535"},
		{`{"kinds":[1e2]}`, "kinds must be integers between 0 and 65535"},
		{`{"kinds":["1"]}`, "kinds must be integers between 0 and 65535"},
		{`{"kinds":1}`, "kinds must be integers between 0 and 65535"},
		{`{"since":-1}`, "since must be a non-negative integer"},
		{`{"since":1.5}`, "since must be a non-negative integer"},
		{`{"since":"1"}`, "since must be a non-negative integer"},
		{`{"since":99999999999999999999}`, "since must be a non-negative integer"},
		{`{"until":null}`, "until must be a non-negative integer"},
		{`{"limit":-5}`, "limit must be a non-negative integer"},
		{`{"limit":10.0}`, "limit must be a non-negative integer"},
		{`{"search":1}`, "search must be a string"},
		{`{"#e":"x"}`, "#e must be an array of strings"},
		{`{"#e":[1]}`, "#e must be an array of strings"},
		{`{"#e":[null]}`, "#e must be an array of strings"},
		{`{"#ee":["x"]}`, `tag filter "#ee" must be # followed by one ASCII letter`},
		{`{"#":["x"]}`, `tag filter "#" must be # followed by one ASCII letter`},
		{`{"#1":["x"]}`, `tag filter "#1" must be # followed by one ASCII letter`},
		{`{"#é":["x"]}`, `tag filter "#é" must be # followed by one ASCII letter`},
		{`{"e":["x"]}`, `unknown filter field "e"`},
		{`{"foo":1}`, `unknown filter field "foo"`},
		{`{"IDS":[]}`, `unknown filter field "IDS"`},
		{`{"kinds":[1],"kinds":[2]}`, `duplicate filter field "kinds"`},
		{`{"#e":[],"#e":["x"]}`, `duplicate filter field "#e"`},
		{`{"ids":[],}`, "malformed JSON"},
		{`{"ids" []}`, "malformed JSON"},
		{`{'ids':[]}`, "malformed JSON"},
		{`{"#e":["a` + "\x01" + `"]}`, "control character in string"},
		{`{"#e":["\ud800"]}`, "lone surrogate"},
		{`{"#e":["` + "\xff" + `"]}`, "invalid UTF-8"},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			var f Filter
			err := f.UnmarshalJSON([]byte(tt.in))
			require.ErrorContains(t, err, tt.err)
			require.Equal(t, Filter{}, f, "filter untouched on error")
		})
	}
}

func TestFilterLimits(t *testing.T) {
	lim := Limits{MaxFilterValues: 3, MaxTagValueLen: 4, MaxSearchBytes: 5}
	parse := func(s string) error {
		_, err := ParseClientMessage([]byte(`["REQ","s",`+s+`]`), lim)
		return err
	}
	require.NoError(t, parse(`{"kinds":[1,2],"#e":["abcd"]}`))
	require.ErrorContains(t, parse(`{"kinds":[1,2],"#e":["a","b"]}`), "too many values in filter (max 3)")
	require.ErrorContains(t, parse(`{"ids":["`+hexA+`","`+hexA+`","`+hexA+`","`+hexA+`"]}`), "too many values in filter (max 3)")
	require.ErrorContains(t, parse(`{"#e":["abcde"]}`), "#e value too long (max 4 bytes)")
	require.ErrorContains(t, parse(`{"#t":["a\u0000b"]}`), "#t values must not contain NUL characters")
	require.ErrorContains(t, parse(`{"search":"a\u0000b"}`), "search must not contain NUL characters")
	require.NoError(t, parse(`{"search":"a b c"}`))
	require.ErrorContains(t, parse(`{"search":"a b cd"}`), "search too long (max 5 bytes)")
	// The budget is per filter.
	require.NoError(t, parse(`{"kinds":[1,2,3]},{"kinds":[1,2,3]}`))
}

func TestFilterMatches(t *testing.T) {
	ev := &Event{
		ID: hexA, PubKey: hexB, CreatedAt: 100, Kind: 1,
		Tags: Tags{{"e", "x1"}, {"e", "x2", "relay"}, {"p", hexC}, {"t"}, {"T", "Nostr"}},
	}
	tests := []struct {
		name string
		f    Filter
		want bool
	}{
		{"empty filter matches all", Filter{}, true},
		{"id", Filter{IDs: []string{hexC, hexA}}, true},
		{"id miss", Filter{IDs: []string{hexC}}, false},
		{"empty ids match nothing", Filter{IDs: []string{}}, false},
		{"author", Filter{Authors: []string{hexB}}, true},
		{"author miss", Filter{Authors: []string{hexA}}, false},
		{"empty authors match nothing", Filter{Authors: []string{}}, false},
		{"kind", Filter{Kinds: []int{0, 1}}, true},
		{"kind miss", Filter{Kinds: []int{7}}, false},
		{"empty kinds match nothing", Filter{Kinds: []int{}}, false},
		{"since inclusive", Filter{Since: ptr[int64](100)}, true},
		{"since after", Filter{Since: ptr[int64](101)}, false},
		{"until inclusive", Filter{Until: ptr[int64](100)}, true},
		{"until before", Filter{Until: ptr[int64](99)}, false},
		{"since>until", Filter{Since: ptr[int64](101), Until: ptr[int64](99)}, false},
		{"tag OR within key", Filter{Tags: map[string][]string{"e": {"zz", "x2"}}}, true},
		{"tag second-position value only", Filter{Tags: map[string][]string{"e": {"relay"}}}, false},
		{"tag AND across keys", Filter{Tags: map[string][]string{"e": {"x1"}, "p": {hexC}}}, true},
		{"tag AND one fails", Filter{Tags: map[string][]string{"e": {"x1"}, "p": {hexA}}}, false},
		{"tag key case-sensitive", Filter{Tags: map[string][]string{"t": {"Nostr"}}}, false},
		{"uppercase tag", Filter{Tags: map[string][]string{"T": {"Nostr"}}}, true},
		{"tag value case-sensitive", Filter{Tags: map[string][]string{"T": {"nostr"}}}, false},
		{"tag without value never matches", Filter{Tags: map[string][]string{"t": {""}}}, false},
		{"empty tag values match nothing", Filter{Tags: map[string][]string{"e": {}}}, false},
		{"limit and search ignored", Filter{Limit: ptr(0), Search: "nothing like it"}, true},
		{"all conditions", Filter{IDs: []string{hexA}, Authors: []string{hexB}, Kinds: []int{1},
			Since: ptr[int64](100), Until: ptr[int64](100), Tags: map[string][]string{"e": {"x1"}}}, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			require.Equal(t, tt.want, tt.f.Matches(ev))
		})
	}

	require.False(t, Filters{}.Matches(ev))
	require.True(t, Filters{{Kinds: []int{7}}, {Authors: []string{hexB}}}.Matches(ev))
	require.False(t, Filters{{Kinds: []int{7}}, {Authors: []string{hexA}}}.Matches(ev))
}

func TestFilterMarshal(t *testing.T) {
	f := Filter{
		Kinds: []int{1, 7}, Authors: []string{hexA},
		Tags:  map[string][]string{"p": {hexB}, "e": {"a<&>\"b"}, "t": nil},
		Since: ptr[int64](5), Limit: ptr(10), Search: "x",
	}
	raw, err := f.MarshalJSON()
	require.NoError(t, err)
	require.Equal(t, `{"authors":["`+hexA+`"],"kinds":[1,7],"#e":["a<&>\"b"],"#p":["`+hexB+`"],"#t":[],"since":5,"limit":10,"search":"x"}`, string(raw))
	require.Equal(t, `{}`, string((&Filter{}).AppendJSON(nil)))
}

// A long tag list is matched through the set IndexTags builds, and agrees
// with the scan it replaces. Scanning cost tags x values per match: 1,999
// values against an event of 2,000 such tags took 20 ms, on every relay's
// fan-out. Mutation killed: Matches ignoring tagSets (the list, emptied
// after indexing, no longer matches).
func TestIndexedTagsMatchLikeTheScan(t *testing.T) {
	vals := make([]string, 100)
	for i := range vals {
		vals[i] = fmt.Sprintf("v%d", i)
	}
	for _, tags := range []Tags{
		{{"t", "v99"}},
		{{"t", "x"}, {"t", "v0"}},
		{{"t", "x"}, {"e", "v5"}},
		{},
		{{"t"}, {"t", "v100"}},
	} {
		ev := &Event{Kind: 1, Tags: tags}
		scanned := &Filter{Tags: map[string][]string{"t": vals}}
		indexed := &Filter{Tags: map[string][]string{"t": vals}}
		indexed.IndexTags()
		require.Equal(t, scanned.Matches(ev), indexed.Matches(ev), "%v", tags)
	}

	f := &Filter{Tags: map[string][]string{"t": vals}}
	f.IndexTags()
	f.Tags["t"] = []string{"nothing"}
	require.True(t, f.Matches(&Event{Kind: 1, Tags: Tags{{"t", "v50"}}}), "an indexed list is matched through its set")

	short := &Filter{Tags: map[string][]string{"t": vals[:tagSetMin]}}
	short.IndexTags()
	require.Nil(t, short.tagSets, "a short list is scanned")
}

// FuzzIndexedTagsMatchLikeTheScan: for any event tags and any filter tag
// list (padded past tagSetMin, so IndexTags builds a set), the set's answer
// is the scan's. tags is "name=value" pairs separated by ";", a pair
// without "=" being a tag with a name only.
func FuzzIndexedTagsMatchLikeTheScan(f *testing.F) {
	f.Add("v1,v2", "t=v2", "t")
	f.Add("a,b", "t=x;e=a;t", "e")
	f.Add("", "=;t=", "")
	f.Add("x,x,x", "p=x;p=y", "p")
	f.Fuzz(func(t *testing.T, values, tags, name string) {
		vals := strings.Split(values, ",")
		for i := 0; len(vals) <= tagSetMin; i++ {
			vals = append(vals, fmt.Sprintf("pad%d", i))
		}
		ev := &Event{Kind: 1}
		for _, pair := range strings.Split(tags, ";") {
			if k, v, ok := strings.Cut(pair, "="); ok {
				ev.Tags = append(ev.Tags, Tag{k, v})
			} else {
				ev.Tags = append(ev.Tags, Tag{k})
			}
		}
		scanned := &Filter{Tags: map[string][]string{name: vals}}
		indexed := &Filter{Tags: map[string][]string{name: slices.Clone(vals)}}
		indexed.IndexTags()
		require.Equal(t, scanned.Matches(ev), indexed.Matches(ev), "values %q, tags %v", vals, ev.Tags)
	})
}
