package ingest

import (
	"context"

	"github.com/buzzrelay/buzz/internal/db"
	"github.com/buzzrelay/buzz/internal/nostr"
)

// mentionChunk bounds the rows one event_mentions statement inserts.
const mentionChunk = 5000

// mentionSideRows records an event_mentions row per valid p tag (lowercase
// 64-hex, first occurrence) of every stored event.
var mentionSideRows = SideRows{Needs: hasMention, Apply: applyMentions}

func hasMention(ev *nostr.Event) bool {
	for _, tag := range ev.Tags {
		if len(tag) >= 2 && tag[0] == "p" && nostr.IsHex64(tag[1]) {
			return true
		}
	}
	return false
}

// mentionedPubkeys returns the valid p tag values, deduplicated in order.
func mentionedPubkeys(ev *nostr.Event) []string {
	var out []string
	seen := map[string]struct{}{}
	for _, tag := range ev.Tags {
		if len(tag) < 2 || tag[0] != "p" || !nostr.IsHex64(tag[1]) {
			continue
		}
		if _, dup := seen[tag[1]]; !dup {
			seen[tag[1]] = struct{}{}
			out = append(out, tag[1])
		}
	}
	return out
}

func applyMentions(ctx context.Context, w *Write) error {
	pubkeys := mentionedPubkeys(w.Event)
	id := w.Event.IDBytes()
	for start := 0; start < len(pubkeys); start += mentionChunk {
		chunk := pubkeys[start:min(start+mentionChunk, len(pubkeys))]
		if _, err := w.Q.EventMentionsInsert(ctx, db.EventMentionsInsertParams{
			CommunityID: w.Tenant.ID(), EventID: id[:], EventCreatedAt: w.Event.CreatedAt,
			ChannelID: w.ChannelID, EventKind: int32(w.Event.Kind), Pubkeys: chunk,
		}); err != nil {
			return err
		}
	}
	return nil
}
