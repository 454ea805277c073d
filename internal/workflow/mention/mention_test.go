package mention

import (
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
