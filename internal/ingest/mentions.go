package ingest

import (
	"context"

	"github.com/buzzrelay/buzz/internal/db"
	"github.com/buzzrelay/buzz/internal/nostr"
)

// mentionSideRows records an event_mentions row per pubkey the event's p
// tags name (nostr.MentionedPubkey: lowercase hex, first occurrence), up to
// the pipeline's mention cap. It wakes: a relay-signed event stored with
// EmitWaking gets its mention rows too.
var mentionSideRows = SideRows{Needs: hasMention, Apply: applyMentions, Wakes: true}

func hasMention(ev *nostr.Event) bool {
	for _, tag := range ev.Tags {
		if _, ok := nostr.MentionedPubkey(tag); ok {
			return true
		}
	}
	return false
}

func applyMentions(ctx context.Context, w *Write) error {
	pubkeys := nostr.MentionedPubkeys(w.Event.Tags, w.pipeline.maxMentions)
	id := w.Event.IDBytes()
	_, err := w.Q.EventMentionsInsert(ctx, db.EventMentionsInsertParams{
		CommunityID: w.Tenant.ID(), EventID: id[:], EventCreatedAt: w.Event.CreatedAt,
		ChannelID: w.ChannelID, EventKind: int32(w.Event.Kind), Pubkeys: pubkeys,
	})
	return err
}
