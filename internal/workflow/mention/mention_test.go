package mention

import (
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

const owner = "owner"

func TestResolve(t *testing.T) {
	t.Parallel()
	m := func(pubkey, name string) Member { return Member{Pubkey: pubkey, DisplayName: name} }
	robby, sam := m("robby", "Robby"), m("sam", "Sam")
	cases := []struct {
		name     string
		template string
		members  []Member
		want     []string
	}{
		{"resolves_exact_member_name", "please look @Robby", []Member{robby, sam}, []string{"robby"}},
		{"matches_case_insensitively", "@rObBY and @SAM", []Member{robby, sam}, []string{"robby", "sam"}},
		{"ignores_non_member_and_bare_at", "@Nobody @ alone, and @", []Member{robby, sam}, nil},
		{"greedy_longest_binds_full_name_not_prefix", "@Sam Smith review", []Member{sam, m("smith", "Sam Smith")}, []string{"smith"}},
		{"at_mid_token_does_not_match", "mail me at me@Robby or x@Sam", []Member{robby, sam}, nil},
		{"prefix_member_does_not_match_inside_longer_word", "@Robby", []Member{m("rob", "Rob")}, nil},
		{"prefix member does not match before a digit or underscore", "@Rob2 @Rob_x", []Member{m("rob", "Rob")}, nil},
		{"name_with_spaces_and_punctuation", "ask (@Lep (Subagent)) now", []Member{m("lep", "Lep (Subagent)"), m("lep2", "Lep")}, []string{"lep"}},
		{"em_dash_terminates_name", "@Robby—thanks", []Member{robby}, []string{"robby"}},
		{"alphabetic vowel sign continues a name", "@रामी", []Member{m("ram", "राम")}, nil},
		{"name in a non-latin script", "(@राम)", []Member{m("ram", "राम")}, []string{"ram"}},
		{"superscript digit continues a name", "@Sam²", []Member{sam}, nil},
		{"punctuation terminates name", "@Robby, @Sam.", []Member{robby, sam}, []string{"robby", "sam"}},
		{"non_ascii_member_name", "hi @ZOË and @zoë", []Member{m("zoe", "Zoë")}, []string{"zoe"}},
		{"lowercase_expansion_does_not_shift_later_mentions", "İİİ @İbo then @Robby", []Member{m("ibo", "İbo"), robby}, []string{"ibo", "robby"}},
		{"sharp_s_matches_case_insensitively", "@STRAUẞ and @ẞ", []Member{m("strauss", "Strauß"), m("eszett", "ß")}, []string{"strauss", "eszett"}},
		{"combining_mark_in_name_matches", "hey @zoe\u0301!", []Member{m("zoe", "Zoe\u0301")}, []string{"zoe"}},
		{"expanding_name_at_trailing_boundary", "ping @kİ", []Member{m("ki", "Kİ")}, []string{"ki"}},
		{"back_to_back_at_is_one_mention", "@Sam@Robby", []Member{robby, sam}, []string{"sam"}},
		{"ambiguous_name_wakes_no_one", "@Alex please", []Member{m("a1", "Alex"), m("a2", "alex"), robby}, nil},
		{"ambiguous shorter name does not block a unique longer one", "@Alex B and @Alex", []Member{m("a1", "Alex"), m("a2", "Alex"), m("ab", "Alex B")}, []string{"ab"}},
		{"duplicate_name_same_pubkey_is_not_ambiguous", "@Robby", []Member{robby, robby}, []string{"robby"}},
		{"dedupes_repeated_mentions_in_first_appearance_order", "@Sam @Robby @Sam @robby", []Member{robby, sam}, []string{"sam", "robby"}},
		{"owner is skipped", "@Boss and @Robby", []Member{m(owner, "Boss"), robby}, []string{"robby"}},
		{"member without display name is no candidate", "@ hello @Robby", []Member{m("blank", ""), robby}, []string{"robby"}},
		{"whitespace boundaries include newline and tab", "x\n@Robby\t@Sam", []Member{robby, sam}, []string{"robby", "sam"}},
		{"mention at end of text", "thanks @Sam", []Member{sam}, []string{"sam"}},
		{"name longer than the rest of the text", "@Sa", []Member{sam}, nil},
		{"a match consumes its span", "@Team @Ops, then @Ops", []Member{m("team", "Team @Ops"), m("ops", "Ops")}, []string{"team", "ops"}},
		{"a consumed span hides a mention inside it", "@Team @Ops", []Member{m("team", "Team @Ops"), m("ops", "Ops")}, []string{"team"}},
		{"no members", "@Robby", nil, nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			require.Equal(t, tc.want, Resolve(tc.template, tc.members, owner))
		})
	}
}

