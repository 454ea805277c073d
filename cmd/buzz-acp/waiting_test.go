package main

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/buzzrelay/buzz/internal/nostr"
)

func waitingMessage(id, author, channel string) incoming {
	return incoming{ev: &nostr.Event{ID: id, PubKey: author, Tags: nostr.Tags{{"h", channel}}}}
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
