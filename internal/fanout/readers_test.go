package fanout_test

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/buzzrelay/buzz/internal/fanout"
	"github.com/buzzrelay/buzz/internal/nostr"
)

// A channel event's readers are looked up once per publish, whatever the
// number of matching subscriptions (enough here for the publish to be split
// among goroutines); only named readers receive it, and a failed lookup
// withholds it from every reader. Mutations killed: looking readers up per
// subscription or per share of the publish (calls == subscriptions, or 2),
// skipping the check (the outsider receives), failing open on error.
func TestChannelReadersAskedOncePerPublish(t *testing.T) {
	t.Parallel()
	community, channel := uuid.New(), uuid.New()
	hub := fanout.NewHub()
	calls := 0
	var fail error
	hub.SetChannelReaders(func(_ context.Context, c, ch uuid.UUID, _ int64) (func(string) bool, error) {
		calls++
		require.Equal(t, community, c)
		require.Equal(t, channel, ch)
		return func(pk string) bool { return pk != "outsider" }, fail
	})
	boxes := map[string]*inbox{}
	const subscribers = 200
	for i := range subscribers {
		reader := fmt.Sprint("member", i)
		if i == 0 {
			reader = "outsider"
		}
		boxes[reader] = &inbox{}
		hub.Subscribe(community, &fanout.Subscription{Receiver: boxes[reader], ID: "s", Filters: nostr.Filters{{}}, Reader: reader})
	}
	ev := &nostr.Event{ID: fmt.Sprintf("%064x", 1), PubKey: hexKeys[0], Kind: 9}

	st := hub.Publish(community, ev, &channel)
	require.Equal(t, 1, calls)
	require.Equal(t, subscribers-1, st.Delivered)
	require.Empty(t, boxes["outsider"].take())

	// A community-global event needs no lookup.
	calls = 0
	st = hub.Publish(community, ev, nil)
	require.Zero(t, calls)
	require.Equal(t, subscribers, st.Delivered)

	for _, b := range boxes {
		b.take()
	}
	fail = errors.New("database down")
	st = hub.Publish(community, ev, &channel)
	require.Zero(t, st.Delivered, "a failed lookup delivers to nobody")
}
