package template

import (
	"encoding/hex"
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/buzzrelay/buzz/internal/nostr"
)

const alicePubkey = "7e7e9c42a91bfef19fa929e5fda1b72e0ebc1a4c1141673e2794234d86addf4e"

func testContext() Context {
	return Context{
		Trigger: map[string]string{
			"text":       "hello {{trigger.author}} wörld",
			"author":     alicePubkey,
			"channel_id": "0b6f7c1e-7e1b-4b8a-9d0c-3c2a1f0e9d8c",
			"empty":      "",
			"quote":      `say "hi" <b>&</b>`,
		},
		Steps: map[string]map[string]any{
			"call": {
				"body":   "payload",
				"status": float64(200),
				"ratio":  1.5,
				"ok":     true,
				"none":   nil,
				"list":   []any{"a", float64(1), nil},
				"obj":    map[string]any{"k": "<v>"},
				"num":    json.Number("12345678901234567890"),
			},
		},
	}
}

func TestRender(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name, text, want string
	}{
		{"no placeholders", "plain text", "plain text"},
		{"trigger field", "by {{trigger.author}}", "by " + alicePubkey},
		{"spaces inside braces", "{{  trigger.channel_id  }}", "0b6f7c1e-7e1b-4b8a-9d0c-3c2a1f0e9d8c"},
		{"empty value renders empty", "[{{trigger.empty}}]", "[]"},
		{"single pass: a value's placeholders stay literal", "{{trigger.text}}", "hello {{trigger.author}} wörld"},
		{"unknown trigger field stays literal", "x {{trigger.nope}} y", "x {{trigger.nope}} y"},
		{"unknown root stays literal", "{{ env.HOME }}", "{{ env.HOME }}"},
		{"unknown step stays literal", "{{steps.other.output.body}}", "{{steps.other.output.body}}"},
		{"unknown step field stays literal", "{{steps.call.output.missing}}", "{{steps.call.output.missing}}"},
		{"step path without output stays literal", "{{steps.call.body}}", "{{steps.call.body}}"},
		{"unknown variable with filter stays literal", "{{trigger.nope | json}}", "{{trigger.nope | json}}"},
		{"unclosed braces kept", "a {{trigger.text", "a {{trigger.text"},
		{"unclosed after a good one", "{{trigger.empty}}x{{ trigger.author", "x{{ trigger.author"},
		{"nested open: first is text", "{{ a {{trigger.empty}}!", "{{ a !"},
		{"lone closing braces", "}} {{trigger.empty}} }}", "}}  }}"},
		{"adjacent placeholders", "{{trigger.empty}}{{steps.call.output.body}}", "payload"},
		{"step string", "{{steps.call.output.body}}", "payload"},
		{"step integer number", "{{steps.call.output.status}}", "200"},
		{"step fractional number", "{{steps.call.output.ratio}}", "1.5"},
		{"step json.Number kept exactly", "{{steps.call.output.num}}", "12345678901234567890"},
		{"step bool", "{{steps.call.output.ok}}", "true"},
		{"step null is empty", "[{{steps.call.output.none}}]", "[]"},
		{"step array as compact json", "{{steps.call.output.list}}", `["a",1,null]`},
		{"step object as compact json without html escaping", "{{steps.call.output.obj}}", `{"k":"<v>"}`},
		{"truncate counts characters", "{{trigger.text | truncate(7)}}", "hello {"},
		{"truncate never splits a character", "{{trigger.text | truncate(28)}}", "hello {{trigger.author}} wör"},
		{"truncate longer than value", "{{steps.call.output.body|truncate(100)}}", "payload"},
		{"truncate zero", "[{{steps.call.output.body | truncate(0)}}]", "[]"},
		{"truncate with spaces in args", "{{steps.call.output.body | truncate( 3 )}}", "pay"},
		{"npub encodes a hex pubkey", "{{trigger.author | npub}}", "npub10elfcs4fr0l0r8af98jlmgdh9c8tcxjvz9qkw038js35mp4dma8qzvjptg"},
		{"truncate_pubkey is npub", "{{trigger.author | truncate_pubkey}}", "npub10elfcs4fr0l0r8af98jlmgdh9c8tcxjvz9qkw038js35mp4dma8qzvjptg"},
		{"npub passes other values through", "{{steps.call.output.body | npub}}", "payload"},
		{"npub passes 64 non-hex through", "{{trigger.text | truncate(64) | npub}}", "hello {{trigger.author}} wörld"},
		{"json quotes and escapes", "{{trigger.quote | json}}", `"say \"hi\" <b>&</b>"`},
		{"filters chain left to right", "{{trigger.author | npub | truncate(8)}}", "npub10el"},
		{"json of a number", "{{steps.call.output.status | json}}", `"200"`},
	}
	ctx := testContext()
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			got, err := Render(tc.text, ctx)
			require.NoError(t, err)
			require.Equal(t, tc.want, got)
			require.NoError(t, Validate(tc.text))
		})
	}
}

