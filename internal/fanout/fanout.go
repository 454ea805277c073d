// Package fanout delivers freshly committed events to live subscriptions.
// Each subscription filter is indexed under one of its constraints (ids,
// authors, a tag, kinds, or none), so an event is matched against the few
// filters that could want it instead of every subscription.
package fanout

import (
	"context"
	"maps"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"

	"github.com/buzzrelay/buzz/internal/nostr"
)

// Receiver is a connection's outbound queue. Enqueue must not block: it
// returns false when the message could not be queued. It may write the
// message to the socket itself when that needs no waiting.
type Receiver interface {
	Enqueue(msg []byte) bool
}

// EventReceiver is a Receiver that wraps each event in its EVENT envelope
// itself, at write time, in a buffer it reuses: fan-out to many
// subscribers then allocates nothing per delivery. rawEvent is shared by
// every delivery of the event and must not be modified.
type EventReceiver interface {
	Receiver
	EnqueueEvent(subID string, rawEvent []byte) bool
}

// Subscription is one live REQ.
type Subscription struct {
	Receiver Receiver
	ID       string
	Filters  nostr.Filters
	// Allow, when set, is asked for every matching event before delivery:
	// the subscription's own conditions (pinned channels, p-gated kinds),
	// decided without the database. channel is the event's channel (nil for
	// community-global events).
	Allow func(ev *nostr.Event, channel *uuid.UUID) bool
	// Reader is the subscriber's pubkey (hex). A channel event reaches a
	// subscription with a Reader only when the hub's ChannelReaders names
	// it; an empty Reader marks an in-process subscription with no reader
	// to authorize.
	Reader string

	// subscribedAt is when the hub registered the subscription: a replayed
	// event committed well before it was in the REQ's history already.
	subscribedAt time.Time

	// closed is set, under mu, once the subscription is removed (closed,
	// replaced, or its connection gone); a publish that matched it before
	// then delivers nothing to it after. A delivery holds mu for reading
	// while it queues, so removal returns only once no delivery to the
	// subscription is in progress: what the client is sent next (CLOSED,
	// the new REQ's history and EOSE) follows every event of the old one.
	mu     sync.RWMutex
	closed bool

	// While the REQ reads its stored events (HoldLive to ReleaseLive),
	// matched events wait in held instead of reaching the receiver: one
	// committed just before the history's snapshot would otherwise go out
	// twice, live and stored, and a live one would come before the EOSE.
	holding atomic.Bool
	heldMu  sync.Mutex // guards held and heldBytes among deliveries sharing mu
	held    [][]byte
	// heldBytes is the size of the held events; past maxHeld events or
	// maxHeldBytes, overflow is called, once.
	heldBytes             int
	maxHeld, maxHeldBytes int
	overflow              func()
	// sent, for lateCopies after ReleaseLive (nil then), reports the events
	// the history sent; their live copies are dropped (see ReleaseLive).
	sent func(rawEvent []byte) bool
}

// enqueue queues the event for s unless s was removed: queued reports
// whether it was queued, open whether s was still there to try.
func (s *Subscription) enqueue(raw []byte) (queued, open bool) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.closed {
		return false, false
	}
	if s.holding.Load() {
		return s.hold(raw), true
	}
	if s.sent != nil && s.sent(raw) {
		return false, false // the history sent it: neither delivered nor dropped
	}
	return s.toReceiver(raw), true
}

func (s *Subscription) toReceiver(raw []byte) bool {
	if er, ok := s.Receiver.(EventReceiver); ok {
		return er.EnqueueEvent(s.ID, raw)
	}
	return s.Receiver.Enqueue(nostr.EncodeEventRaw(s.ID, raw))
}

// HoldLive makes the events matched from now on wait until ReleaseLive,
// at most maxHeld of them and maxHeldBytes in all; past either, overflow is
// called once and further events are dropped, as a full send queue drops
// them. Call it before Subscribe.
func (s *Subscription) HoldLive(maxHeld, maxHeldBytes int, overflow func()) {
	s.maxHeld, s.maxHeldBytes, s.overflow = maxHeld, maxHeldBytes, overflow
	s.holding.Store(true)
}

