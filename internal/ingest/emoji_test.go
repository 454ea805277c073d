package ingest_test

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/buzzrelay/buzz/internal/ingest"
	"github.com/buzzrelay/buzz/internal/nostr"
)

func TestNormalizeShortcode(t *testing.T) {
	t.Parallel()
	a := func(n int) string { return strings.Repeat("a", n) }
	cases := []struct {
		name, in, want, err string
	}{
		{"custom_emoji_reaction_happy_path", ":Party_Parrot:", "party_parrot", ""},
		{"trims whitespace then colons", "  :ok-1:  ", "ok-1", ""},
		{"strips every edge colon", "::x::", "x", ""},
		{"63 bytes", a(63), a(63), ""},
		{"64 bytes", a(64), a(64), ""},
		{"64 bytes wrapped", ":" + a(64) + ":", a(64), ""},
		{"65 bytes", a(65), "", "emoji shortcode exceeds 64 bytes (got 65)"},
		{"67 bytes", a(67), "", "emoji shortcode exceeds 64 bytes (got 67)"},
		{"empty", "", "", "emoji shortcode must not be empty"},
		{"only colons", "::", "", "emoji shortcode must not be empty"},
		{"only spaces", "   ", "", "emoji shortcode must not be empty"},
		{"inner colon", "a:b", "", "emoji shortcode may only contain ASCII letters, digits, hyphens, and underscores"},
		{"inner space", "a b", "", "emoji shortcode may only contain ASCII letters, digits, hyphens, and underscores"},
		{"non-ascii", "café", "", "emoji shortcode may only contain ASCII letters, digits, hyphens, and underscores"},
		{"non-ascii over 64 bytes", strings.Repeat("é", 33), "", "emoji shortcode exceeds 64 bytes (got 66)"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ingest.NormalizeShortcode(tc.in)
			if tc.err != "" {
				require.EqualError(t, err, tc.err)
				return
			}
			require.NoError(t, err)
			require.Equal(t, tc.want, got)
		})
	}
}

// The reaction-emoji rules the relay enforces and the client SDKs expect,
// at the 64/65/66/67 boundaries.
func TestReactionEmoji(t *testing.T) {
	t.Parallel()
	a := func(n int) string { return strings.Repeat("a", n) }
	mixed64 := "A" + a(63)
	emojiTag := func(code string) nostr.Tag { return nostr.Tag{"emoji", code, "https://example.com/" + code + ".png"} }
	cases := []struct {
		name    string
		content string
		tags    nostr.Tags
		want    string // stored emoji, when accepted
		err     string // full NIP-01 message, when rejected
	}{
		{"reaction_validation_accepts_wrapped_max_shortcode", ":" + a(64) + ":", nostr.Tags{emojiTag(a(64))}, ":" + a(64) + ":", ""},
		{"custom_emoji_reaction_accepts_max_shortcode_length", ":" + a(64) + ":", nostr.Tags{{"e", a(64)}, emojiTag(a(64))}, ":" + a(64) + ":", ""},
		{"reaction_validation_rejects_mixed_case_max_shortcode", ":" + mixed64 + ":", nostr.Tags{emojiTag(mixed64)}, "",
			"invalid: long custom emoji reaction shortcode must be canonical lowercase"},
		{"reaction_validation_rejects_case_mismatched_tag", ":" + a(64) + ":", nostr.Tags{emojiTag(strings.ToUpper(a(64)))}, "",
			"invalid: reaction emoji exceeds 64 characters (got 66)"},
		{"custom_emoji_reaction_rejects_overlong_shortcode", ":" + a(65) + ":", nostr.Tags{emojiTag(a(65))}, "",
			"invalid: emoji shortcode exceeds 64 bytes (got 65)"},
		{"reaction_emoji_max_len_ok", a(64), nil, a(64), ""},
		{"reaction_emoji_too_long", a(65), nil, "", "invalid: reaction emoji exceeds 64 characters (got 65)"},
		{"custom_emoji_reaction_happy_path", ":party_parrot:", nostr.Tags{emojiTag("party_parrot")}, ":party_parrot:", ""},
		{"short custom emoji needs no tag", ":Party_Parrot:", nil, ":Party_Parrot:", ""},
		{"empty content is a like", "", nil, "+", ""},
		{"dislike", "-", nil, "-", ""},
		{"64 scalar values of multibyte text", strings.Repeat("👍", 64), nil, strings.Repeat("👍", 64), ""},
		{"65 scalar values of multibyte text", strings.Repeat("👍", 65), nil, "", "invalid: reaction emoji exceeds 64 characters (got 65)"},
		{"wrapped 63 plus tag is under the plain limit", ":" + a(62) + ":", nil, ":" + a(62) + ":", ""},
		{"wrapped 64 without a tag", ":" + a(64) + ":", nil, "", "invalid: reaction emoji exceeds 64 characters (got 66)"},
		{"wrapped 64 with a tag for another code", ":" + a(64) + ":", nostr.Tags{emojiTag(a(63) + "b")}, "", "invalid: reaction emoji exceeds 64 characters (got 66)"},
		{"wrapped 64 with an emoji tag lacking a code", ":" + a(64) + ":", nostr.Tags{{"emoji"}}, "", "invalid: reaction emoji exceeds 64 characters (got 66)"},
		{"65 with one colon", ":" + a(64), nostr.Tags{emojiTag(a(64))}, "", "invalid: reaction emoji exceeds 64 characters (got 65)"},
		{"67 not wrapped", a(67), nil, "", "invalid: reaction emoji exceeds 64 characters (got 67)"},
		{"wrapped with inner whitespace", ": " + a(63) + " :", nostr.Tags{emojiTag(a(63))}, "", "invalid: long custom emoji reaction shortcode must be canonical lowercase"},
		{"wrapped with doubled colons", "::" + a(63) + "::", nostr.Tags{emojiTag(":" + a(63) + ":")}, "", "invalid: long custom emoji reaction shortcode must be canonical lowercase"},
		{"wrapped with a bad character", ":" + a(63) + "!:", nostr.Tags{emojiTag(a(63) + "!")}, "",
			"invalid: emoji shortcode may only contain ASCII letters, digits, hyphens, and underscores"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ingest.ReactionEmoji(tc.content, tc.tags)
			if tc.err != "" {
				require.EqualError(t, err, tc.err)
				return
			}
			require.NoError(t, err)
			require.Equal(t, tc.want, got)
		})
	}
}

