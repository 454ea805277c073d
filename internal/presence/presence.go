// Package presence keeps who is present in a channel: the last presence
// event (kind 20001) each pubkey announced there, for a TTL. Presence events
// are ephemeral, never stored; a subscriber who arrives after an
// announcement learns it from here before EOSE. Clients re-announce within
// the TTL to stay present. Typing (20002) is not kept: it is momentary, and
// replaying a typing indicator seconds later would show someone typing who
// has stopped.
package presence

import (
	"bytes"
	"cmp"
	"context"
	"encoding/hex"
	"errors"
	"slices"
	"sync"
	"time"

	"github.com/google/uuid"

	"github.com/buzzrelay/buzz/internal/nostr"
)

// Kind is the presence event kind.
const Kind = 20001

// MaxAnnouncementBytes is the largest presence announcement (its JSON) a
// relay accepts. An announcement says who is here and a short status; it
// is kept for every reader of its channel, in this process and in Redis,
// where a presence REQ reads a channel's whole set at once, so its size,
// not only the count of them, bounds what an anonymous key can make the
// relays hold.
const MaxAnnouncementBytes = 4 << 10

// ErrFull is Remember's answer when the store keeps as many announcements
// as it may: anyone may announce under fresh keys, so past the bound the
// relay refuses announcements rather than hold more, until older ones
// expire.
var ErrFull = errors.New("presence store full")

// Store remembers presence announcements and answers who is present.
type Store interface {
	// Remember keeps ev as its author's presence in channel until now+TTL,
	// unless a newer announcement (by created_at) is held. ErrFull says
	// the store as a whole (in Redis, the community's) has no room for it:
	// the announcement is refused, and the one held for its author stays.
	// A channel without room is not an error: the announcement is relayed
	// but not kept.
	Remember(community, channel uuid.UUID, ev *nostr.Event, now time.Time) error
	// Current is every unexpired presence event of the channel.
	Current(ctx context.Context, community, channel uuid.UUID, now time.Time) []*nostr.Event
	// Held is the JSON of the unexpired announcement each want names, in
	// the wants' order, nil for one not held.
	Held(ctx context.Context, community uuid.UUID, wants []Want, now time.Time) [][]byte
}

// Want names one announcement: its author's in a channel.
type Want struct {
	Channel uuid.UUID
	PubKey  string
}

type entry struct {
	// raw is the event's JSON, decoded again when asked for: a parsed
	// event of many short tags takes several times its size in memory,
	// and the byte bound must hold for what is actually held.
	raw       []byte
	createdAt int64
	expires   time.Time
}

type channelKey struct{ community, channel uuid.UUID }

// Memory is a Store in this process, for a relay that is the only one.
// It holds at most max announcements and maxBytes bytes of them: when
// either is reached, expired ones are swept, and if that frees too little
// the announcement is refused (ErrFull) when its community holds at least
// its share of the store (the bounds divided among the communities holding
// presence); else the other communities filled it, and the announcement
// is relayed but not kept, as in a full channel: without the share, one
// community flooded with announcements under fresh keys made every other
// community's refused, not even relayed, until they expired. Bytes are
// bounded as well as entries because expired ones are only swept when the
// store is full: by count alone, one client announcing under fresh keys
// could make every process hold 100,000 of them (each up to
// MaxAnnouncementBytes, which ingest enforces; the store does not rely on
// it).
type Memory struct {
	ttl             time.Duration
	max             int
	maxBytes        int
	maxChannelBytes int

	mu        sync.Mutex
	channels  map[channelKey]map[string]entry
	held      int
	heldBytes int
	// channelBytes is the bytes held per channel: a presence REQ parses
	// its channel's whole set, so one channel may hold at most
	// maxChannelBytes of it, however much the store as a whole may.
	channelBytes map[channelKey]int
	// communities is what each community holds, for its share.
	communities map[uuid.UUID]*usage
}

// usage is what one community holds in the store.
type usage struct{ held, bytes int }

// NewMemory keeps announcements for ttl, at most max of them and maxBytes
// of their JSON at once, and at most maxChannelBytes in one channel.
func NewMemory(ttl time.Duration, max, maxBytes, maxChannelBytes int) *Memory {
	return &Memory{ttl: ttl, max: max, maxBytes: maxBytes, maxChannelBytes: maxChannelBytes,
		channels: map[channelKey]map[string]entry{}, channelBytes: map[channelKey]int{}, communities: map[uuid.UUID]*usage{}}
}