func TestRenderAndValidateRejectBadFilters(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name, text, wantReason string
	}{
		{"unknown filter", "{{trigger.text | upper}}", `unknown filter "upper"`},
		{"unknown filter on unknown variable", "{{trigger.nope | upper}}", `unknown filter "upper"`},
		{"empty filter", "{{trigger.text | }}", "empty filter"},
		{"truncate without length", "{{trigger.text | truncate}}", "needs a length"},
		{"truncate negative", "{{trigger.text | truncate(-1)}}", "non-negative integer"},
		{"truncate not a number", "{{trigger.text | truncate(ten)}}", "non-negative integer"},
		{"truncate unclosed paren", "{{trigger.text | truncate(3}}", "missing closing parenthesis"},
		{"npub with args", "{{trigger.author | npub(1)}}", "takes no arguments"},
		{"json with args", "{{trigger.author | json()}}", "takes no arguments"},
		{"filter names are case sensitive", "{{trigger.text | JSON}}", `unknown filter "JSON"`},
		{"bad filter after good text", "ok {{trigger.text}} then {{trigger.text|x}}", `unknown filter "x"`},
	}
	ctx := testContext()
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			_, err := Render(tc.text, ctx)
			var terr *Error
			require.True(t, errors.As(err, &terr), "want *template.Error, got %v", err)
			require.Contains(t, terr.Reason, tc.wantReason)

			err = Validate(tc.text)
			require.True(t, errors.As(err, &terr), "Validate: want *template.Error, got %v", err)
			require.Contains(t, terr.Reason, tc.wantReason)
		})
	}
}

func TestRenderErrorNeverContainsValues(t *testing.T) {
	t.Parallel()
	ctx := Context{Trigger: map[string]string{"secret": "s3cr3t-value"}}
	_, err := Render("{{trigger.secret | nope}}", ctx)
	require.Error(t, err)
	require.NotContains(t, err.Error(), "s3cr3t-value")
}

func TestEncodeNpubVectors(t *testing.T) {
	t.Parallel()
	// Expected values computed with nostr-tools' nip19.npubEncode.
	cases := []struct{ hex, npub string }{
		{alicePubkey, "npub10elfcs4fr0l0r8af98jlmgdh9c8tcxjvz9qkw038js35mp4dma8qzvjptg"},
		{strings.Repeat("00", 32), "npub1qqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqzqujme"},
		{strings.Repeat("ff", 32), "npub1lllllllllllllllllllllllllllllllllllllllllllllllllllsq7lrjw"},
	}
	for _, tc := range cases {
		key, err := hex.DecodeString(tc.hex)
		require.NoError(t, err)
		require.Equal(t, tc.npub, nostr.EncodeNpub(key))
		upper, err := Render("{{trigger.k|npub}}", Context{Trigger: map[string]string{"k": strings.ToUpper(tc.hex)}})
		require.NoError(t, err)
		require.Equal(t, tc.npub, upper, "upper-case hex is a pubkey too")
	}
}

func TestValueString(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name string
		in   any
		want string
	}{
		{"nil", nil, ""},
		{"string", "a\"b", "a\"b"},
		{"false", false, "false"},
		{"float", 0.25, "0.25"},
		{"big float", 1e21, "1e+21"},
		{"int", 7, "7"},
		{"nested", map[string]any{"b": []any{true}, "a": "&"}, `{"a":"&","b":[true]}`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			got, err := ValueString(tc.in)
			require.NoError(t, err)
			require.Equal(t, tc.want, got)
		})
	}
}

// Expand hands every well-formed placeholder to the caller with its
// filtered value, or found=false for a variable that does not exist, and
// parses exactly as Render: an unclosed "{{" is text, a bad filter an
// error.
func TestExpand(t *testing.T) {
	t.Parallel()
	type call struct {
		path, value string
		found       bool
	}
	var calls []call
	out, err := Expand("a {{trigger.text | truncate(5)}} b {{ trigger.nope }} c {{steps.call.output.status}} {{ open", testContext(),
		func(path, value string, found bool) string {
			calls = append(calls, call{path, value, found})
			return "<" + path + ">"
		})
	require.NoError(t, err)
	require.Equal(t, "a <trigger.text> b <trigger.nope> c <steps.call.output.status> {{ open", out)
	require.Equal(t, []call{
		{"trigger.text", "hello", true},
		{"trigger.nope", "", false},
		{"steps.call.output.status", "200", true},
	}, calls)
	_, err = Expand("{{trigger.text | shout}}", testContext(), func(string, string, bool) string { return "" })
	var te *Error
	require.ErrorAs(t, err, &te)
}
