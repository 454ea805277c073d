package main

import (
	"fmt"
	"log/slog"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/buzzrelay/buzz/internal/nostr"
)

func waitingMessage(id, author, channel string) incoming {
	return incoming{ev: &nostr.Event{ID: id, PubKey: author, Tags: nostr.Tags{{"h", channel}}}, at: time.Now()}
}

// Channels take turns before authors do: 200 keys flooding one channel,
// each with more than the room holds between them, leave a member of
// another channel their place, and the room never holds more than its size.
//
// Mutations killed: every message in one channel (the member's second
// message is refused: their one equals the most any author holds); no
// push-out at all (the member is refused); the owner waiting like anyone
// (the owner's is not handled first).
func TestWaitingRoomChannelsTakeTurns(t *testing.T) {
	const size = 16
	r := newWaitingRoom(size, "owner")
	for i := range 200 {
		r.add(waitingMessage(fmt.Sprintf("flood-%d", i), fmt.Sprintf("key-%d", i), "noisy"))
	}
	require.Equal(t, size, r.n)
	for i := range 3 {
		accepted, out := r.add(waitingMessage(fmt.Sprintf("quiet-%d", i), "member", "quiet"))
		require.True(t, accepted, "the quiet channel's member gets a place for message %d", i)
		require.NotNil(t, out)
		require.Equal(t, "noisy", tagValue(out.ev, "h"), "a flood message makes room")
	}
	accepted, _ := r.add(waitingMessage("owner-1", "owner", "noisy"))
	require.True(t, accepted)
	require.Equal(t, size, r.n)

	var order []string
	for {
		in, ok := r.next()
		if !ok {
			break
		}
		order = append(order, in.ev.ID)
	}
	require.Len(t, order, size)
	require.Equal(t, "owner-1", order[0], "the owner first")
	// Then the channels take turns: the quiet one's three come within six.
	quiet := 0
	for _, id := range order[1:7] {
		if id[:5] == "quiet" {
			quiet++
		}
	}
	require.Equal(t, 3, quiet, "the channels take turns: %v", order)
	require.Empty(t, r.byID, "nothing left behind")
}

// Doorbells held for a retry are bounded like the waiting room: past
// IncomingQueue of them, a newcomer is dropped and counted (overloaded);
// the one held goes back to the waiting room, with the channels heard
// now, once the next subscription is caught up.
//
// Mutation killed: no bound in holdForRetry (the second is held too, and
// nothing is counted).
func TestHeldDoorbellsAreBounded(t *testing.T) {
	key, err := nostr.GenerateSecretKey()
	require.NoError(t, err)
	j, err := openJournal("")
	require.NoError(t, err)
	st := newStatus(nil, "ws://relay", key.PublicKeyHex())
	b := newBridge(settings{Key: key, IncomingQueue: 1, CatchUpWindow: time.Hour}, nil, j, slog.New(slog.DiscardHandler), st)

	b.holdForRetry(waitingMessage("first", "relay", "c1"))
	b.holdForRetry(waitingMessage("first", "relay", "c1")) // a replayed copy of the same: no place of its own
	b.holdForRetry(waitingMessage("second", "relay", "c1"))
	require.Len(t, b.held, 1)
	require.EqualValues(t, 1, st.snapshot().Dropped["overloaded"])

	now := map[string]bool{"c1": true, "c2": true}
	b.retryHeld(now)
	require.Empty(t, b.held)
	in, ok := b.waiting.next()
	require.True(t, ok)
	require.Equal(t, "first", in.ev.ID)
	require.Equal(t, now, in.channels)
	_, ok = b.waiting.next()
	require.False(t, ok, "one copy is handed back")
}

// A held doorbell read longer than the catch-up window ago is given up when
// the held ones are handed back: its acceptance is released, so the
// catch-up point written down moves on past it, and it is not verified
// again. A younger one goes back to the waiting room.
//
// Mutation killed: no age bound in retryHeld: the old doorbell goes back to
// the waiting room, and the point written down stays at it.
func TestHeldDoorbellIsGivenUpAfterTheCatchUpWindow(t *testing.T) {
	key, err := nostr.GenerateSecretKey()
	require.NoError(t, err)
	j, err := openJournal(filepath.Join(t.TempDir(), "state.jsonl"))
	require.NoError(t, err)
	defer j.close()
	st := newStatus(nil, "ws://relay", key.PublicKeyHex())
	b := newBridge(settings{Key: key, IncomingQueue: 4, CatchUpWindow: time.Hour}, nil, j, slog.New(slog.DiscardHandler), st)

	old := waitingMessage("old", "relay", "c1")
	old.at = time.Now().Add(-2 * time.Hour)
	young := waitingMessage("young", "relay", "c1")
	later := old.at.Unix() + 60
	j.accept("old", old.at.Unix())
	j.accept("young", later)
	b.holdForRetry(old)
	b.holdForRetry(young)

	b.retryHeld(map[string]bool{"c1": true})
	in, ok := b.waiting.next()
	require.True(t, ok)
	require.Equal(t, "young", in.ev.ID)
	_, ok = b.waiting.next()
	require.False(t, ok, "the old one is not handed back")
	require.NoError(t, j.release("young"))
	require.Equal(t, later, j.resumeFrom(), "the point written down moved past the old one")
}