// Remember implements Store.
func (m *Memory) Remember(community, channel uuid.UUID, ev *nostr.Event, now time.Time) error {
	key := channelKey{community, channel}
	raw := ev.AppendJSON(nil)
	m.mu.Lock()
	defer m.mu.Unlock()
	old, had := m.channels[key][ev.PubKey]
	if had && old.expires.After(now) && old.createdAt > ev.CreatedAt {
		return nil // an older announcement arriving late
	}
	if totalFits, channelFits := m.fits(key, ev.PubKey, len(raw)); !totalFits || !channelFits {
		m.sweep(now)
		totalFits, channelFits = m.fits(key, ev.PubKey, len(raw))
		if !totalFits && m.overShare(key, ev.PubKey, len(raw)) {
			return ErrFull
		}
		if !totalFits || !channelFits {
			// Not kept. A held announcement of the same pubkey goes too:
			// this one replaced it, and it no longer says what is true.
			m.drop(key, ev.PubKey)
			return nil
		}
	}
	m.drop(key, ev.PubKey)
	byPubkey := m.channels[key]
	if byPubkey == nil {
		byPubkey = map[string]entry{}
		m.channels[key] = byPubkey
	}
	byPubkey[ev.PubKey] = entry{raw: raw, createdAt: ev.CreatedAt, expires: now.Add(m.ttl)}
	m.held++
	m.heldBytes += len(raw)
	m.channelBytes[key] += len(raw)
	u := m.communities[community]
	if u == nil {
		u = &usage{}
		m.communities[community] = u
	}
	u.held++
	u.bytes += len(raw)
	return nil
}

// overShare reports whether the announcement would leave its community
// holding more than its share of the store: the bounds divided among the
// communities holding presence, this one counted; m.mu is held.
func (m *Memory) overShare(key channelKey, pubkey string, size int) bool {
	communities := len(m.communities)
	var held, bytes int
	if u := m.communities[key.community]; u != nil {
		held, bytes = u.held, u.bytes
	} else {
		communities++
	}
	if old, had := m.channels[key][pubkey]; had {
		held--
		bytes -= len(old.raw)
	}
	return held+1 > m.max/communities || bytes+size > m.maxBytes/communities
}

// fits reports whether an announcement of size bytes by pubkey can be kept
// in place of the one held for pubkey, if any, by the store's bounds and by
// its channel's; m.mu is held.
func (m *Memory) fits(key channelKey, pubkey string, size int) (total, channel bool) {
	held, heldBytes, channelBytes := m.held, m.heldBytes, m.channelBytes[key]
	if old, had := m.channels[key][pubkey]; had {
		held--
		heldBytes -= len(old.raw)
		channelBytes -= len(old.raw)
	}
	return held < m.max && heldBytes+size <= m.maxBytes, channelBytes+size <= m.maxChannelBytes
}

// drop forgets pubkey's announcement in the channel, if held; m.mu is held.
func (m *Memory) drop(key channelKey, pubkey string) {
	byPubkey := m.channels[key]
	old, had := byPubkey[pubkey]
	if !had {
		return
	}
	delete(byPubkey, pubkey)
	m.held--
	m.heldBytes -= len(old.raw)
	m.channelBytes[key] -= len(old.raw)
	if u := m.communities[key.community]; u != nil {
		u.held--
		u.bytes -= len(old.raw)
		if u.held == 0 {
			delete(m.communities, key.community)
		}
	}
	if len(byPubkey) == 0 {
		delete(m.channels, key)
		delete(m.channelBytes, key)
	}
}

// sweep drops every expired announcement; m.mu is held.
func (m *Memory) sweep(now time.Time) {
	for key, byPubkey := range m.channels {
		for pubkey, e := range byPubkey {
			if !e.expires.After(now) {
				m.drop(key, pubkey)
			}
		}
	}
}

// Current implements Store.
func (m *Memory) Current(_ context.Context, community, channel uuid.UUID, now time.Time) []*nostr.Event {
	var raws [][]byte
	m.mu.Lock()
	for _, e := range m.channels[channelKey{community, channel}] {
		if e.expires.After(now) {
			raws = append(raws, e.raw)
		}
	}
	m.mu.Unlock()
	out := make([]*nostr.Event, 0, len(raws))
	for _, raw := range raws {
		if ev, err := nostr.ParseEvent(raw, nostr.Limits{}); err == nil {
			out = append(out, ev)
		}
	}
	return out
}

// Held implements Store.
func (m *Memory) Held(_ context.Context, community uuid.UUID, wants []Want, now time.Time) [][]byte {
	out := make([][]byte, len(wants))
	m.mu.Lock()
	defer m.mu.Unlock()
	for i, w := range wants {
		// An entry's raw is never written after it is made: sharing it is safe.
		if e, ok := m.channels[channelKey{community, w.Channel}][w.PubKey]; ok && e.expires.After(now) {
			out[i] = e.raw
		}
	}
	return out
}

