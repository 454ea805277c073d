package ingest

import (
	"context"
	"fmt"
	"time"

	"github.com/buzzrelay/buzz/internal/db"
	"github.com/buzzrelay/buzz/internal/dberr"
	"github.com/buzzrelay/buzz/internal/nostr"
)

// replyParent reads the NIP-10 parent a channel message answers: the e tag
// marked "reply"; else the one marked "root" (a direct reply to the root);
// else, when no e tag carries a marker, the deprecated positional form (the
// last e tag). ok is false for a message that replies to nothing; valid is
// false when the chosen tag does not hold an event id.
func replyParent(ev *nostr.Event) (id [32]byte, ok, valid bool) {
	var reply, root, last nostr.Tag
	marked := false
	for _, tag := range ev.Tags {
		if len(tag) < 2 || tag[0] != "e" {
			continue
		}
		marker := ""
		if len(tag) >= 4 {
			marker = tag[3]
		}
		switch marker {
		case "reply":
			if reply == nil {
				reply = tag
			}
			marked = true
		case "root":
			if root == nil {
				root = tag
			}
			marked = true
		case "":
			last = tag
		default: // "mention" and unknown markers name no parent
			marked = true
		}
	}
	chosen := reply
	if chosen == nil {
		chosen = root
	}
	if chosen == nil && !marked {
		chosen = last
	}
	if chosen == nil {
		return id, false, false
	}
	id, valid = nostr.DecodeHex32(chosen[1])
	return id, true, valid
}

// applyThreadReply writes a channel reply's thread_metadata row and counts
// it on its ancestors. The parent must be a live event of the same channel.
// A p-gated parent (someone else's gift wrap) is answered like an unknown
// id, as a reaction to it is, and takes no replies even from its
// recipient: the reply is read by the whole channel.
// Every reply of a thread locks the thread's root row first, so replies of
// one thread serialize (counters still move by relative increments).
func applyThreadReply(ctx context.Context, w *Write) error {
	parentID, isReply, valid := replyParent(w.Event)
	if !isReply {
		return nil
	}
	notFound := Reject("invalid", "reply parent not found")
	if !valid || w.ChannelID == nil {
		return notFound
	}
	community, channel := w.Tenant.ID(), *w.ChannelID
	parent, err := w.Q.ThreadParentLookup(ctx, db.ThreadParentLookupParams{
		CommunityID: community, ID: parentID[:], ChannelID: channel, ReaderHex: w.Actor, Now: w.Now(),
	})
	if dberr.IsNotFound(err) {
		return notFound
	}
	if err != nil {
		return err
	}
	if nostr.IsPGated(int(parent.Kind)) {
		if !parent.ReaderIsParty {
			return notFound
		}
		return Reject("invalid", "kind %d events take no replies", parent.Kind)
	}

	// The root is the parent's root, or the parent itself when it is top-level.
	rootID, rootCreatedAt, depth := parentID[:], parent.CreatedAt, int32(1)
	if parent.Depth != nil && *parent.Depth > 0 {
		rootID, rootCreatedAt, depth = parent.RootEventID, *parent.RootCreatedAt, *parent.Depth+1
	} else if parent.Depth == nil {
		if err := w.Q.ThreadTopLevelEnsure(ctx, db.ThreadTopLevelEnsureParams{
			CommunityID: community, EventCreatedAt: parent.CreatedAt, EventID: parentID[:], ChannelID: channel,
		}); err != nil {
			return err
		}
	}
	if max := w.pipeline.maxThreadDepth; int(depth) > max {
		return Reject("invalid", "thread is too deep: replies may sit at most %d levels below the root; reply higher up", max)
	}
	if _, err := w.Q.ThreadRootLock(ctx, db.ThreadRootLockParams{
		CommunityID: community, EventCreatedAt: rootCreatedAt, EventID: rootID,
	}); err != nil {
		return fmt.Errorf("lock thread root: %w", err)
	}

	own := w.Event.IDBytes()
	createdAt := time.Unix(w.Event.CreatedAt, 0)
	if err := w.Q.ThreadReplyInsert(ctx, db.ThreadReplyInsertParams{
		CommunityID: community, EventCreatedAt: createdAt, EventID: own[:], ChannelID: channel,
		ParentEventID: parentID[:], ParentCreatedAt: parent.CreatedAt,
		RootEventID: rootID, RootCreatedAt: rootCreatedAt, Depth: depth,
	}); err != nil {
		return err
	}
	touched, err := w.Q.ThreadAncestorsCountReply(ctx, db.ThreadAncestorsCountReplyParams{
		CommunityID: community, ParentCreatedAt: parent.CreatedAt, ParentEventID: parentID[:], ReplyCreatedAt: createdAt,
	})
	if err != nil {
		return err
	}
	if touched != int64(depth) {
		return fmt.Errorf("thread of %x: counted the reply on %d ancestors, want %d", parentID, touched, depth)
	}
	return nil
}
