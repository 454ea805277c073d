package fanout_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/buzzrelay/buzz/internal/fanout"
	"github.com/buzzrelay/buzz/internal/nostr"
)

type inbox struct {
	mu   sync.Mutex
	msgs []string
	full bool
}

func (b *inbox) Enqueue(msg []byte) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.full {
		return false
	}
	b.msgs = append(b.msgs, string(msg))
	return true
}

func (b *inbox) take() []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	out := b.msgs
	b.msgs = nil
	return out
}

var hexKeys = func() []string {
	out := make([]string, 4)
	for i := range out {
		out[i] = fmt.Sprintf("%064x", i+1)
	}
	return out
}()

func randomEvent(rng *rand.Rand, i int) *nostr.Event {
	tags := nostr.Tags{}
	for j := rng.IntN(3); j > 0; j-- {
		tags = append(tags, nostr.Tag{[]string{"e", "p", "t"}[rng.IntN(3)], []string{"a", "b", "c"}[rng.IntN(3)]})
	}
	if len(tags) > 0 && rng.IntN(3) == 0 {
		tags = append(tags, tags[0]) // nothing refuses a repeated tag
	}
	return &nostr.Event{
		ID: fmt.Sprintf("%064x", i), PubKey: hexKeys[rng.IntN(len(hexKeys))],
		Kind: []int{1, 7, 9}[rng.IntN(3)], CreatedAt: int64(100 + rng.IntN(10)), Tags: tags,
	}
}

func randomFilter(rng *rand.Rand) nostr.Filter {
	var f nostr.Filter
	if rng.IntN(2) == 0 {
		f.Kinds = []int{[]int{1, 7, 9}[rng.IntN(3)]}
	}
	if rng.IntN(3) == 0 {
		f.Authors = []string{hexKeys[rng.IntN(len(hexKeys))]}
	}
	if rng.IntN(3) == 0 {
		values := []string{[]string{"a", "b", "c"}[rng.IntN(3)]}
		if rng.IntN(2) == 0 { // an event carrying both can reach it twice
			values = append(values, []string{"a", "b", "c"}[rng.IntN(3)])
		}
		f.Tags = map[string][]string{[]string{"e", "p", "t"}[rng.IntN(3)]: values}
	}
	if rng.IntN(5) == 0 {
		f.IDs = []string{fmt.Sprintf("%064x", rng.IntN(50))}
	}
	if rng.IntN(4) == 0 {
		s := int64(100 + rng.IntN(10))
		f.Since = &s
	}
	if rng.IntN(10) == 0 {
		f.Kinds = []int{} // present but empty: matches nothing
	}
	return f
}

// The index must deliver exactly what brute-force matching of every
// subscription would: no event missed because a filter was indexed under
// one constraint, none delivered twice to a subscription with several
// matching filters.
func TestPublishAgreesWithBruteForce(t *testing.T) {
	t.Parallel()
	rng := rand.New(rand.NewPCG(7, 11))
	hub := fanout.NewHub()
	community := uuid.New()
	type sub struct {
		box     *inbox
		id      string
		filters nostr.Filters
	}
	var subs []sub
	for i := 0; i < 60; i++ {
		s := sub{box: &inbox{}, id: fmt.Sprint("s", i)}
		for j := 1 + rng.IntN(3); j > 0; j-- {
			s.filters = append(s.filters, randomFilter(rng))
		}
		hub.Subscribe(community, &fanout.Subscription{Receiver: s.box, ID: s.id, Filters: s.filters})
		subs = append(subs, s)
	}
	for i := 0; i < 50; i++ {
		ev := randomEvent(rng, i)
		want := 0
		for _, s := range subs {
			if s.filters.Matches(ev) {
				want++
			}
		}
		stats := hub.Publish(community, ev, nil)
		require.Equal(t, want, stats.Delivered, "event %d", i)
		for _, s := range subs {
			got := s.box.take()
			if s.filters.Matches(ev) {
				require.Len(t, got, 1, "sub %s event %d", s.id, i)
				require.Equal(t, string(nostr.EncodeEvent(s.id, ev)), got[0])
			} else {
				require.Empty(t, got, "sub %s event %d", s.id, i)
			}
		}
	}
}