// Announcement is one announcement a Memory holds, as Unexpired lists it.
type Announcement struct {
	Community, Channel uuid.UUID
	PubKey             string
	CreatedAt          int64
	Expires            time.Time
	// JSON is the event as received; it is never written after it is made.
	JSON []byte
}

// Unexpired lists every announcement held and unexpired at now.
func (m *Memory) Unexpired(now time.Time) []Announcement {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make([]Announcement, 0, m.held)
	for key, byPubkey := range m.channels {
		for pubkey, e := range byPubkey {
			if e.expires.After(now) {
				out = append(out, Announcement{Community: key.community, Channel: key.channel, PubKey: pubkey,
					CreatedAt: e.createdAt, Expires: e.expires, JSON: e.raw})
			}
		}
	}
	return out
}

// StoredCount counts, for each filter asking for presence and stored kinds
// alike, the stored events a REQ returned that it matches: the limit is one
// for both, so presence gets only what the stored events left of it. Stored
// events are read first and sent as they are read; none can be taken back
// for a newer announcement.
type StoredCount struct {
	filters  nostr.Filters
	counting []int // indexes of the filters that ask for both
	matched  []int // by filter index
}

// NewStoredCount is the count for filters, or nil when no filter asks for
// presence and stored kinds alike (then no stored row need be parsed).
func NewStoredCount(filters nostr.Filters) *StoredCount {
	var counting []int
	for i := range filters {
		f := &filters[i]
		if asksPresence(f) && slices.ContainsFunc(f.Kinds, func(k int) bool { return k != Kind }) {
			counting = append(counting, i)
		}
	}
	if counting == nil {
		return nil
	}
	return &StoredCount{filters: filters, counting: counting, matched: make([]int, len(filters))}
}

// Add counts one stored event, its JSON as the REQ returned it.
func (c *StoredCount) Add(raw []byte) {
	if c == nil {
		return
	}
	ev, err := nostr.ParseEvent(raw, nostr.Limits{})
	if err != nil {
		return
	}
	for _, i := range c.counting {
		if c.filters[i].Matches(ev) {
			c.matched[i]++
		}
	}
}

func (c *StoredCount) of(filter int) int {
	if c == nil {
		return 0
	}
	return c.matched[filter]
}

// chosen names one announcement a REQ will be sent, compactly: a REQ may
// choose thousands (filters x limit), and keeps them until its client has
// read them, which a client that stops reading puts off until the write
// timeout. The announcement itself is read again when its turn comes.
type chosen struct {
	createdAt int64
	channel   int32 // index in Plan.channels
	pubkey    [32]byte
	id        [32]byte
}

// newestFirst orders chosen announcements newest first, then by id, so an
// announcement chosen by several filters sorts next to itself.
func newestFirst(a, b chosen) int {
	if a.createdAt != b.createdAt {
		return cmp.Compare(b.createdAt, a.createdAt)
	}
	return bytes.Compare(a.id[:], b.id[:])
}

// Plan is the announcements a REQ gets from the present, chosen but not
// held: Next reads them a batch at a time, so a REQ whose client reads
// slowly holds one batch of announcements, not filters x limit of them.
type Plan struct {
	store     Store
	community uuid.UUID
	now       time.Time
	channels  []uuid.UUID
	chosen    []chosen // newest first, each once
}

