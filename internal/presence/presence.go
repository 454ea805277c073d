// Package presence keeps who is present in a channel: the last presence
// event (kind 20001) each pubkey announced there, for a TTL. Presence events
// are ephemeral, never stored; a subscriber who arrives after an
// announcement learns it from here before EOSE. Clients re-announce within
// the TTL to stay present. Typing (20002) is not kept: it is momentary, and
// replaying a typing indicator seconds later would show someone typing who
// has stopped.
package presence

import (
	"context"
	"sort"
	"sync"
	"time"

	"github.com/google/uuid"

	"github.com/buzzrelay/buzz/internal/nostr"
)

// Kind is the presence event kind.
const Kind = 20001

// Store remembers presence announcements and answers who is present.
type Store interface {
	// Remember keeps ev as its author's presence in channel until now+TTL,
	// unless a newer announcement (by created_at) is held.
	Remember(community, channel uuid.UUID, ev *nostr.Event, now time.Time)
	// Current is every unexpired presence event of the channel.
	Current(ctx context.Context, community, channel uuid.UUID, now time.Time) []*nostr.Event
}

type entry struct {
	ev      *nostr.Event
	expires time.Time
}

type channelKey struct{ community, channel uuid.UUID }

// Memory is a Store in this process, for a relay that is the only one.
// It holds at most max announcements: when full, expired ones are swept,
// and if none has expired a new pubkey's announcement is not kept (it was
// still delivered live).
type Memory struct {
	ttl time.Duration
	max int

	mu       sync.Mutex
	channels map[channelKey]map[string]entry
	held     int
}

// NewMemory keeps announcements for ttl, at most max at once.
func NewMemory(ttl time.Duration, max int) *Memory {
	return &Memory{ttl: ttl, max: max, channels: map[channelKey]map[string]entry{}}
}

// Remember implements Store.
func (m *Memory) Remember(community, channel uuid.UUID, ev *nostr.Event, now time.Time) {
	key := channelKey{community, channel}
	m.mu.Lock()
	defer m.mu.Unlock()
	byPubkey := m.channels[key]
	old, had := byPubkey[ev.PubKey]
	if had && old.expires.After(now) && old.ev.CreatedAt > ev.CreatedAt {
		return // an older announcement arriving late
	}
	if !had && m.held >= m.max {
		m.sweep(now)
		byPubkey = m.channels[key]
		if m.held >= m.max {
			return
		}
	}
	if byPubkey == nil {
		byPubkey = map[string]entry{}
		m.channels[key] = byPubkey
	}
	if !had {
		m.held++
	}
	byPubkey[ev.PubKey] = entry{ev: ev, expires: now.Add(m.ttl)}
}

// sweep drops every expired announcement; m.mu is held.
func (m *Memory) sweep(now time.Time) {
	for key, byPubkey := range m.channels {
		for pubkey, e := range byPubkey {
			if !e.expires.After(now) {
				delete(byPubkey, pubkey)
				m.held--
			}
		}
		if len(byPubkey) == 0 {
			delete(m.channels, key)
		}
	}
}

// Current implements Store.
func (m *Memory) Current(_ context.Context, community, channel uuid.UUID, now time.Time) []*nostr.Event {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []*nostr.Event
	for _, e := range m.channels[channelKey{community, channel}] {
		if e.expires.After(now) {
			out = append(out, e.ev)
		}
	}
	return out
}

// Select is what a REQ gets from the present: for each filter asking for
// kind 20001 pinned (#h) to channels, the unexpired announcements it
// matches, newest first, at most its limit (maxLimit when it gives none).
// The caller has already checked that the reader may read every pinned
// channel.
func Select(ctx context.Context, s Store, community uuid.UUID, filters nostr.Filters, now time.Time, maxLimit int) []*nostr.Event {
	seen := map[string]struct{}{}
	var out []*nostr.Event
	for i := range filters {
		f := &filters[i]
		if !asksPresence(f) {
			continue
		}
		limit := maxLimit
		if f.Limit != nil && *f.Limit < limit {
			limit = *f.Limit
		}
		var matched []*nostr.Event
		for _, h := range f.Tags["h"] {
			channel, err := uuid.Parse(h)
			if err != nil {
				continue
			}
			for _, ev := range s.Current(ctx, community, channel, now) {
				if f.Matches(ev) {
					matched = append(matched, ev)
				}
			}
		}
		sort.Slice(matched, func(a, b int) bool { return matched[a].CreatedAt > matched[b].CreatedAt })
		if len(matched) > limit {
			matched = matched[:limit]
		}
		for _, ev := range matched {
			if _, dup := seen[ev.ID]; !dup {
				seen[ev.ID] = struct{}{}
				out = append(out, ev)
			}
		}
	}
	return out
}

func asksPresence(f *nostr.Filter) bool {
	if len(f.Tags["h"]) == 0 {
		return false
	}
	for _, k := range f.Kinds {
		if k == Kind {
			return true
		}
	}
	return false
}
