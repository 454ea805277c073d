package ingest

import (
	"errors"
	"fmt"
	"strings"
	"unicode/utf8"

	"github.com/buzzrelay/buzz/internal/nostr"
)

// Custom emoji (NIP-30) limits shared with the SDK and the desktop client.
const (
	// MaxCustomEmojiShortcodeLen bounds a shortcode, in bytes (ASCII only,
	// so also in characters).
	MaxCustomEmojiShortcodeLen = 64
	// MaxCustomEmojiReactionLen bounds a ":shortcode:" reaction.
	MaxCustomEmojiReactionLen = MaxCustomEmojiShortcodeLen + 2
	// MaxReactionLen bounds any other reaction, in Unicode scalar values.
	MaxReactionLen = 64
)

// Kinds carrying custom emoji definitions.
const (
	KindEmojiList = 10030 // a user's emoji list (replaceable)
	KindEmojiSet  = 30030 // an emoji set (addressable)
)

// NormalizeShortcode applies the shortcode rule: trim whitespace, strip
// colons from both ends, require 1 to 64 bytes of [A-Za-z0-9_-], and return
// the lowercase form.
func NormalizeShortcode(raw string) (string, error) {
	s := strings.Trim(strings.TrimSpace(raw), ":")
	if s == "" {
		return "", errors.New("emoji shortcode must not be empty")
	}
	if len(s) > MaxCustomEmojiShortcodeLen {
		return "", fmt.Errorf("emoji shortcode exceeds %d bytes (got %d)", MaxCustomEmojiShortcodeLen, len(s))
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-') {
			return "", errors.New("emoji shortcode may only contain ASCII letters, digits, hyphens, and underscores")
		}
	}
	return strings.ToLower(s), nil
}

// ReactionEmoji validates a kind 7 reaction's content and returns the emoji
// to store: "+" for empty content, any string of at most 64 Unicode scalar
// values as it is, and beyond that only a canonical ":shortcode:" (at most
// 66 characters) whose shortcode an emoji tag names exactly.
func ReactionEmoji(content string, tags nostr.Tags) (string, error) {
	if content == "" {
		return "+", nil
	}
	n := utf8.RuneCountInString(content)
	if n <= MaxReactionLen {
		return content, nil
	}
	tooLong := Reject("invalid", "reaction emoji exceeds %d characters (got %d)", MaxReactionLen, n)
	if len(content) < 2 || content[0] != ':' || content[len(content)-1] != ':' {
		return "", tooLong
	}
	shortcode := content[1 : len(content)-1]
	normalized, err := NormalizeShortcode(shortcode)
	if err != nil {
		return "", Reject("invalid", "%v", err)
	}
	if normalized != shortcode {
		return "", Reject("invalid", "long custom emoji reaction shortcode must be canonical lowercase")
	}
	if n > MaxCustomEmojiReactionLen || !hasEmojiTag(tags, shortcode) {
		return "", tooLong
	}
	return content, nil
}

func hasEmojiTag(tags nostr.Tags, shortcode string) bool {
	for _, tag := range tags {
		if len(tag) >= 2 && tag[0] == "emoji" && tag[1] == shortcode {
			return true
		}
	}
	return false
}

// validateEmojiTags checks an emoji set or list (kinds 30030, 10030): every
// emoji tag names a valid shortcode. Upper case is accepted; the URL is not
// checked.
func validateEmojiTags(ev *nostr.Event) error {
	for _, tag := range ev.Tags {
		if len(tag) == 0 || tag[0] != "emoji" {
			continue
		}
		if len(tag) < 2 {
			return Reject("invalid", "emoji tag must include a shortcode")
		}
		if _, err := NormalizeShortcode(tag[1]); err != nil {
			return Reject("invalid", "%v", err)
		}
	}
	return nil
}