// Choose is what a REQ gets from the present: for each filter asking for
// kind 20001 pinned (#h) to channels, the unexpired announcements it
// matches, newest first, at most its limit (maxLimit when it gives none)
// less the stored events it already returned (stored, nil for none); an
// announcement several filters match is sent once, and the filters'
// choices are merged newest first, as stored history is.
// The caller has already checked that the reader may read every pinned
// channel.
func Choose(ctx context.Context, s Store, community uuid.UUID, filters nostr.Filters, now time.Time, maxLimit int, stored *StoredCount) *Plan {
	type pick struct {
		filter  *nostr.Filter
		limit   int
		named   map[uuid.UUID]struct{}
		matched []chosen // newest first, at most limit
	}
	var picks []*pick
	plan := &Plan{store: s, community: community, now: now}
	// Each channel is read once per REQ, however many filters name it and
	// however often: a filter may repeat one channel id up to the
	// filter-value limit, and reading (and parsing) the whole set for every
	// repeat made one REQ hold the set a thousand times over.
	read := map[uuid.UUID]struct{}{}
	for i := range filters {
		f := &filters[i]
		if !asksPresence(f) {
			continue
		}
		limit := maxLimit
		if f.Limit != nil && *f.Limit < limit {
			limit = *f.Limit
		}
		limit -= stored.of(i)
		if limit <= 0 {
			continue
		}
		p := &pick{filter: f, limit: limit, named: map[uuid.UUID]struct{}{}}
		for _, h := range f.Tags["h"] {
			channel, err := uuid.Parse(h)
			if err != nil {
				continue
			}
			p.named[channel] = struct{}{}
			if _, dup := read[channel]; !dup {
				read[channel] = struct{}{}
				plan.channels = append(plan.channels, channel)
			}
		}
		picks = append(picks, p)
	}
	// One channel's set at a time, cut to each filter's limit before the
	// next is read: a channel holds up to its byte bound, and a REQ may
	// name thousands of channels, so keeping every set until the end held
	// their sum.
	for index, channel := range plan.channels {
		present := s.Current(ctx, community, channel, now)
		for _, p := range picks {
			if _, ok := p.named[channel]; !ok {
				continue
			}
			grew := false
			for _, ev := range present {
				if !p.filter.Matches(ev) {
					continue
				}
				c := chosen{createdAt: ev.CreatedAt, channel: int32(index)}
				if decodeHex32(&c.pubkey, ev.PubKey) && decodeHex32(&c.id, ev.ID) {
					p.matched = append(p.matched, c)
					grew = true
				}
			}
			if grew {
				slices.SortFunc(p.matched, newestFirst)
				p.matched = p.matched[:min(len(p.matched), p.limit)]
			}
		}
	}
	for _, p := range picks {
		plan.chosen = append(plan.chosen, p.matched...)
	}
	slices.SortFunc(plan.chosen, newestFirst)
	plan.chosen = slices.CompactFunc(plan.chosen, func(a, b chosen) bool { return a.id == b.id })
	return plan
}

// Count is how many announcements a REQ of filters would get from the
// present, as a COUNT counts stored events: every unexpired announcement a
// filter asking for kind 20001 pinned (#h) to its channel matches, once,
// without the filters' limits. Each channel is read once, and only its
// count is kept. The caller has already checked that the reader may read
// every pinned channel.
func Count(ctx context.Context, s Store, community uuid.UUID, filters nostr.Filters, now time.Time) int64 {
	var channels []uuid.UUID
	naming := map[uuid.UUID][]*nostr.Filter{}
	for i := range filters {
		f := &filters[i]
		if !asksPresence(f) {
			continue
		}
		for _, h := range f.Tags["h"] {
			channel, err := uuid.Parse(h)
			if err != nil {
				continue
			}
			fs, seen := naming[channel]
			if !seen {
				channels = append(channels, channel)
			}
			// Filters are taken in order: a channel a filter repeats
			// already ends its list with that filter.
			if !seen || fs[len(fs)-1] != f {
				naming[channel] = append(fs, f)
			}
		}
	}
	var n int64
	for _, channel := range channels {
		for _, ev := range s.Current(ctx, community, channel, now) {
			if slices.ContainsFunc(naming[channel], func(f *nostr.Filter) bool { return f.Matches(ev) }) {
				n++
			}
		}
	}
	return n
}

func decodeHex32(dst *[32]byte, s string) bool {
	n, err := hex.Decode(dst[:], []byte(s))
	return err == nil && n == len(dst)
}

// Next reads the next announcements chosen, at most n, as their JSON,
// newest first; nil once every one was read. One replaced or expired
// since it was chosen is left out: a replacement reaches a live
// subscription by itself.
func (p *Plan) Next(ctx context.Context, n int) [][]byte {
	for len(p.chosen) > 0 {
		batch := p.chosen[:min(n, len(p.chosen))]
		p.chosen = p.chosen[len(batch):]
		wants := make([]Want, len(batch))
		for i, c := range batch {
			wants[i] = Want{Channel: p.channels[c.channel], PubKey: hex.EncodeToString(c.pubkey[:])}
		}
		held := p.store.Held(ctx, p.community, wants, p.now)
		var out [][]byte
		var id [64]byte
		for i, raw := range held {
			hex.Encode(id[:], batch[i].id[:])
			if raw != nil && bytes.Equal(nostr.RawEventID(raw), id[:]) {
				out = append(out, raw)
			}
		}
		if out != nil {
			return out
		}
	}
	p.chosen = nil
	return nil
}

func asksPresence(f *nostr.Filter) bool {
	// A NIP-50 search ranks stored events by their text; announcements are
	// not stored, and Matches does not read the search term.
	// An agent_owner filter never matches an announcement (Matches cannot
	// tell an author's owner), so its channels are not read.
	if len(f.Tags["h"]) == 0 || f.Search != "" || f.AgentOwner != "" {
		return false
	}
	for _, k := range f.Kinds {
		if k == Kind {
			return true
		}
	}
	return false
}
