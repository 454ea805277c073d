package ingest

import "github.com/buzzrelay/buzz/internal/nostr"

// registerSocialHandlers adds profiles, reactions, emoji sets and mentions.
// Threads ride on the kind 9 handler (channels.go).
func registerSocialHandlers(p *Pipeline) {
	p.handlers[nostr.KindMetadata] = profileHandler
	p.handlers[nostr.KindReaction] = reactionHandler
	p.handlers[KindEmojiSet] = emojiSetHandler
	p.handlers[KindEmojiList] = emojiSetHandler
	p.RegisterSideRows(mentionSideRows)
}
