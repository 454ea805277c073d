// Package mention finds which channel members a workflow message wakes.
//
// A relay-signed workflow message may only wake agents the workflow's owner
// named in the signed, unrendered template text. Values filled in at run time
// (message text, webhook data, step output) are never scanned, so a stranger
// cannot make the relay wake another agent by writing "@Name" into them.
//
// Matching rules, chosen so that a mention is unambiguous and hard to trip
// by accident:
//   - candidates are the members with a non-empty display name;
//   - a mention is "@" at the start of the text or after whitespace or "(",
//     so "mail@Robby" and "@Sam@Robby" (second "@") wake nobody extra;
//   - comparison is case-insensitive; both sides are lowercased one
//     character at a time, which keeps offsets in the original text even
//     where full-string lowercasing would change the length ("İ");
//   - longer names are tried first and a match consumes its span, so
//     "@Sam Smith" wakes Sam Smith and not Sam;
//   - the name must not run on into a letter, digit or "_", so member "Rob"
//     is not woken by "@Robby";
//   - a name that two different pubkeys share wakes nobody: the owner could
//     not have meant both, and guessing would wake the wrong agent;
//   - results are unique, in order of first appearance, without the owner.
package mention

import (
	"slices"
	"strings"
	"unicode"
)

// Member is a channel member who may be woken. Callers pass the members of
// the workflow's channel only: people outside it are never candidates.
type Member struct {
	Pubkey      string
	DisplayName string
}

// candidate is a display name that belongs to exactly one pubkey.
type candidate struct {
	folded []rune
	pubkey string
}

// MaxNameRunes is the longest display name a mention can name. Longer
// names are never candidates: a template is scanned once per "@", each
// time as far as the longest name reaches, so the names' length bounds
// that work (see Resolve).
const MaxNameRunes = 128

// Resolve returns the pubkeys of the members mentioned in template, owner
// excluded.
//
// The names are kept in a trie: at each "@" the text is walked once,
// at most MaxNameRunes runes, and the longest name that ends at a name
// boundary wins. Trying every member's name at every "@" cost
// members x mentions comparisons: a template of 30,000 "@" (any member may
// save one) in a channel of 10,000 members took seconds of CPU per run.
func Resolve(template string, members []Member, owner string) []string {
	woken, _ := resolve(template, members, owner)
	return woken
}

// trieNode is one rune of the candidates' folded names; pubkey is set
// where a name ends.
type trieNode struct {
	next   map[rune]*trieNode
	pubkey string
}

// resolve is Resolve, also reporting the runes it walked (the work the
// trie bounds).
func resolve(template string, members []Member, owner string) ([]string, int) {
	candidates := uniqueNames(members)
	if len(candidates) == 0 {
		return nil, 0
	}
	root := &trieNode{}
	for _, c := range candidates {
		node := root
		for _, r := range c.folded {
			if node.next == nil {
				node.next = map[rune]*trieNode{}
			}
			child := node.next[r]
			if child == nil {
				child = &trieNode{}
				node.next[r] = child
			}
			node = child
		}
		node.pubkey = c.pubkey
	}
	text := []rune(template)
	folded := foldRunes(text)

	var woken []string
	walked := 0
	for i := 0; i < len(text); i++ {
		if text[i] != '@' || !leftBoundary(text, i) {
			continue
		}
		// The longest name that matches and does not run on into a
		// letter, digit or "_" (a shorter one may, where a longer fails).
		end, pubkey := -1, ""
		node := root
		for j := i + 1; j < len(folded); j++ {
			walked++
			if node = node.next[folded[j]]; node == nil {
				break
			}
			if node.pubkey != "" && (j+1 >= len(text) || !continuesName(text[j+1])) {
				end, pubkey = j+1, node.pubkey
			}
		}
		if end < 0 {
			continue
		}
		if pubkey != owner && !slices.Contains(woken, pubkey) {
			woken = append(woken, pubkey)
		}
		i = end - 1 // the loop's i++ resumes right after the name
	}
	return woken, walked
}