func FuzzResolve(f *testing.F) {
	for _, s := range []string{"@Sam@Robby", "İİ @İbo", "@", "(@Lep (Subagent))", "\xff@\xfe"} {
		f.Add(s, "Sam", "İbo")
	}
	f.Fuzz(func(t *testing.T, template, name1, name2 string) {
		members := []Member{{"a", name1}, {"b", name2}, {"c", name1}, {owner, "Owner"}}
		got := Resolve(template, members, owner)
		seen := map[string]bool{}
		for _, p := range got {
			if p == owner || seen[p] {
				t.Fatalf("owner or duplicate in %v", got)
			}
			seen[p] = true
		}
	})
}

// naiveResolve is the resolver the trie replaced, every candidate tried at
// every "@", longest first: the reference for what a mention wakes.
func naiveResolve(template string, members []Member, owner string) []string {
	candidates := uniqueNames(members)
	text := []rune(template)
	folded := foldRunes(text)
	var woken []string
	for i := 0; i < len(text); i++ {
		if text[i] != '@' || !leftBoundary(text, i) {
			continue
		}
		start := i + 1
		for _, c := range candidates {
			end := start + len(c.folded)
			if end > len(folded) || !slices.Equal(folded[start:end], c.folded) {
				continue
			}
			if end < len(text) && continuesName(text[end]) {
				continue
			}
			if c.pubkey != owner && !slices.Contains(woken, c.pubkey) {
				woken = append(woken, c.pubkey)
			}
			i = end - 1
			break
		}
	}
	return woken
}

// The trie wakes exactly whom trying every name at every "@" wakes, over
// random templates and members drawn from a small alphabet (so names
// overlap, share prefixes, repeat and run on). Mutation killed: keeping
// the first name that ends rather than the longest ("@Sam Smith" wakes
// Sam), or ignoring the boundary check, differs from the reference.
func TestResolveMatchesTryingEveryName(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	word := randomWords(rng, "ab @(_İi")
	for round := range 20_000 {
		var members []Member
		for i := range rng.IntN(6) {
			members = append(members, Member{Pubkey: string(rune('A' + rng.IntN(4))), DisplayName: word(4)})
			_ = i
		}
		template := word(24)
		owner := string(rune('A' + rng.IntN(5)))
		require.Equal(t, naiveResolve(template, members, owner), Resolve(template, members, owner),
			"round %d: template %q members %v", round, template, members)
	}
}

// The work of a resolution is bounded by the mentions times the longest
// name, whatever the members: 30,000 "@" in a channel of 10,000 members,
// and a member whose display name repeats the template's own pattern for
// 30,000 characters and then differs (a name a walk would follow 30,000
// runes from every "@", quadratic work), walk at most MaxNameRunes + 1
// runes per "@".
// Trying every name at every "@" cost 300 million comparisons here
// (seconds of CPU per workflow step, in the step's transaction).
//
// Mutation killed: without the MaxNameRunes cap on candidates the long
// name is walked from every "@", 750 million runes.
func TestResolveWorkIsBoundedByMentionsTimesNameLength(t *testing.T) {
	members := make([]Member, 10_000)
	for i := range members {
		members[i] = Member{Pubkey: strconv.Itoa(i), DisplayName: "member " + strconv.Itoa(i)}
	}
	members = append(members, Member{Pubkey: "long", DisplayName: strings.Repeat("x @", 10_000) + "z"})
	template := "@" + strings.Repeat("x @", 30_000)
	mentions := strings.Count(template, "@")
	woken, walked := resolve(template, members, "")
	require.Empty(t, woken)
	require.LessOrEqual(t, walked, mentions*(MaxNameRunes+1), "runes walked for %d mentions", mentions)

	// Within the cap a long name still wakes its member.
	name := strings.Repeat("n", MaxNameRunes)
	require.Equal(t, []string{"capped"}, Resolve("hi @"+name+"!", []Member{{Pubkey: "capped", DisplayName: name}}, ""))
	require.Empty(t, Resolve("hi @"+name+"n!", []Member{{Pubkey: "over", DisplayName: name + "n"}}, ""))
}

