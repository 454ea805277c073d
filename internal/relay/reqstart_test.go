package relay_test

import (
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

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