// Emoji sets and lists: every emoji tag needs a valid shortcode; upper case
// is accepted and URLs are not checked.
func TestEmojiSetValidation(t *testing.T) {
	t.Parallel()
	f := newFixture(t, "emoji-sets.example", 0)
	key := f.key()
	a := func(n int) string { return strings.Repeat("a", n) }
	set := func(kind int, tags ...nostr.Tag) *nostr.Event {
		if kind == ingest.KindEmojiSet {
			tags = append(nostr.Tags{{"d", "buzz:custom-emoji"}}, tags...)
		}
		return f.sign(key, kind, "", tags, 0)
	}
	for _, kind := range []int{ingest.KindEmojiSet, ingest.KindEmojiList} {
		t.Run("emoji_set_validation_enforces_shortcode_boundary", func(t *testing.T) {
			f.rejected(set(kind, nostr.Tag{"emoji", a(65), "https://x.example/a.png"}), "invalid: emoji shortcode exceeds 64 bytes (got 65)")
		})
		f.rejected(set(kind, nostr.Tag{"emoji"}), "invalid: emoji tag must include a shortcode")
		f.rejected(set(kind, nostr.Tag{"emoji", ""}), "invalid: emoji shortcode must not be empty")
		f.rejected(set(kind, nostr.Tag{"emoji", "ok"}, nostr.Tag{"emoji", "no way"}),
			"invalid: emoji shortcode may only contain ASCII letters, digits, hyphens, and underscores")
	}
	// custom_emoji_set_happy_path, with the upper case and odd URLs a set may carry.
	f.store(set(ingest.KindEmojiSet, nostr.Tag{"emoji", "Party_Parrot", "https://x.example/p.gif"},
		nostr.Tag{"emoji", a(64), "not a url"}, nostr.Tag{"emoji", ":wave:"}))
	f.store(set(ingest.KindEmojiList, nostr.Tag{"emoji", "wave", "https://x.example/w.png"}, nostr.Tag{"a", "30030:" + key.PublicKeyHex() + ":buzz:custom-emoji"}))
}