// onlyCandidates keeps the members whose folded name is a candidate, what
// the relay reads from the database for a step.
func onlyCandidates(t *testing.T, template string, members []Member) []Member {
	t.Helper()
	candidates, ok := Candidates(template)
	require.True(t, ok)
	isCandidate := map[string]bool{}
	for _, c := range candidates {
		isCandidate[c] = true
	}
	var kept []Member
	for _, m := range members {
		if isCandidate[Fold(m.DisplayName)] {
			kept = append(kept, m)
		}
	}
	return kept
}

// Resolving against only the members whose names are candidates wakes
// exactly whom resolving against every member wakes, over random templates
// and members from a small alphabet (names overlap, run on, repeat, are
// shared by two pubkeys, fold from "İ" and sit at the end of the text).
// Mutations killed: a candidate that must be followed by a boundary
// character (names at the end of the text are missed), and candidates
// not folded.
func TestCandidatesWakeWhomEveryMemberWakes(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	word := randomWords(rng, "ab @(_İiB.")
	for round := range 20_000 {
		var members []Member
		for range rng.IntN(8) {
			members = append(members, Member{Pubkey: string(rune('A' + rng.IntN(5))), DisplayName: word(4)})
		}
		template := word(24)
		owner := string(rune('A' + rng.IntN(6)))
		require.Equal(t, Resolve(template, members, owner), Resolve(template, onlyCandidates(t, template, members), owner),
			"round %d: template %q members %v", round, template, members)
	}
}

// The candidates of a template are bounded by its mentions times
// MaxNameRunes, whatever the channel, and a template with too many of them
// says so rather than handing out millions.
func TestCandidatesAreBoundedByMentions(t *testing.T) {
	candidates, ok := Candidates("@Alice please review, and (@Bob) too")
	require.True(t, ok)
	require.Contains(t, candidates, "alice")
	require.Contains(t, candidates, "bob")
	require.Contains(t, candidates, "bob)")
	require.NotContains(t, candidates, "alic")
	require.LessOrEqual(t, len(candidates), 2*MaxNameRunes)

	long := strings.Repeat("n", MaxNameRunes)
	candidates, ok = Candidates("@" + long + " @" + long + "n")
	require.True(t, ok)
	require.Contains(t, candidates, long)
	require.NotContains(t, candidates, long+"n")

	var sb strings.Builder
	for i := range 10_000 {
		sb.WriteString(" @" + strconv.Itoa(i) + ".")
	}
	_, ok = Candidates(sb.String())
	require.False(t, ok, "more than MaxCandidates distinct candidates")
	_, ok = Candidates("@" + strings.Repeat("x @", 30_000))
	require.False(t, ok, "few distinct candidates, but millions of runes of repeats")
}

// A repeated candidate costs no allocation: a template naming the same
// people 100 times allocates about what naming them once does, not one
// string per candidate per "@" (7,207 allocations here). Not parallel, so
// that no other test's allocations are counted.
// Mutation killed: building each candidate as string(folded[i+1:end])
// (or cloning the substring) allocates one string per repeat.
func TestRepeatedCandidatesDoNotAllocate(t *testing.T) {
	template := strings.Repeat("@Robby and @Sam Smith, please. ", 100)
	candidates, ok := Candidates(template)
	require.True(t, ok)
	allocs := testing.AllocsPerRun(5, func() { Candidates(template) })
	t.Logf("%d distinct candidates, %.0f allocations", len(candidates), allocs)
	require.Less(t, allocs, float64(len(candidates)+100))
}

// randomWords returns a maker of words of 1 to n runes drawn from alphabet.
func randomWords(rng *rand.Rand, alphabet string) func(n int) string {
	runes := []rune(alphabet)
	return func(n int) string {
		var sb strings.Builder
		for range rng.IntN(n) + 1 {
			sb.WriteRune(runes[rng.IntN(len(runes))])
		}
		return sb.String()
	}
}
