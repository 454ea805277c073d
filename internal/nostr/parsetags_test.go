package nostr

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestParseTagsAgreesWithEncodingJSON(t *testing.T) {
	t.Parallel()
	for _, in := range []string{
		`[]`,
		`[["t","go"]]`,
		`[["p","ab","wss://relay.example","mention"],["e","cd"]]`,
		// PostgreSQL's jsonb text: a space after each comma, control
		// characters as \u escapes, everything else verbatim.
		`[["t", "go"], ["subject", "quote \" backslash \\ tab \t nul-ish \u001f"], ["emoji", "café 🐝"]]`,
		` [ [ "a" , "\u00e9\ud83d\udc1d" ] ] `,
	} {
		got, err := ParseTags([]byte(in))
		require.NoError(t, err, in)
		var want Tags
		require.NoError(t, json.Unmarshal([]byte(in), &want), in)
		require.Equal(t, want, got, in)
		require.NotNil(t, got, "an empty array is an empty, non-nil Tags, as encoding/json gives")
	}
}

func TestParseTagsKeepsTagsApart(t *testing.T) {
	t.Parallel()
	tags, err := ParseTags([]byte(`[["a","1"],["b","2"]]`))
	require.NoError(t, err)
	_ = append(tags[0], "x") // must not overwrite tags[1]
	require.Equal(t, Tag{"b", "2"}, tags[1])
}

func TestParseTagsRejectsWhatEventsMayNotHold(t *testing.T) {
	t.Parallel()
	for _, in := range []string{
		``, `{}`, `[`, `[[]]`, `[["t",1]]`, `[["t","x"]] trailing`, `["t","x"]`, `[["t","x"],]`,
		"[[\"t\",\"\xff\"]]", `[["t","\ud800"]]`,
	} {
		_, err := ParseTags([]byte(in))
		require.Error(t, err, "%q", in)
	}
}