func TestCommunitiesAreIsolated(t *testing.T) {
	t.Parallel()
	hub := fanout.NewHub()
	a, b := uuid.New(), uuid.New()
	boxA, boxB := &inbox{}, &inbox{}
	hub.Subscribe(a, &fanout.Subscription{Receiver: boxA, ID: "x", Filters: nostr.Filters{{}}})
	hub.Subscribe(b, &fanout.Subscription{Receiver: boxB, ID: "x", Filters: nostr.Filters{{}}})
	hub.Publish(a, &nostr.Event{ID: hexKeys[0], PubKey: hexKeys[1], Kind: 1, Tags: nostr.Tags{}}, nil)
	require.Len(t, boxA.take(), 1)
	require.Empty(t, boxB.take())
}

func TestReplaceUnsubscribeAndAllow(t *testing.T) {
	t.Parallel()
	hub := fanout.NewHub()
	c := uuid.New()
	box := &inbox{}
	ev := &nostr.Event{ID: hexKeys[0], PubKey: hexKeys[1], Kind: 1, Tags: nostr.Tags{{"t", "a"}}}
	hub.Subscribe(c, &fanout.Subscription{Receiver: box, ID: "s", Filters: nostr.Filters{{Kinds: []int{7}}}})
	// Same id replaces the old filters.
	hub.Subscribe(c, &fanout.Subscription{Receiver: box, ID: "s", Filters: nostr.Filters{{Kinds: []int{1}}}})
	require.Equal(t, 1, hub.Count(c))
	hub.Publish(c, ev, nil)
	require.Len(t, box.take(), 1)

	// Allow vetoes delivery (read authorization).
	hub.Subscribe(c, &fanout.Subscription{Receiver: box, ID: "s", Filters: nostr.Filters{{Kinds: []int{1}}}, Allow: func(*nostr.Event, *uuid.UUID) bool { return false }})
	require.Zero(t, hub.Publish(c, ev, nil).Delivered)

	require.True(t, hub.Unsubscribe(c, box, "s"))
	require.False(t, hub.Unsubscribe(c, box, "s"))
	require.Zero(t, hub.Publish(c, ev, nil).Delivered)
	require.Zero(t, hub.Count(c))

	hub.Subscribe(c, &fanout.Subscription{Receiver: box, ID: "1", Filters: nostr.Filters{{}}})
	hub.Subscribe(c, &fanout.Subscription{Receiver: box, ID: "2", Filters: nostr.Filters{{Authors: []string{hexKeys[1]}}}})
	hub.UnsubscribeAll(c, box)
	require.Zero(t, hub.Count(c))
}

func TestFullQueueCountsAsDropped(t *testing.T) {
	t.Parallel()
	hub := fanout.NewHub()
	c := uuid.New()
	hub.Subscribe(c, &fanout.Subscription{Receiver: &inbox{full: true}, ID: "slow", Filters: nostr.Filters{{}}})
	hub.Subscribe(c, &fanout.Subscription{Receiver: &inbox{}, ID: "fast", Filters: nostr.Filters{{}}})
	stats := hub.Publish(c, &nostr.Event{ID: hexKeys[0], PubKey: hexKeys[1], Kind: 1, Tags: nostr.Tags{}}, nil)
	require.Equal(t, fanout.Stats{Delivered: 1, Dropped: 1}, stats)
}

// BenchmarkPublish1000Subscribers measures one event against 1,000 live
// subscriptions of which 10 match (authors differ; kinds are shared).
func BenchmarkPublish1000Subscribers(b *testing.B) {
	hub := fanout.NewHub()
	c := uuid.New()
	for i := 0; i < 1000; i++ {
		author := fmt.Sprintf("%064x", i%100)
		hub.Subscribe(c, &fanout.Subscription{Receiver: &discard{}, ID: fmt.Sprint(i), Filters: nostr.Filters{{Authors: []string{author}, Kinds: []int{1}}}})
	}
	ev := &nostr.Event{ID: hexKeys[0], PubKey: fmt.Sprintf("%064x", 7), Kind: 1, Tags: nostr.Tags{{"t", "x"}}, Content: "hello"}
	b.ReportAllocs()
	for b.Loop() {
		if hub.Publish(c, ev, nil).Delivered != 10 {
			b.Fatal("wrong delivery count")
		}
	}
}

type discard struct{}

func (discard) Enqueue([]byte) bool { return true }

// eventInbox records what an EventReceiver is handed.
type eventInbox struct {
	inbox
	subIDs []string
	raws   [][]byte
}

func (b *eventInbox) EnqueueEvent(subID string, raw []byte) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.subIDs = append(b.subIDs, subID)
	b.raws = append(b.raws, raw)
	return true
}

