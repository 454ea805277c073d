package relay

import (
	"context"
	"time"

	"github.com/buzzrelay/buzz/internal/eventstore"
)

// readSlotWait bounds a wait for one of the read slots by a statement that
// is not a REQ's, COUNT's or search's (those wait BUZZ_QUERY_TIMEOUT): the
// Host lookup of every HTTP request, and the statements of an HTTP request
// before and besides its event reads. Each is one short indexed statement,
// so this is only reached when every slot stays busy (a statement of a REQ
// holds one for at most BUZZ_QUERY_TIMEOUT, 10 s by default). Not that
// setting itself: a relay whose queries may take a millisecond must still
// answer these.
const readSlotWait = 10 * time.Second

// busyReadingReason answers an HTTP request one of whose statements found
// every read slot taken for readSlotWait: the client may send it again.
const busyReadingReason = "error: the relay is busy reading; try again shortly"

// errReadSlotsBusy: every read slot stayed taken for readSlotWait, so the
// statement did not run. The event store's own, so a REQ, COUNT or bridge
// read refused before its event statements is answered as one refused by
// them.
var errReadSlotsBusy = eventstore.ErrReadSlotsBusy

// takeReadSlot waits for one of slots, at most readSlotWait; release gives
// it back. Statements that any client can make the relay run, signed with
// a fresh key or not signed at all, take a slot, so that however many run
// at once they never take the connections kept for the writers.
func takeReadSlot(ctx context.Context, slots *eventstore.ReadSlots) (release func(), err error) {
	wait, cancel := context.WithTimeout(ctx, readSlotWait)
	defer cancel()
	release, err = slots.Acquire(wait)
	if err != nil {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		return nil, errReadSlotsBusy
	}
	return release, nil
}

// readSlot is takeReadSlot on the server's read slots.
func (s *Server) readSlot(ctx context.Context) (release func(), err error) {
	return takeReadSlot(ctx, s.store.ReadSlots)
}