// MaxCandidates is how many distinct candidates Candidates hands out at
// most. A template of a few mentions yields tens of them (one per word end
// and per space within MaxNameRunes of each "@"); one crowded with "@"s
// before varied punctuation could yield millions, and looking each up
// would cost more than reading the channel's members.
const MaxCandidates = 4096

// maxCandidateRunes bounds the runes of all candidates Candidates looks
// at, repeated ones included (each is hashed to find it is a repeat):
// 30,000 "@"s in a periodic template yield few distinct candidates but
// millions of repeats.
const maxCandidateRunes = MaxCandidates * MaxNameRunes

// Candidates returns, folded as the mention rules fold, every string a
// member's display name would have to equal for Resolve to wake that
// member: at each "@" that may start a mention, each run of the folded
// text after it of at most MaxNameRunes runes that ends at a name
// boundary. A member whose folded name is not among them takes no part in
// Resolve (wakes nobody, and makes no name ambiguous), so a caller may
// pass Resolve only those members. ok is false when there are more than
// MaxCandidates distinct candidates, or more than maxCandidateRunes runes
// of them in all: the caller passes every member.
func Candidates(template string) (candidates []string, ok bool) {
	text := []rune(template)
	// The folded text as one string, and where each rune starts in it, so
	// that a candidate is a substring (a repeat allocates nothing).
	var sb strings.Builder
	starts := make([]int, len(text)+1)
	for i, r := range foldRunes(text) {
		starts[i] = sb.Len()
		sb.WriteRune(r)
	}
	starts[len(text)] = sb.Len()
	folded := sb.String()
	seen := map[string]bool{}
	runes := 0
	for i := range text {
		if text[i] != '@' || !leftBoundary(text, i) {
			continue
		}
		for end := i + 2; end <= min(len(text), i+1+MaxNameRunes); end++ {
			if end < len(text) && continuesName(text[end]) {
				continue
			}
			if runes += end - i - 1; runes > maxCandidateRunes {
				return nil, false
			}
			name := folded[starts[i+1]:starts[end]]
			if seen[name] {
				continue
			}
			if len(seen) == MaxCandidates {
				return nil, false
			}
			seen[name] = true
			candidates = append(candidates, name)
		}
	}
	return candidates, true
}

// Fold lowercases s one character at a time, as the mention rules
// compare: the form Candidates returns, and the form the database's
// mention_fold function computes from a display name.
func Fold(s string) string { return string(foldRunes([]rune(s))) }

// uniqueNames folds every display name of at most MaxNameRunes runes and
// drops names shared by different pubkeys: such a name wakes nobody.
func uniqueNames(members []Member) []candidate {
	owners := map[string]string{} // folded name -> pubkey, "" when ambiguous
	for _, m := range members {
		if m.DisplayName == "" {
			continue
		}
		runes := []rune(m.DisplayName)
		if len(runes) > MaxNameRunes {
			continue
		}
		name := string(foldRunes(runes))
		if prev, seen := owners[name]; seen && prev != m.Pubkey {
			owners[name] = ""
			continue
		}
		owners[name] = m.Pubkey
	}
	var out []candidate
	for name, pubkey := range owners {
		if pubkey != "" {
			out = append(out, candidate{folded: []rune(name), pubkey: pubkey})
		}
	}
	return out
}

// foldRunes lowercases each character on its own, so the result has exactly
// as many characters as the input.
func foldRunes(rs []rune) []rune {
	out := make([]rune, len(rs))
	for i, r := range rs {
		out[i] = unicode.ToLower(r)
	}
	return out
}

func leftBoundary(text []rune, at int) bool {
	if at == 0 {
		return true
	}
	prev := text[at-1]
	return unicode.IsSpace(prev) || prev == '('
}

// continuesName reports whether r would make the name part of a longer
// word: a letter (including the vowel signs and other marks that Unicode
// counts as alphabetic, so "@रामी" is not "@राम"), a number, or "_".
func continuesName(r rune) bool {
	return unicode.IsLetter(r) || unicode.Is(unicode.Other_Alphabetic, r) || unicode.IsNumber(r) || r == '_'
}