// An EventReceiver is handed the event's JSON, encoded once and shared by
// every delivery, with its subscription id, and wraps it itself; a plain
// Receiver still gets the whole envelope. Both count as delivered.
// Mutations killed: Publish wrapping the event per subscriber for an
// EventReceiver (an allocation per delivery: EnqueueEvent is never called);
// encoding the event per subscriber (the JSON is not shared).
func TestEventReceiverSharesTheEncodedEvent(t *testing.T) {
	t.Parallel()
	hub := fanout.NewHub()
	c := uuid.New()
	receivers := []*eventInbox{{}, {}, {}}
	for i, r := range receivers {
		hub.Subscribe(c, &fanout.Subscription{Receiver: r, ID: fmt.Sprint("sub-", i), Filters: nostr.Filters{{Kinds: []int{1}}}})
	}
	plain := &inbox{}
	hub.Subscribe(c, &fanout.Subscription{Receiver: plain, ID: "plain", Filters: nostr.Filters{{Kinds: []int{1}}}})
	ev := &nostr.Event{ID: hexKeys[0], PubKey: hexKeys[1], Kind: 1, Content: "hello"}
	require.Equal(t, 4, hub.Publish(c, ev, nil).Delivered)
	want := ev.AppendJSON(nil)
	for i, r := range receivers {
		require.Equal(t, []string{fmt.Sprint("sub-", i)}, r.subIDs)
		require.Len(t, r.raws, 1)
		require.Equal(t, string(want), string(r.raws[0]))
		require.Same(t, &receivers[0].raws[0][0], &r.raws[0][0], "one encoding shared by every delivery")
		require.Empty(t, r.take())
	}
	require.Equal(t, []string{string(nostr.EncodeEventRaw("plain", want))}, plain.take())
}

// A filter reached through several of an event's tags gets the event
// once: a filter indexed under two values of one tag and an event carrying
// both, or a filter under one tag the event repeats (a subscriber's send
// queue would otherwise fill with copies of one event and close it as a
// slow consumer).
// Mutations killed: deduplicating only subscriptions with several filters;
// visiting the tag buckets once per tag of the event.
func TestOneDeliveryThroughSeveralTags(t *testing.T) {
	t.Parallel()
	repeated := nostr.Tags{{"t", "x"}}
	for range 50 {
		repeated = append(repeated, nostr.Tag{"p", hexKeys[2]})
	}
	for _, c := range []struct {
		name   string
		filter nostr.Filter
		tags   nostr.Tags
	}{
		{"two values of one tag", nostr.Filter{Tags: map[string][]string{"t": {"a", "b"}}}, nostr.Tags{{"t", "a"}, {"t", "b"}}},
		{"a repeated tag", nostr.Filter{Tags: map[string][]string{"p": {hexKeys[2]}}}, repeated},
	} {
		hub := fanout.NewHub()
		community := uuid.New()
		box := &inbox{}
		hub.Subscribe(community, &fanout.Subscription{Receiver: box, ID: "s", Filters: nostr.Filters{c.filter}})
		ev := &nostr.Event{ID: hexKeys[0], PubKey: hexKeys[1], Kind: 1, Tags: c.tags}
		require.Equal(t, 1, hub.Publish(community, ev, nil).Delivered, c.name)
		require.Len(t, box.take(), 1, c.name)
	}
}

// Closing one connection removes its subscriptions and no one else's.
// Mutation killed: removing a receiver's subscriptions from the wrong
// receiver's set (the other box stops receiving, or the count drifts).
func TestUnsubscribeAllLeavesOtherReceivers(t *testing.T) {
	t.Parallel()
	hub := fanout.NewHub()
	c := uuid.New()
	closing, staying := &inbox{}, &inbox{}
	for _, id := range []string{"a", "b", "c"} {
		hub.Subscribe(c, &fanout.Subscription{Receiver: closing, ID: id, Filters: nostr.Filters{{Kinds: []int{1}}}})
		hub.Subscribe(c, &fanout.Subscription{Receiver: staying, ID: id, Filters: nostr.Filters{{Kinds: []int{1}}}})
	}
	hub.UnsubscribeAll(c, closing)
	require.Equal(t, 3, hub.Count(c))
	require.False(t, hub.Unsubscribe(c, closing, "a"))
	ev := &nostr.Event{ID: hexKeys[0], PubKey: hexKeys[1], Kind: 1}
	require.Equal(t, 3, hub.Publish(c, ev, nil).Delivered)
	require.Empty(t, closing.take())
	require.Len(t, staying.take(), 3)
	hub.UnsubscribeAll(c, staying)
	require.Zero(t, hub.Count(c))
}

