package replica

import (
	"sync"
	"time"

	"github.com/google/uuid"
)

// A proof covers insertions only: a row a deletion (NIP-09, NIP-29 9005)
// hid, or a replaceable version a newer one replaced, is still in a
// snapshot older than that write. So the router remembers when this
// process last learned of such a write, per channel: a routed read of that
// channel then needs a token written after it (Predicate.After), which a
// reader holds only once it has replayed the removal. The token is written
// after the router's clock passed the mark, so its commit follows the
// removal's, which had already committed. A read that is not pinned to
// channels waits for the community's latest removal.
//
// A replaceable or addressable version is marked in its own channel and,
// apart, for the whole community (replaced): the version it replaced may
// lie in any channel, since a slot is the author's kind and d tag whatever
// channel each version names. A read pinned to a channel waits for that
// mark too when it may return such kinds.
//
// A mark older than keep (Staleness, or a longer fresh budget) is
// forgotten: no proof that old routes any read.
type removals struct {
	mu          sync.Mutex
	channels    map[removalKey]time.Time
	communities map[uuid.UUID]time.Time
	replaced    map[uuid.UUID]time.Time
	pruned      time.Time
}

type removalKey struct {
	community uuid.UUID
	channel   uuid.UUID // uuid.Nil: channel-less rows
}

func (m *removals) note(community uuid.UUID, channel *uuid.UUID, replacement bool, now time.Time, keep time.Duration) {
	key := removalKey{community: community}
	if channel != nil {
		key.channel = *channel
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.channels == nil {
		m.channels, m.communities, m.replaced = map[removalKey]time.Time{}, map[uuid.UUID]time.Time{}, map[uuid.UUID]time.Time{}
	}
	if now.Sub(m.pruned) > keep {
		prune(m.channels, now, keep)
		prune(m.communities, now, keep)
		prune(m.replaced, now, keep)
		m.pruned = now
	}
	m.channels[key], m.communities[community] = now, now
	if replacement {
		m.replaced[community] = now
	}
}

func prune[K comparable](marks map[K]time.Time, now time.Time, keep time.Duration) {
	for k, at := range marks {
		if now.Sub(at) > keep {
			delete(marks, k)
		}
	}
}

func (m *removals) lastReplacement(community uuid.UUID) time.Time {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.replaced[community]
}

func (m *removals) last(community uuid.UUID, channel *uuid.UUID) time.Time {
	m.mu.Lock()
	defer m.mu.Unlock()
	if channel == nil {
		return m.communities[community]
	}
	return m.channels[removalKey{community: community, channel: *channel}]
}

// Removed records that a write which hid or replaced stored rows of
// channel (nil: channel-less rows) in community has committed; call it
// once the write is known committed (after this process committed it, or
// when another process's fan-out of it arrives).
func (r *Router) Removed(community uuid.UUID, channel *uuid.UUID) {
	if r.Enabled() {
		r.removals.note(community, channel, false, r.now(), max(Staleness, r.maxAge))
	}
}

// Replaced records that a replaceable or addressable version stored in
// channel (nil: channel-less) has committed: like Removed, and, since the
// version it replaced may lie in any channel of community, LastReplacement
// moves too.
func (r *Router) Replaced(community uuid.UUID, channel *uuid.UUID) {
	if r.Enabled() {
		r.removals.note(community, channel, true, r.now(), max(Staleness, r.maxAge))
	}
}

// LastReplacement is when Replaced last recorded a version anywhere in
// community (zero: none recent enough to matter). A read pinned to a
// channel that may return replaceable or addressable kinds asks for a
// proof After it as well as after the channel's LastRemoval.
func (r *Router) LastReplacement(community uuid.UUID) time.Time {
	if !r.Enabled() {
		return time.Time{}
	}
	return r.removals.lastReplacement(community)
}

// LastRemoval is when Removed last recorded a removal in channel of
// community, or, for a nil channel, anywhere in community (zero: none
// recent enough to matter). A read that may return those rows asks for a proof
// After it.
func (r *Router) LastRemoval(community uuid.UUID, channel *uuid.UUID) time.Time {
	if !r.Enabled() {
		return time.Time{}
	}
	return r.removals.last(community, channel)
}