func (s *Subscription) hold(raw []byte) bool {
	s.heldMu.Lock()
	defer s.heldMu.Unlock()
	// One event is held whatever its size, as the send queue takes one
	// (an operator may bound its bytes below the largest event).
	if len(s.held) >= s.maxHeld || len(s.held) > 0 && s.heldBytes+len(raw) > s.maxHeldBytes {
		if s.overflow != nil {
			s.overflow()
			s.overflow = nil
		}
		return false
	}
	s.held = append(s.held, raw) // shared and never modified: no copy
	s.heldBytes += len(raw)
	return true
}

// lateCopies is how long after ReleaseLive a delivery of an event the
// history sent is still dropped. An event committed just before the
// history's snapshot is published after its commit: by this process a
// moment later (after the rest of its group, say), by another one over the
// bus some milliseconds later; when the history read was quicker, that
// live copy would follow the EOSE, the event then reaching the client
// twice. As replaySlack, a second covers it with room.
const lateCopies = replaySlack

// ReleaseLive hands the held events to the receiver in the order they
// came, leaving out those sent reports sent already (by the history), and
// delivers directly from then on, still leaving out for lateCopies those
// sent reports. Deliveries wait meanwhile, so none overtakes a held event.
// It reports how many held events were left out. done runs once sent is
// called no more (its buffer may then be reused).
func (s *Subscription) ReleaseLive(sent func(rawEvent []byte) bool, done func()) (skipped int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	held := s.held
	s.held, s.heldBytes = nil, 0
	s.holding.Store(false)
	if s.closed {
		if done != nil {
			done()
		}
		return 0
	}
	s.sent = sent
	time.AfterFunc(lateCopies, func() {
		s.mu.Lock()
		s.sent = nil
		s.mu.Unlock()
		if done != nil {
			done()
		}
	})
	for _, raw := range held {
		if sent(raw) {
			skipped++
			continue
		}
		if !s.toReceiver(raw) {
			break // the receiver is closing itself as slow
		}
	}
	return skipped
}

// close marks s removed, waiting for any delivery to it in progress.
func (s *Subscription) close() {
	s.mu.Lock()
	s.closed = true
	s.mu.Unlock()
}

// ChannelReaders answers who may read one channel: mayRead reports it per
// pubkey. The hub asks it at most once per published channel event, however
// many subscriptions match. atLeast is the channel's readers version the
// event was written under (0: unknown): an answer read before that version
// predates a membership change the event's write already saw, and must not
// be used.
type ChannelReaders func(ctx context.Context, community, channel uuid.UUID, atLeast int64) (mayRead func(pubkey string) bool, err error)

// readersTimeout bounds the one readers lookup of a publish.
const readersTimeout = 2 * time.Second

// Stats are returned by Publish for metrics.
type Stats struct {
	Delivered int
	Dropped   int
}

type key struct {
	receiver Receiver
	id       string
}

// entry is one filter of one subscription.
type entry struct {
	sub    *Subscription
	filter *nostr.Filter
	// repeats is set when one event can reach this subscription more than
	// once: through several filters, or through several values of the one
	// constraint the filter is indexed under (two tags of one name). Only
	// such entries need the per-publish set of subscriptions already
	// matched; fan-out to many one-filter subscriptions builds none.
	repeats bool
}

type bucket map[*entry]struct{}

// index holds one community's subscriptions.
type index struct {
	byID     map[string]bucket
	byAuthor map[string]bucket
	byTag    map[string]bucket // "name:value"
	byKind   map[int]bucket
	any      bucket
	// subs holds each receiver's subscriptions by id, so a closing
	// connection removes its own without scanning its neighbours'.
	subs  map[Receiver]map[string][]*entry
	count int // subscriptions in subs
}

func newIndex() *index {
	return &index{
		byID: map[string]bucket{}, byAuthor: map[string]bucket{}, byTag: map[string]bucket{},
		byKind: map[int]bucket{}, any: bucket{}, subs: map[Receiver]map[string][]*entry{},
	}
}

// Hub routes events to the subscriptions of their own community only.
type Hub struct {
	mu          sync.RWMutex
	communities map[uuid.UUID]*index
	readers     ChannelReaders
	published   atomic.Pointer[publishedIDs] // nil: not remembered (no replays)
}

// NewHub returns an empty hub.
func NewHub() *Hub { return &Hub{communities: map[uuid.UUID]*index{}} }

// SetChannelReaders installs the live read authorization of channel events;
// call it before the hub is used. Without it, no subscription with a Reader
// receives channel events.
func (h *Hub) SetChannelReaders(r ChannelReaders) { h.readers = r }