// BenchmarkCloseAmongManySubscriptions: one connection with 8
// subscriptions closes in a community holding 10,000 other connections'
// 80,000. The hub's write lock is held for the whole of it, stopping every
// publish and REQ of the community meanwhile.
func BenchmarkCloseAmongManySubscriptions(b *testing.B) {
	hub := fanout.NewHub()
	c := uuid.New()
	subscribe := func(r fanout.Receiver) {
		for i := range 8 {
			hub.Subscribe(c, &fanout.Subscription{Receiver: r, ID: fmt.Sprint(i), Filters: nostr.Filters{{Kinds: []int{i}}}})
		}
	}
	for range 10_000 {
		subscribe(&inbox{})
	}
	b.ResetTimer()
	for b.Loop() {
		r := &inbox{}
		subscribe(r)
		hub.UnsubscribeAll(c, r)
	}
}

// A publish to many subscriptions is split among goroutines: every
// subscription still gets each event once, and one publisher's events in
// the order published, and Publish returns only once all are delivered.
// Mutations killed: a share left out (the last chunk dropped), Publish
// returning before its shares are delivered (counts short when checked),
// stats of one share only.
func TestLargePublishReachesEverySubscriptionOnceInOrder(t *testing.T) {
	t.Parallel()
	hub := fanout.NewHub()
	c := uuid.New()
	const subscribers, events = 1001, 30 // not a multiple of the share size
	boxes := make([]*inbox, subscribers)
	for i := range boxes {
		boxes[i] = &inbox{}
		hub.Subscribe(c, &fanout.Subscription{Receiver: boxes[i], ID: fmt.Sprint("s", i), Filters: nostr.Filters{{Kinds: []int{1}}}})
	}
	for n := range events {
		ev := &nostr.Event{ID: fmt.Sprintf("%064x", n), PubKey: hexKeys[0], Kind: 1, Content: fmt.Sprint(n)}
		require.Equal(t, fanout.Stats{Delivered: subscribers}, hub.Publish(c, ev, nil))
		for i, b := range boxes {
			b.mu.Lock()
			got := len(b.msgs)
			b.mu.Unlock()
			require.Equal(t, n+1, got, "subscription %d after event %d", i, n)
		}
	}
	for i, b := range boxes {
		for n, msg := range b.take() {
			require.Contains(t, msg, fmt.Sprintf(`"content":"%d"`, n), "subscription %d, event %d", i, n)
		}
	}
}

type panicking struct{ inbox }

func (p *panicking) Enqueue([]byte) bool { panic("receiver bug") }

// A panic while delivering a share on another goroutine is raised on the
// publishing goroutine, where the connection's own recovery applies,
// rather than ending the process.
// Mutation killed: shares delivered without recovering (the test binary
// dies).
func TestPanicInAShareReachesThePublisher(t *testing.T) {
	t.Parallel()
	hub := fanout.NewHub()
	c := uuid.New()
	const subscribers = 200
	for i := range subscribers - 1 {
		hub.Subscribe(c, &fanout.Subscription{Receiver: &inbox{}, ID: fmt.Sprint("s", i), Filters: nostr.Filters{{Kinds: []int{1}}}})
	}
	// Subscriptions are matched in map order: the panicking one lands in
	// either share; run enough publishes that it is in another goroutine's.
	hub.Subscribe(c, &fanout.Subscription{Receiver: &panicking{}, ID: "bad", Filters: nostr.Filters{{Kinds: []int{1}}}})
	ev := &nostr.Event{ID: hexKeys[0], PubKey: hexKeys[1], Kind: 1}
	for range 20 {
		require.PanicsWithValue(t, "receiver bug", func() { hub.Publish(c, ev, nil) })
	}
}

