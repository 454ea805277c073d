package fanout_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/buzzrelay/buzz/internal/fanout"
	"github.com/buzzrelay/buzz/internal/nostr"
)

func heldEvent(i int) *nostr.Event {
	return &nostr.Event{ID: fmt.Sprintf("%064x", i), PubKey: hexKeys[0], Kind: 1, Tags: nostr.Tags{}}
}

// deliveredIDs returns the event ids in the messages b received, in order.
func deliveredIDs(b *inbox) []string {
	var ids []string
	for _, msg := range b.take() {
		ids = append(ids, string(nostr.RawEventID([]byte(msg[strings.Index(msg, "{"):]))))
	}
	return ids
}

// Held events reach the receiver only at ReleaseLive, in the order they
// came, without those the history sent; later ones go straight through.
//
// Mutations killed: enqueue ignoring holding (events arrive before the
// release); ReleaseLive ignoring sent (the sent one is delivered); no
// late-copy window after the release (the sent one, published again, is
// delivered).
func TestHeldEventsFollowTheReleaseInOrder(t *testing.T) {
	hub, community, b := fanout.NewHub(), uuid.New(), &inbox{}
	sub := &fanout.Subscription{Receiver: b, ID: "s", Filters: nostr.Filters{{Kinds: []int{1}}}}
	sub.HoldLive(10, 1<<20, func() { t.Error("overflow with room left") })
	hub.Subscribe(community, sub)
	for i := 1; i <= 3; i++ {
		require.Equal(t, 1, hub.Publish(community, heldEvent(i), nil).Delivered)
	}
	require.Empty(t, b.take(), "nothing reaches the receiver while held")

	sentByHistory := string(nostr.RawEventID(heldEvent(2).AppendJSON(nil)))
	done := make(chan struct{})
	skipped := sub.ReleaseLive(func(raw []byte) bool { return string(nostr.RawEventID(raw)) == sentByHistory }, func() { close(done) })
	require.Equal(t, 1, skipped)
	require.Equal(t, []string{heldEvent(1).ID, heldEvent(3).ID}, deliveredIDs(b))

	hub.Publish(community, heldEvent(4), nil)
	require.Equal(t, []string{heldEvent(4).ID}, deliveredIDs(b))

	// A late live copy of the event the history sent is dropped too, until
	// the subscription lets go of the history's ids (done).
	require.Zero(t, hub.Publish(community, heldEvent(2), nil).Delivered)
	require.Empty(t, b.take(), "the history's event delivered again after the release")
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("the history's ids were never let go")
	}
}

// Past maxHeld events, or maxHeldBytes, the overflow callback runs once and
// the excess is dropped (counted); a subscription removed while holding
// releases nothing.
//
// Mutations killed: no bound in events or in bytes (the fourth event is
// held); overflow called per event (called twice).
func TestHoldingIsBoundedAndDiesWithTheSubscription(t *testing.T) {
	size := len(heldEvent(1).AppendJSON(nil))
	for name, bounds := range map[string][2]int{"events": {3, 1 << 20}, "bytes": {100, 3*size + size/2}} {
		t.Run(name, func(t *testing.T) {
			hub, community, b := fanout.NewHub(), uuid.New(), &inbox{}
			sub := &fanout.Subscription{Receiver: b, ID: "s", Filters: nostr.Filters{{Kinds: []int{1}}}}
			overflows := 0
			sub.HoldLive(bounds[0], bounds[1], func() { overflows++ })
			hub.Subscribe(community, sub)
			var dropped int
			for i := 1; i <= 5; i++ {
				dropped += hub.Publish(community, heldEvent(i), nil).Dropped
			}
			require.Equal(t, 2, dropped)
			require.Equal(t, 1, overflows)

			require.True(t, hub.Unsubscribe(community, b, "s"))
			done := false
			require.Zero(t, sub.ReleaseLive(func([]byte) bool { return false }, func() { done = true }))
			require.True(t, done, "a removed subscription lets go of the history's ids at once")
			require.Empty(t, b.take(), "a removed subscription's held events are not sent")
		})
	}
}

// An event larger than the byte bound is held when it is the only one, as
// the send queue takes a lone live event whatever its size: the client is
// closed as slow only when a second one comes.
//
// Mutation killed: the byte bound applied to the first held event (the
// overflow runs, and nothing is released).
func TestALoneEventLargerThanTheByteBoundIsHeld(t *testing.T) {
	hub, community, b := fanout.NewHub(), uuid.New(), &inbox{}
	sub := &fanout.Subscription{Receiver: b, ID: "s", Filters: nostr.Filters{{Kinds: []int{1}}}}
	overflows := 0
	sub.HoldLive(10, 16, func() { overflows++ })
	hub.Subscribe(community, sub)
	require.Equal(t, 1, hub.Publish(community, heldEvent(1), nil).Delivered)
	require.Zero(t, overflows, "a lone event over the byte bound closed the client")
	require.Equal(t, 1, hub.Publish(community, heldEvent(2), nil).Dropped)
	require.Equal(t, 1, overflows)
	sub.ReleaseLive(func([]byte) bool { return false }, nil)
	require.Equal(t, []string{heldEvent(1).ID}, deliveredIDs(b))
}