// Subscribe registers s in community, replacing a subscription with the same
// receiver and id (NIP-01: a REQ reusing an id replaces the old one).
func (h *Hub) Subscribe(community uuid.UUID, s *Subscription) {
	h.mu.Lock()
	defer h.mu.Unlock()
	idx := h.communities[community]
	if idx == nil {
		idx = newIndex()
		h.communities[community] = idx
	}
	k := key{s.Receiver, s.ID}
	idx.remove(k)
	s.subscribedAt = time.Now()
	entries := make([]*entry, 0, len(s.Filters))
	for i := range s.Filters {
		s.Filters[i].IndexTags()
		e := &entry{sub: s, filter: &s.Filters[i]}
		underSeveralTags := idx.place(e, true)
		e.repeats = underSeveralTags || len(s.Filters) > 1
		entries = append(entries, e)
	}
	own := idx.subs[s.Receiver]
	if own == nil {
		own = map[string][]*entry{}
		idx.subs[s.Receiver] = own
	}
	own[s.ID] = entries
	idx.count++
}

// Unsubscribe removes one subscription; it reports whether it existed.
func (h *Hub) Unsubscribe(community uuid.UUID, r Receiver, id string) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	idx := h.communities[community]
	if idx == nil {
		return false
	}
	existed := idx.remove(key{r, id})
	h.dropIfEmpty(community, idx)
	return existed
}

// UnsubscribeAll removes every subscription of a receiver (a closed connection).
func (h *Hub) UnsubscribeAll(community uuid.UUID, r Receiver) {
	h.mu.Lock()
	defer h.mu.Unlock()
	idx := h.communities[community]
	if idx == nil {
		return
	}
	for id := range idx.subs[r] {
		idx.remove(key{r, id})
	}
	h.dropIfEmpty(community, idx)
}

func (h *Hub) dropIfEmpty(community uuid.UUID, idx *index) {
	if len(idx.subs) == 0 {
		delete(h.communities, community)
	}
}

// Count returns the number of live subscriptions in community.
func (h *Hub) Count(community uuid.UUID) int {
	h.mu.RLock()
	defer h.mu.RUnlock()
	if idx := h.communities[community]; idx != nil {
		return idx.count
	}
	return 0
}

// Publish delivers ev, which belongs to channel (nil: community-global), to
// every matching and allowed subscription of community. Matching happens
// under the read lock; authorization and delivery happen after it is
// released, so a slow check never holds up subscribers coming and going.
// Who may read the channel is looked up once for the whole publish (and
// only when a matching subscription needs it), never per subscriber. The
// event is encoded once; each delivery only wraps it with its subscription
// id (by the receiver, when it is an EventReceiver).
//
// A delivery may be a socket write (see Receiver), so a large publish is
// split among up to one goroutine per processor (the caller's among them),
// each delivering its share in order. Publish returns when every share is
// delivered, so one publisher's events still reach each subscriber in the
// order published.
func (h *Hub) Publish(community uuid.UUID, ev *nostr.Event, channel *uuid.UUID) Stats {
	return h.PublishWritten(community, ev, channel, 0)
}

// PublishWritten is Publish for an event whose write read its channel's
// readers version (ingest.Write): the channel's readers are then those of
// that version or a later one, never of a reader set cached before it (a
// member removed through another relay process, whose invalidation has not
// arrived yet, would otherwise still receive it). With RememberPublished,
// a stored event is published once: its id published again while
// remembered (its live copy after a replay sent it) delivers nothing.
func (h *Hub) PublishWritten(community uuid.UUID, ev *nostr.Event, channel *uuid.UUID, readersVersion int64) Stats {
	// A replay may have sent a stored event before its own publish (the
	// catch-up read it once committed, ahead of its live copy).
	if published := h.published.Load(); published != nil && !nostr.IsEphemeral(ev.Kind) && !published.add(community, ev.ID) {
		return Stats{}
	}
	return h.deliver(community, h.match(community, matchedAs(ev, channel)), ev, channel, readersVersion)
}

// matchedAs is ev as subscription filters see it. A NIP-09 deletion sent
// without an h tag is stored in its targets' channel (ingest binds it
// there), and readers pinned (#h) to that channel must learn of it like of
// the messages it deletes: it is matched as if it carried the channel's h
// tag. What is delivered is ev itself, unchanged. The one copy is made per
// publish, never per subscriber.
func matchedAs(ev *nostr.Event, channel *uuid.UUID) *nostr.Event {
	if ev.Kind != nostr.KindDeletion || channel == nil || ev.Tags.First("h") != nil {
		return ev
	}
	view := *ev
	view.Tags = append(slices.Clip(ev.Tags), nostr.Tag{"h", channel.String()})
	return &view
}

