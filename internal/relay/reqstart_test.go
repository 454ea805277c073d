package relay_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/buzzrelay/buzz/internal/db"
	"github.com/buzzrelay/buzz/internal/eventstore"
	"github.com/buzzrelay/buzz/internal/nostr"
	"github.com/buzzrelay/buzz/internal/relaytest"
)

// An event committed between a live REQ's registration and its history
// read reaches the hub's live delivery and, being committed, the history
// too. The client gets it once: from the history when the history holds it,
// else live after the EOSE (NIP-01: events before the EOSE are stored ones).
//
// Mutations killed: no hold (HoldLive not called): the first event comes
// twice before the EOSE, and the second before the EOSE; held events sent
// without the history check: the first event comes again after the EOSE.
func TestEventCommittedAsAReqStartsIsSentOnce(t *testing.T) {
	t.Parallel()
	r := relaytest.Start(t)
	pub := r.Dial(t, "")
	pub.Auth(nil)
	watcher := r.Dial(t, "")
	watcher.Auth(nil)
	sub := r.Dial(t, "")
	sub.Auth(nil)

	// The watcher's live subscription shows when the hub has delivered an
	// event: deliveries of one publish run one after another, so shortly
	// after the watcher has it, the REQ being started has it too.
	watcher.Send("REQ", "watch", map[string]any{"kinds": []int{1}, "#t": []string{"stored", "late", "marker"}, "limit": 0})
	watcher.Expect("EOSE")
	var armed atomic.Pointer[nostr.Event]
	r.Server.SetBeforeHistory(func() {
		ev := armed.Swap(nil)
		if ev == nil {
			return
		}
		if ok := pub.Publish(ev); !ok.OK {
			t.Errorf("publish in the REQ's window refused: %s", ok.Msg)
			return
		}
		require.Equal(t, ev.ID, watcher.Expect("EVENT").Event.ID)
		time.Sleep(50 * time.Millisecond)
	})
	// replies reads sub's messages for subID up to the marker's live
	// delivery, as "EOSE" or event ids in order.
	replies := func(subID string, marker *nostr.Event) []string {
		t.Helper()
		var got []string
		for {
			rep := sub.NextReply()
			require.Equal(t, subID, rep.SubID, "%+v", rep)
			switch rep.Verb {
			case "EOSE":
				got = append(got, "EOSE")
				require.True(t, pub.Publish(marker).OK)
				require.Equal(t, marker.ID, watcher.Expect("EVENT").Event.ID)
			case "EVENT":
				if rep.Event.ID == marker.ID {
					return got
				}
				got = append(got, rep.Event.ID)
			default:
				t.Fatalf("unexpected %+v", rep)
			}
		}
	}

	stored := pub.Sign(1, "committed before the history's snapshot", nostr.Tags{{"t", "stored"}}, 0)
	armed.Store(stored)
	sub.Send("REQ", "history", map[string]any{"kinds": []int{1}, "#t": []string{"stored", "marker"}})
	require.Equal(t, []string{stored.ID, "EOSE"},
		replies("history", pub.Sign(1, "marker", nostr.Tags{{"t", "marker"}}, 0)))

	// limit 0 reads no history: the event is live, after the EOSE.
	sub.Send("CLOSE", "history")
	late := pub.Sign(1, "committed while no history is read", nostr.Tags{{"t", "late"}}, 0)
	armed.Store(late)
	sub.Send("REQ", "live", map[string]any{"kinds": []int{1}, "#t": []string{"late", "marker"}, "limit": 0})
	require.Equal(t, []string{"EOSE", late.ID},
		replies("live", pub.Sign(1, "marker 2", nostr.Tags{{"t", "marker"}}, 0)))
}

// An event another relay process committed just before a live REQ's
// history snapshot comes over the bus some milliseconds later: when the
// history was read and the EOSE sent first, that live copy must not reach
// the client a second time after the EOSE (nor does a copy published late
// by this process, after the rest of its group).
//
// Mutation killed: ReleaseLive forgetting the history's ids at once (no
// late-copy window): the stored event comes again after the EOSE.
func TestLateLiveCopyOfAHistoryEventIsNotSentAgain(t *testing.T) {
	t.Parallel()
	r := relaytest.Start(t)
	sub := r.Dial(t, "")
	key := sub.Auth(nil)
	ctx := context.Background()

	stored := relaytest.SignEvent(t, key, 1, "written by another relay process", nostr.Tags{{"t", "late-copy"}}, 0)
	var armed atomic.Bool
	armed.Store(true)
	r.Server.SetBeforeHistory(func() {
		if !armed.Swap(false) {
			return
		}
		// Committed by the other process; its bus message is on its way.
		params, err := eventstore.InsertParams(r.CommunityID, stored, nil)
		if err == nil {
			_, err = db.New(r.Pool).EventInsert(ctx, params)
		}
		if err != nil {
			t.Errorf("insert: %v", err)
		}
	})
	sub.Send("REQ", "s", map[string]any{"kinds": []int{1}, "#t": []string{"late-copy"}})
	require.Equal(t, stored.ID, sub.Expect("EVENT").Event.ID)
	sub.Expect("EOSE")

	// The bus message arrives after the EOSE, then a fresh event.
	r.Server.DeliverFromBus(r.CommunityID, stored, nil)
	fresh := relaytest.SignEvent(t, key, 1, "fresh", nostr.Tags{{"t", "late-copy"}}, 0)
	r.Server.DeliverFromBus(r.CommunityID, fresh, nil)
	require.Equal(t, fresh.ID, sub.Expect("EVENT").Event.ID, "the history's event came again, live, after the EOSE")
}
