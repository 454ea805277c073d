package ingest

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/buzzrelay/buzz/internal/community"
	"github.com/buzzrelay/buzz/internal/db"
	"github.com/buzzrelay/buzz/internal/dberr"
)

// Folded channel lists. A membership change of a channel with fewer than
// foldMembers active members writes its admins and members lists (39001,
// 39002) in its own transaction, so a client's REQ after its join's OK
// finds itself listed. A larger channel's lists would cost every change in
// proportion to its members (a 1.3 MB members list at 8,000), so its
// changes only mark it due (channel_lists_due) one interval ahead, and
// FoldChannelLists writes each due channel's lists once, whichever relay
// process claims the mark: at most one write per channel per interval,
// however many changes it folds.
//
// The mark commits with the change, and the claim holds it until the
// lists commit: a process that dies while writing leaves the mark to be
// claimed again, and two processes never write one channel's lists at
// once. The lists are written under the channel's row lock, which every
// membership change takes first too, so they describe a state that
// committed, and the channel's messages go on meanwhile (a fold takes no
// write lock),
// and relaySign dates each after the one it replaces: no list is older
// than one written before it.

// Defaults of the fold (tests set their own in Options).
const (
	DefaultListFoldMembers  = 1000
	DefaultListFoldInterval = 2 * time.Second
	// listFoldPoll is how often RunListFolder looks for due marks: a
	// claim on a table that holds only the marks.
	listFoldPoll = 250 * time.Millisecond
)

// RunListFolder writes due channel lists (FoldChannelLists) until ctx
// ends. Every relay process may run it; report sees each pass's failure.
func (p *Pipeline) RunListFolder(ctx context.Context, report func(error)) {
	t := time.NewTicker(listFoldPoll)
	defer t.Stop()
	for {
		if _, err := p.FoldChannelLists(ctx); err != nil && ctx.Err() == nil && report != nil {
			report(err)
		}
		if p.onListFoldPass != nil {
			p.onListFoldPass()
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// FoldChannelLists writes the lists of every channel whose mark is due,
// one channel per transaction, and returns how many it wrote. Marks that
// another process holds are skipped; it finds them again if that process
// dies before its commit.
func (p *Pipeline) FoldChannelLists(ctx context.Context) (int, error) {
	written := 0
	for {
		found, err := p.foldOne(ctx)
		if err != nil || !found {
			return written, err
		}
		written++
	}
}

// foldOne claims one due mark and writes its channel's lists, then fans
// them out. found is false when no mark is due and free.
func (p *Pipeline) foldOne(ctx context.Context) (found bool, err error) {
	ctx, cancel := context.WithTimeout(ctx, p.writeTimeout)
	defer cancel()
	var w *Write
	var due db.ChannelListsClaimDueRow
	err = pgx.BeginFunc(ctx, p.pool, func(tx pgx.Tx) error {
		q := db.New(tx)
		var err error
		due, err = q.ChannelListsClaimDue(ctx, p.clock.SQL())
		if dberr.IsNotFound(err) {
			return nil
		}
		if err != nil {
			return err
		}
		found = true
		if p.onListClaimed != nil {
			p.onListClaimed()
		}
		// Waits for a membership change of the channel in progress, whose
		// mark (already here) this write then covers. No write lock: a
		// change arriving meanwhile waits for this row before it asks the
		// write lock, so the channel's messages are not held behind it for
		// the fold's seconds.
		live, err := q.ChannelLockForLists(ctx, db.ChannelLockForListsParams{CommunityID: due.CommunityID, ID: due.ChannelID})
		if err != nil {
			return err
		}
		if live == 1 {
			w = &Write{Tenant: community.FromRow(db.Community{ID: due.CommunityID}), Q: q, ChannelID: &due.ChannelID, pipeline: p}
			// The readers version the lists are fanned out with, read
			// under the row: every change of who may read the channel
			// takes the row first, so none commits until the lists do.
			access, err := ChannelAccessNow(ctx, q, db.ChannelAccessParams{CommunityID: due.CommunityID, ID: due.ChannelID, Pubkey: w.ActorBytes()})
			if err != nil {
				return err
			}
			w.ReadChannel(due.ChannelID, access)
			if p.onListsLocked != nil {
				p.onListsLocked()
			}
			if err := w.emitLists(ctx, due.ChannelID); err != nil {
				return err
			}
		}
		return q.ChannelListsDueDone(ctx, db.ChannelListsDueDoneParams{CommunityID: due.CommunityID, ChannelID: due.ChannelID})
	})
	if err != nil && found {
		// Best effort (the connection may be what failed): a mark that
		// keeps failing must not stop the marks behind it, and the claim
		// takes the oldest first.
		pctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		_ = db.New(p.pool).ChannelListsPostponeDue(pctx, db.ChannelListsPostponeDueParams{
			CommunityID: due.CommunityID, ChannelID: due.ChannelID, Now: p.clock.SQL(), AfterSeconds: p.foldInterval.Seconds(),
		})
		cancel()
	}
	if err != nil || w == nil {
		return found, err
	}
	for _, e := range w.emitted {
		p.publish(w, e.ev, e.channel)
	}
	return true, nil
}