// Communities returns the communities with live subscriptions here.
func (h *Hub) Communities() []uuid.UUID {
	h.mu.RLock()
	defer h.mu.RUnlock()
	return slices.Collect(maps.Keys(h.communities))
}

// replaySlack is how long before a subscription's registration an event's
// write may have begun and still have committed after the subscription's
// history was read: a write takes milliseconds, so a second covers it with
// room (and clocks of the database and the relay a little apart).
const replaySlack = time.Second

// Replay publishes a stored event this process may have missed live (see
// RememberPublished), whose write the database received at receivedAt.
// An event this hub published already is not sent again, and a
// subscription registered more than replaySlack after receivedAt is
// skipped: its REQ's history held the event. The readers of its channel
// are looked up afresh (readers version unknown). missed reports whether
// the hub had not published the event.
func (h *Hub) Replay(community uuid.UUID, ev *nostr.Event, channel *uuid.UUID, receivedAt time.Time) (stats Stats, missed bool) {
	if published := h.published.Load(); published != nil && !published.add(community, ev.ID) {
		return Stats{}, false
	}
	newest := receivedAt.Add(replaySlack)
	matched := slices.DeleteFunc(h.match(community, matchedAs(ev, channel)), func(s *Subscription) bool {
		return s.subscribedAt.After(newest)
	})
	return h.deliver(community, matched, ev, channel, 0), true
}

// deliver hands ev to the matched subscriptions of community.
func (h *Hub) deliver(community uuid.UUID, matched []*Subscription, ev *nostr.Event, channel *uuid.UUID, readersVersion int64) Stats {
	if len(matched) == 0 {
		return Stats{}
	}
	p := &publication{ev: ev, channel: channel, raw: ev.AppendJSON(nil)}
	p.mayRead = sync.OnceValue(func() func(string) bool {
		return h.channelReaders(community, *channel, readersVersion)
	})
	shares := min(runtime.GOMAXPROCS(0), len(matched)/minDeliveriesPerShare)
	if shares <= 1 {
		return p.deliver(matched)
	}
	// Each share reports into its own slot; a panic is raised again on the
	// caller's goroutine, whose own recovery (a connection's) then applies.
	size := (len(matched) + shares - 1) / shares
	results := make([]shareResult, shares)
	var wg sync.WaitGroup
	for i := 1; i*size < len(matched); i++ {
		share, r := matched[i*size:min((i+1)*size, len(matched))], &results[i]
		wg.Go(func() {
			defer func() { r.panicked = recover() }()
			r.stats = p.deliver(share)
		})
	}
	results[0].stats = p.deliver(matched[:size])
	wg.Wait()
	var total Stats
	for _, r := range results {
		if r.panicked != nil {
			panic(r.panicked)
		}
		total.Delivered += r.stats.Delivered
		total.Dropped += r.stats.Dropped
	}
	return total
}

// shareResult is what delivering one share of a publish came to.
type shareResult struct {
	stats    Stats
	panicked any
}

// minDeliveriesPerShare is the fewest deliveries worth a goroutine of their
// own: a delivery that writes to its socket costs several microseconds,
// starting a goroutine about one.
const minDeliveriesPerShare = 32

// publication is one event being published: what every delivery shares.
type publication struct {
	ev      *nostr.Event
	channel *uuid.UUID
	raw     []byte                          // the event's JSON
	mayRead func() func(pubkey string) bool // the channel's readers, looked up once
}

// deliver hands the event to each of subs its own conditions allow.
func (p *publication) deliver(subs []*Subscription) Stats {
	var stats Stats
	for _, sub := range subs {
		if sub.Allow != nil && !sub.Allow(p.ev, p.channel) {
			continue
		}
		if p.channel != nil && sub.Reader != "" && !p.mayRead()(sub.Reader) {
			continue
		}
		switch queued, open := sub.enqueue(p.raw); {
		case queued:
			stats.Delivered++
		case open:
			stats.Dropped++
		}
	}
	return stats
}

