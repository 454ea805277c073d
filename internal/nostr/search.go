package nostr

import (
	"strings"
	"unicode"
	"unicode/utf8"
)

// SearchText is a NIP-50 search string without its extensions, the text a
// full-text query should match. NIP-50 lets a client add key:value pairs
// (two words joined by a colon: include:spam, language:en,
// domain:example.com) and tells relays to ignore the ones they do not
// support; this relay supports none. Searched for as words, they would make
// "orange include:spam" match only notes that also say "include" and
// "spam". A colon that does not join two words (https://example.com, 10:30)
// is left as text. A search of extensions alone has no text left, and
// matches nothing, as a search of blanks does.
func SearchText(search string) string {
	if strings.IndexByte(search, ':') < 0 {
		return search
	}
	words := strings.Fields(search)
	kept := words[:0]
	for _, w := range words {
		if !isSearchExtension(w) {
			kept = append(kept, w)
		}
	}
	return strings.Join(kept, " ")
}

// isSearchExtension reports whether w is a key:value pair: a key of ASCII
// letters, digits, '_' or '-' starting with a letter, a colon, and a value
// starting with a letter or digit.
func isSearchExtension(w string) bool {
	key, value, ok := strings.Cut(w, ":")
	if !ok || key == "" || !isASCIILetter(key[0]) {
		return false
	}
	for i := 1; i < len(key); i++ {
		c := key[i]
		if !isASCIILetter(c) && (c < '0' || c > '9') && c != '_' && c != '-' {
			return false
		}
	}
	r, _ := utf8.DecodeRuneInString(value)
	return unicode.IsLetter(r) || unicode.IsDigit(r)
}
