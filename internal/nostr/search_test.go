package nostr

import (
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/stretchr/testify/require"
)

// Mutations killed: returning the search unchanged (the extensions stay);
// taking any word with a colon for an extension (the URL and the time go).
func TestSearchTextDropsExtensionsOnly(t *testing.T) {
	for in, want := range map[string]string{
		"orange":                               "orange",
		"orange include:spam":                  "orange",
		"language:en orange  nsfw:false":       "orange",
		"best nostr apps domain:example.com":   "best nostr apps",
		"include:spam":                         "",
		"see https://example.com":              "see https://example.com",
		"at 10:30":                             "at 10:30",
		"ratio 1:2 :colon colon: a::b":         "ratio 1:2 :colon colon: a::b",
		`"exact phrase" -word or other`:        `"exact phrase" -word or other`,
		"x-lang:fr café":                       "café",
		"clé:valeur":                           "clé:valeur",
		"key:é":                                "",
		"emoji:😀":                              "emoji:😀",
		"tab\tseparated include:spam\nnewline": "tab separated newline",
	} {
		require.Equal(t, want, SearchText(in), "%q", in)
	}
}

var fuzzSearchSeeds = []string{
	"orange include:spam",
	"https://example.com 10:30",
	"a:b:c d: :e",
	"\u00e9:\u00e9 k:\u00e9",
	"\"quoted include:spam\" -x or y",
	"\xff:\xfe",
}

// The text left is never longer than the search, keeps no extension, is
// what a second pass leaves too, and is valid UTF-8 when the search was.
func FuzzSearchText(f *testing.F) {
	for _, s := range fuzzSearchSeeds {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, search string) {
		got := SearchText(search)
		require.LessOrEqual(t, len(got), len(search))
		require.Equal(t, got, SearchText(got))
		for _, w := range strings.Fields(got) {
			require.False(t, isSearchExtension(w), "%q kept in %q", w, got)
		}
		if utf8.ValidString(search) {
			require.True(t, utf8.ValidString(got))
		}
	})
}

// Links leave the words and become lexemes spelled as a note's text stores
// them: no scheme, lowercased, a prefix unless a host alone; anything else
// with a slash stays a word. Mutations killed: keeping the scheme or the
// case; a host alone as a prefix; taking any word with a slash for a link.
func TestParseSearchSplitsLinks(t *testing.T) {
	for in, want := range map[string]SearchQuery{
		"orange":                              {Text: "orange"},
		"docs https://Example.com/Docs?x=1":   {Text: "docs", Links: `'example.com/docs?x=1':*`},
		"example.com/a /b/c":                  {Links: `'example.com/a':* & '/b/c':*`},
		"https://example.com/ http://x.org":   {Links: `'example.com' & 'x.org'`},
		"and/or 1/2 tcp/ip 1.2.3.4/x":         {Text: "and/or 1/2 tcp/ip 1.2.3.4/x"},
		`"https://x.org/a" -https://y.org/b`:  {Text: `"https://x.org/a" -https://y.org/b`},
		"/ https:// 3x://a/b":                 {Text: "/ https:// 3x://a/b"},
		`https://x.org/it's\`:                 {Links: `'x.org/it''s\\':*`},
		"include:spam https://x.org/a":        {Links: `'x.org/a':*`},
		"example.com":                         {Text: "example.com"},
		"ftp://files.example.net/pub/file.gz": {Links: `'files.example.net/pub/file.gz':*`},
	} {
		require.Equal(t, want, ParseSearch(in), "%q", in)
	}
}
