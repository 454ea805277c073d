package fanout_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/buzzrelay/buzz/internal/fanout"
	"github.com/buzzrelay/buzz/internal/nostr"
)

func note(i int) *nostr.Event {
	return &nostr.Event{ID: fmt.Sprintf("%064x", i), PubKey: hexKeys[0], Kind: 1, CreatedAt: 100}
}

func subscribeAll(h *fanout.Hub, community uuid.UUID, id string) *inbox {
	box := &inbox{}
	h.Subscribe(community, &fanout.Subscription{Receiver: box, ID: id, Filters: nostr.Filters{{Kinds: []int{1}}}})
	return box
}

// A replay after a gap hands on what the hub missed, once: not what it
// published itself, not its live copy arriving after the replay, and not
// to a subscription registered well after the event's write began (its
// REQ returned it).
// Mutations killed: PublishWritten not checking the remembered ids (the
// live copy after the replay is delivered again); Replay not checking
// them (the event published before is delivered again); Replay ignoring
// when a subscription was registered (the late subscription gets it).
func TestReplaySendsEachStoredEventOnce(t *testing.T) {
	t.Parallel()
	h := fanout.NewHub()
	h.RememberPublished(time.Hour, 100, func() bool { return false })
	community := uuid.New()
	early := subscribeAll(h, community, "early")
	receivedAt := time.Now()

	h.PublishWritten(community, note(1), nil, 0)
	require.Len(t, early.take(), 1)
	st, missed := h.Replay(community, note(1), nil, receivedAt)
	require.False(t, missed, "the hub published it itself")
	require.Zero(t, st.Delivered)
	require.Empty(t, early.take())

	st, missed = h.Replay(community, note(2), nil, receivedAt)
	require.True(t, missed)
	require.Equal(t, 1, st.Delivered)
	require.Len(t, early.take(), 1)
	require.Zero(t, h.PublishWritten(community, note(2), nil, 0).Delivered, "the live copy after the replay")
	require.Empty(t, early.take())

	// A write that began at receivedAt, replayed to a subscription
	// registered more than a second after it.
	time.Sleep(1100 * time.Millisecond)
	late := subscribeAll(h, community, "late")
	st, missed = h.Replay(community, note(3), nil, receivedAt)
	require.True(t, missed)
	require.Equal(t, 1, st.Delivered, "only the subscription that existed when the write began")
	require.Len(t, early.take(), 1)
	require.Empty(t, late.take(), "the late subscription's history held it")

	// Ephemeral events are never stored nor replayed, so not remembered.
	typing := &nostr.Event{ID: fmt.Sprintf("%064x", 4), PubKey: hexKeys[0], Kind: 20001}
	h.Subscribe(community, &fanout.Subscription{Receiver: early, ID: "typing", Filters: nostr.Filters{{Kinds: []int{20001}}}})
	require.Equal(t, 1, h.PublishWritten(community, typing, nil, 0).Delivered)
	require.Equal(t, 1, h.PublishWritten(community, typing, nil, 0).Delivered)
}

// Ids are kept between one and two windows, and for as long as hold
// reports true (a gap not caught up yet), up to most.
// Mutations killed: rotating while held (the id published before the
// gap is delivered again by the replay); no rotation (the old id is never
// forgotten); no bound (more than most ids kept).
func TestPublishedIDsAreForgottenUnlessHeld(t *testing.T) {
	t.Parallel()
	community := uuid.New()
	var held bool
	h := fanout.NewHub()
	h.RememberPublished(20*time.Millisecond, 3, func() bool { return held })
	box := subscribeAll(h, community, "s")
	now := time.Now()

	held = true
	h.PublishWritten(community, note(1), nil, 0)
	for i := 2; i <= 3; i++ {
		time.Sleep(50 * time.Millisecond) // more than two windows in all
		h.PublishWritten(community, note(i), nil, 0)
	}
	_, missed := h.Replay(community, note(1), nil, now)
	require.False(t, missed, "held: the id from before the gap is kept")

	held = false
	h.PublishWritten(community, note(4), nil, 0) // rotates: 1-3 move to previous
	time.Sleep(50 * time.Millisecond)
	h.PublishWritten(community, note(5), nil, 0) // rotates: 1-3 forgotten
	_, missed = h.Replay(community, note(1), nil, now)
	require.True(t, missed, "not held: forgotten after two windows")
	box.take()

	// Past most ids nothing more is recorded (the replay refuses such a
	// gap): with 3 kept, a fourth publish is not remembered.
	held = true
	for i := 10; i < 14; i++ {
		h.PublishWritten(community, note(i), nil, 0)
	}
	_, missed = h.Replay(community, note(13), nil, now)
	require.True(t, missed, "beyond most, ids are not kept")
}

// The same signed event stored in two communities (a client sending its
// profile or a note to each community it belongs to) is two stored events:
// each community's subscribers get their copy live, and a replay of one
// community's copy does not stand for the other's.
// Mutation killed: remembering ids without their community (the second
// community's live copy and its replay deliver nothing).
func TestAnEventInTwoCommunitiesIsPublishedInEach(t *testing.T) {
	t.Parallel()
	h := fanout.NewHub()
	h.RememberPublished(time.Hour, 100, func() bool { return false })
	first, second := uuid.New(), uuid.New()
	inFirst := subscribeAll(h, first, "first")
	inSecond := subscribeAll(h, second, "second")

	require.Equal(t, 1, h.PublishWritten(first, note(1), nil, 0).Delivered)
	require.Equal(t, 1, h.PublishWritten(second, note(1), nil, 0).Delivered, "the second community's copy")
	require.Len(t, inFirst.take(), 1)
	require.Len(t, inSecond.take(), 1)
	require.Zero(t, h.PublishWritten(second, note(1), nil, 0).Delivered, "each copy is still published once")

	st, missed := h.Replay(first, note(2), nil, time.Now())
	require.True(t, missed)
	require.Equal(t, 1, st.Delivered)
	st, missed = h.Replay(second, note(2), nil, time.Now())
	require.True(t, missed, "the replay of one community's copy is not the other's")
	require.Equal(t, 1, st.Delivered)
	require.Len(t, inFirst.take(), 1)
	require.Len(t, inSecond.take(), 1)
}
