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

// SearchQuery is a NIP-50 search as PostgreSQL reads it: Text (the words)
// for websearch_to_tsquery, and Links, a tsquery in its own syntax ("" for
// none) that every match must also satisfy.
type SearchQuery struct {
	Text  string
	Links string
}

// ParseSearch splits a search's links from its words. PostgreSQL's
// websearch_to_tsquery cuts a link at its "://", "?" and "=" and finds
// nothing, while a note's text keeps each link as one word, lowercased and
// without its scheme, which also holds whatever follows the link up to a
// blank (a query string, the comma or full stop of a sentence). So each
// link of the search becomes that word, written directly as a prefix
// lexeme: https://example.com/docs finds every note whose link starts with
// example.com/docs, with or without its scheme; a path (/docs/page) finds
// the links and file paths starting with it; a bare host, or a link to one
// (https://example.com/), finds the notes naming that host. A link in
// quotes or after a minus stays with the words (a phrase, an exclusion);
// one next to "or" is still required.
func ParseSearch(search string) SearchQuery {
	text := SearchText(search)
	if strings.IndexByte(text, '/') < 0 {
		return SearchQuery{Text: text}
	}
	words := strings.Fields(text)
	kept := words[:0]
	var links []string
	for _, w := range words {
		if lexeme, ok := linkLexeme(w); ok {
			links = append(links, lexeme)
		} else {
			kept = append(kept, w)
		}
	}
	return SearchQuery{Text: strings.Join(kept, " "), Links: strings.Join(links, " & ")}
}

// maxLexeme is the longest word PostgreSQL accepts in a tsquery (bytes).
const maxLexeme = 2046

// linkLexeme is w as a tsquery lexeme when w is a link: a URL
// (scheme://host/path), a host/path without its scheme, or a /path.
func linkLexeme(w string) (string, bool) {
	if strings.HasPrefix(w, "-") || strings.ContainsRune(w, '"') {
		return "", false
	}
	rest := w
	if scheme, after, ok := strings.Cut(w, "://"); ok {
		if !isURLScheme(scheme) {
			return "", false
		}
		rest = after
	} else if host, _, ok := strings.Cut(w, "/"); !ok || (host != "" && !isHostName(host)) {
		return "", false
	}
	lexeme := strings.ToLower(rest)
	host, path, _ := strings.Cut(lexeme, "/")
	prefix := true
	if host != "" && path == "" { // a host alone is a word of its own in the note
		lexeme, prefix = host, false
	}
	if lexeme == "" || lexeme == "/" || len(lexeme) > maxLexeme {
		return "", false
	}
	quoted := "'" + strings.ReplaceAll(strings.ReplaceAll(lexeme, `\`, `\\`), "'", "''") + "'"
	if prefix {
		quoted += ":*"
	}
	return quoted, true
}

// isURLScheme reports whether s is a URL scheme: a letter, then letters,
// digits, '+', '-' or '.'.
func isURLScheme(s string) bool {
	if s == "" || !isASCIILetter(s[0]) {
		return false
	}
	for i := 1; i < len(s); i++ {
		if c := s[i]; !isASCIILetter(c) && (c < '0' || c > '9') && c != '+' && c != '-' && c != '.' {
			return false
		}
	}
	return true
}

// isHostName reports whether s looks like a DNS name with a top-level
// domain (example.com, www.example.co.uk), as PostgreSQL's parser reads
// one: labels of ASCII letters, digits and '-', the last of letters only.
func isHostName(s string) bool {
	labels := strings.Split(s, ".")
	if len(labels) < 2 {
		return false
	}
	for _, l := range labels {
		if l == "" {
			return false
		}
		for i := 0; i < len(l); i++ {
			if c := l[i]; !isASCIILetter(c) && (c < '0' || c > '9') && c != '-' {
				return false
			}
		}
	}
	for _, c := range []byte(labels[len(labels)-1]) {
		if !isASCIILetter(c) {
			return false
		}
	}
	return true
}