// A publish that matched a subscription before it was closed or replaced
// delivers nothing to it afterwards: the client would otherwise get an
// event under a subscription it closed, or, for a REQ reusing the id, an
// event of the old filters under the new subscription, after its EOSE.
// Between matching and delivery a publish may wait for the channel's
// readers (a database round trip on a cold cache), so this is not a
// nanosecond window. Mutation killed: deliver not checking whether the
// subscription was removed (the closed and the replaced subscriptions each
// receive the kind 9 event).
func TestNoDeliveryAfterCloseOrReplace(t *testing.T) {
	t.Parallel()
	community, channel := uuid.New(), uuid.New()
	hub := fanout.NewHub()
	entered, release := make(chan struct{}), make(chan struct{})
	hub.SetChannelReaders(func(context.Context, uuid.UUID, uuid.UUID, int64) (func(string) bool, error) {
		entered <- struct{}{}
		<-release
		return func(string) bool { return true }, nil
	})
	ev := &nostr.Event{ID: hexKeys[0], PubKey: hexKeys[1], Kind: 9}
	for name, change := range map[string]func(box *inbox){
		"closed": func(box *inbox) { require.True(t, hub.Unsubscribe(community, box, "s")) },
		"replaced": func(box *inbox) {
			hub.Subscribe(community, &fanout.Subscription{Receiver: box, ID: "s", Filters: nostr.Filters{{}}})
		},
		"connection gone": func(box *inbox) { hub.UnsubscribeAll(community, box) },
	} {
		box := &inbox{}
		hub.Subscribe(community, &fanout.Subscription{Receiver: box, ID: "s", Filters: nostr.Filters{{Kinds: []int{9}}}, Reader: "member"})
		done := make(chan fanout.Stats)
		go func() { done <- hub.Publish(community, ev, &channel) }()
		<-entered // matched; waiting for the channel's readers
		change(box)
		close(release)
		require.Zero(t, (<-done).Delivered, name)
		require.Empty(t, box.take(), "%s: nothing delivered after the subscription went", name)
		release = make(chan struct{})
		hub.UnsubscribeAll(community, box)
	}
}

// The hub indexes a subscription's long tag lists when it subscribes, so
// an event with many tags is not matched value by value against each.
// Mutation killed: Subscribe not calling IndexTags (the filter, whose list
// is changed behind the hub's back, is matched by its list, not its set).
func TestSubscribeIndexesLongTagLists(t *testing.T) {
	t.Parallel()
	hub := fanout.NewHub()
	c := uuid.New()
	vals := make([]string, 100)
	for i := range vals {
		vals[i] = fmt.Sprint("v", i)
	}
	box := &inbox{}
	sub := &fanout.Subscription{Receiver: box, ID: "s", Filters: nostr.Filters{{Kinds: []int{1}, Tags: map[string][]string{"a": {"x"}, "t": vals}}}}
	hub.Subscribe(c, sub)
	sub.Filters[0].Tags["t"] = []string{"unindexed"}
	ev := &nostr.Event{ID: hexKeys[0], PubKey: hexKeys[1], Kind: 1, Tags: nostr.Tags{{"a", "x"}, {"t", "v42"}}}
	require.Equal(t, 1, hub.Publish(c, ev, nil).Delivered)
}

// BenchmarkPublishToAll1000 is the relay's side of buzz-bench's fan-out
// scenario without the sockets: 1,000 subscriptions of the bench's shape
// (kind 1 under one #t value, a subscription id each), every one matching
// the event. It times what the hub spends per delivery before the
// receiver's write: matching, the subscription's checks, the hand-off.
func BenchmarkPublishToAll1000(b *testing.B) {
	hub := fanout.NewHub()
	c := uuid.New()
	for i := range 1000 {
		hub.Subscribe(c, &fanout.Subscription{
			Receiver: &countingEventReceiver{}, ID: "live", Reader: fmt.Sprintf("%064x", i),
			Filters: nostr.Filters{{Kinds: []int{1}, Tags: map[string][]string{"t": {"fanout-run"}}}},
			Allow:   func(*nostr.Event, *uuid.UUID) bool { return true },
		})
	}
	ev := &nostr.Event{ID: hexKeys[0], PubKey: hexKeys[1], Kind: 1, Tags: nostr.Tags{{"t", "fanout-run"}}, Content: "hello"}
	b.ReportAllocs()
	for b.Loop() {
		if hub.Publish(c, ev, nil).Delivered != 1000 {
			b.Fatal("wrong delivery count")
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*1000), "ns/delivery")
}

// countingEventReceiver takes every event and keeps nothing.
type countingEventReceiver struct{ n atomic.Int64 }

func (r *countingEventReceiver) Enqueue([]byte) bool { r.n.Add(1); return true }
func (r *countingEventReceiver) EnqueueEvent(string, []byte) bool {
	r.n.Add(1)
	return true
}