// channelReaders looks up who may read channel; on failure (or without a
// ChannelReaders) nobody may, so an outage withholds events rather than
// leaking them.
func (h *Hub) channelReaders(community, channel uuid.UUID, atLeast int64) func(string) bool {
	nobody := func(string) bool { return false }
	if h.readers == nil {
		return nobody
	}
	ctx, cancel := context.WithTimeout(context.Background(), readersTimeout)
	defer cancel()
	mayRead, err := h.readers(ctx, community, channel, atLeast)
	if err != nil {
		return nobody
	}
	return mayRead
}

// match returns each subscription with a filter matching ev, once.
func (h *Hub) match(community uuid.UUID, ev *nostr.Event) []*Subscription {
	h.mu.RLock()
	defer h.mu.RUnlock()
	idx := h.communities[community]
	if idx == nil {
		return nil
	}
	var (
		matched []*Subscription
		seen    map[*Subscription]struct{}
	)
	visit := func(b bucket) {
		for e := range b {
			if !e.filter.Matches(ev) {
				continue
			}
			if e.repeats {
				if _, done := seen[e.sub]; done {
					continue
				}
				if seen == nil {
					seen = map[*Subscription]struct{}{}
				}
				seen[e.sub] = struct{}{}
			}
			if matched == nil {
				matched = make([]*Subscription, 0, len(b))
			}
			matched = append(matched, e.sub)
		}
	}
	visit(idx.byID[ev.ID])
	visit(idx.byAuthor[ev.PubKey])
	visit(idx.byKind[ev.Kind])
	var keys [8]string
	for _, k := range idx.appendTagKeys(keys[:0], ev) {
		visit(idx.byTag[k])
	}
	visit(idx.any)
	return matched
}

// appendTagKeys appends to keys the distinct index keys ("name:value") of
// ev's single-letter tags that some subscription is placed under.
// Distinct: an event may repeat a tag, and a filter placed under that tag
// alone is not deduplicated by match, so visiting its bucket twice would
// deliver the event to it twice. Only keys with a bucket are built: the
// lookup itself allocates nothing, so a tag nobody follows costs no string.
func (idx *index) appendTagKeys(keys []string, ev *nostr.Event) []string {
	for _, tag := range ev.Tags {
		if len(tag) >= 2 && len(tag[0]) == 1 && idx.byTag[tag[0]+":"+tag[1]] != nil {
			keys = append(keys, tag[0]+":"+tag[1])
		}
	}
	slices.Sort(keys)
	return slices.Compact(keys)
}

// place adds e to (or removes it from) the buckets of the one constraint
// chosen for its filter, most selective first. A filter with a present but
// empty list can match nothing and ends up in no bucket. It reports whether
// the filter sits under several tag values: an event has one id, author
// and kind, but may carry several of those tags.
func (idx *index) place(e *entry, add bool) (underSeveralTags bool) {
	f := e.filter
	switch {
	case f.IDs != nil:
		update(idx.byID, f.IDs, e, add)
	case f.Authors != nil:
		update(idx.byAuthor, f.Authors, e, add)
	case len(f.Tags) > 0:
		name := slices.Min(slices.Collect(maps.Keys(f.Tags)))
		keys := make([]string, len(f.Tags[name]))
		for i, v := range f.Tags[name] {
			keys[i] = name + ":" + v
		}
		update(idx.byTag, keys, e, add)
		return len(keys) > 1
	case f.Kinds != nil:
		update(idx.byKind, f.Kinds, e, add)
	case add:
		idx.any[e] = struct{}{}
	default:
		delete(idx.any, e)
	}
	return false
}

// update adds or removes e under keys, dropping buckets that become empty so
// a long-lived relay does not accumulate keys.
func update[K comparable](m map[K]bucket, keys []K, e *entry, add bool) {
	for _, k := range keys {
		b := m[k]
		if add {
			if b == nil {
				b = bucket{}
				m[k] = b
			}
			b[e] = struct{}{}
		} else if b != nil {
			delete(b, e)
			if len(b) == 0 {
				delete(m, k)
			}
		}
	}
}

func (idx *index) remove(k key) bool {
	own := idx.subs[k.receiver]
	entries, ok := own[k.id]
	if !ok {
		return false
	}
	for _, e := range entries {
		idx.place(e, false)
	}
	if len(entries) > 0 {
		entries[0].sub.close()
	}
	delete(own, k.id)
	if len(own) == 0 {
		delete(idx.subs, k.receiver)
	}
	idx.count--
	return true
}
