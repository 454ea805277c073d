package fanout_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/buzzrelay/buzz/internal/fanout"
	"github.com/buzzrelay/buzz/internal/nostr"
)

// A NIP-09 deletion without an h tag is stored in its targets' channel; it
// reaches the subscriptions pinned (#h) to that channel whose reader may
// still read it, whatever constraint their filter is indexed under, and no
// other; other kinds stored in a channel without an h tag (its relay-signed
// lists) are matched as sent. Mutations killed: matching the deletion as
// sent (no pinned subscription receives it); matching every kind as if it
// carried its channel's h tag (the list reaches #h pins); skipping the
// readers check for deletions (the removed member receives it); replaying
// the deletion as sent.
func TestDeletionWithoutHTagReachesItsChannelPins(t *testing.T) {
	t.Parallel()
	community, channel, other := uuid.New(), uuid.New(), uuid.New()
	hub := fanout.NewHub()
	hub.SetChannelReaders(func(_ context.Context, _, _ uuid.UUID, _ int64) (func(string) bool, error) {
		return func(pk string) bool { return pk != "removed" }, nil
	})
	target := fmt.Sprintf("%064x", 99)
	subs := map[string]nostr.Filter{
		"pinned":          {Tags: map[string][]string{"h": {channel.String()}}},
		"pinned deletion": {Kinds: []int{nostr.KindDeletion}, Tags: map[string][]string{"h": {channel.String(), other.String()}}},
		"pinned by e too": {Tags: map[string][]string{"e": {target}, "h": {channel.String()}}}, // placed under #e
		"messages only":   {Kinds: []int{9}, Tags: map[string][]string{"h": {channel.String()}}},
		"other channel":   {Tags: map[string][]string{"h": {other.String()}}},
		"removed":         {Tags: map[string][]string{"h": {channel.String()}}},
	}
	boxes := map[string]*inbox{}
	for name, f := range subs {
		boxes[name] = &inbox{}
		reader := "member"
		if name == "removed" {
			reader = "removed"
		}
		hub.Subscribe(community, &fanout.Subscription{Receiver: boxes[name], ID: "s", Filters: nostr.Filters{f}, Reader: reader})
	}
	received := func() []string {
		var got []string
		for name, b := range boxes {
			if len(b.take()) > 0 {
				got = append(got, name)
			}
		}
		return got
	}
	deletion := &nostr.Event{ID: fmt.Sprintf("%064x", 1), PubKey: hexKeys[0], Kind: nostr.KindDeletion, Tags: nostr.Tags{{"e", target}, {"k", "9"}}}

	st := hub.Publish(community, deletion, &channel)
	require.ElementsMatch(t, []string{"pinned", "pinned deletion", "pinned by e too"}, received())
	require.Equal(t, 3, st.Delivered)
	require.Len(t, deletion.Tags, 2, "the published event is not changed")
	require.NotContains(t, string(deletion.AppendJSON(nil)), channel.String())

	hub.Publish(community, deletion, nil)
	require.Empty(t, received(), "a community-global deletion names no channel")

	st = hub.Publish(community, deletion, &other)
	require.ElementsMatch(t, []string{"pinned deletion", "other channel"}, received())
	require.Equal(t, 2, st.Delivered)

	list := &nostr.Event{ID: fmt.Sprintf("%064x", 2), PubKey: hexKeys[0], Kind: 39000, Tags: nostr.Tags{{"d", channel.String()}}}
	hub.Publish(community, list, &channel)
	require.Empty(t, received(), "a channel list is pinned by #d, not #h")

	// A deletion replayed after a gap in cross-relay traffic is matched the same way.
	replayed := &nostr.Event{ID: fmt.Sprintf("%064x", 3), PubKey: hexKeys[0], Kind: nostr.KindDeletion, Tags: nostr.Tags{{"e", target}}}
	hub.Replay(community, replayed, &channel, time.Now())
	require.ElementsMatch(t, []string{"pinned", "pinned deletion", "pinned by e too"}, received())
}

// Matching a deletion against its channel's pins costs the publish, not each
// subscriber: 1,000 pinned subscriptions allocate no more per publish than
// 10 do, give or take the goroutines a large publish is split among.
// Mutation killed: building the channel's h tag per subscription matched.
func TestDeletionFanOutAllocatesNothingPerSubscriber(t *testing.T) {
	channel := uuid.New()
	allocs := func(subscribers int) float64 {
		hub := fanout.NewHub()
		community := uuid.New()
		for i := range subscribers {
			hub.Subscribe(community, &fanout.Subscription{Receiver: discardEvents{}, ID: fmt.Sprint(i), Filters: nostr.Filters{{Tags: map[string][]string{"h": {channel.String()}}}}})
		}
		deletion := &nostr.Event{ID: fmt.Sprintf("%064x", 1), PubKey: hexKeys[0], Kind: nostr.KindDeletion, Tags: nostr.Tags{{"e", hexKeys[1]}}}
		return testing.AllocsPerRun(20, func() {
			if hub.Publish(community, deletion, &channel).Delivered != subscribers {
				panic("not delivered to every pinned subscription")
			}
		})
	}
	few, many := allocs(10), allocs(1000)
	require.Less(t, many-few, float64(100), "allocations for 10 subscribers: %v, for 1,000: %v", few, many)
}

// discardEvents is an EventReceiver (as a connection is) that keeps nothing.
type discardEvents struct{ discard }

func (discardEvents) EnqueueEvent(string, []byte) bool { return true }
