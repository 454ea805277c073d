// Package access answers "which channels may this pubkey read?" (spec D.5):
// every open channel plus every channel it is an active member of, never a
// deleted one. Answers are cached per (community, pubkey) for a short TTL and
// dropped as soon as this process commits a membership change in the
// community, so a removed member stops receiving a private channel at once
// when the change went through this relay (and within the TTL otherwise).
package access

import (
	"context"
	"sync"
	"time"

	"github.com/google/uuid"

	"github.com/buzzrelay/buzz/internal/db"
	"github.com/buzzrelay/buzz/internal/nostr"
)

// AddressedTo reports whether ev names pubkey in a p tag.
func AddressedTo(ev *nostr.Event, pubkey string) bool {
	for _, tag := range ev.Tags {
		if len(tag) >= 2 && tag[0] == "p" && tag[1] == pubkey {
			return true
		}
	}
	return false
}

// Channels is a set of readable channel ids.
type Channels map[uuid.UUID]struct{}

// Has reports whether id is readable.
func (c Channels) Has(id uuid.UUID) bool {
	_, ok := c[id]
	return ok
}

// IDs lists the set for a query parameter.
func (c Channels) IDs() []uuid.UUID {
	out := make([]uuid.UUID, 0, len(c))
	for id := range c {
		out = append(out, id)
	}
	return out
}

type key struct {
	community uuid.UUID
	pubkey    string
}

type entry struct {
	channels Channels
	loadedAt time.Time
}

// Cache computes and caches readable channel sets.
type Cache struct {
	q   *db.Queries
	ttl time.Duration
	now func() time.Time

	mu      sync.Mutex
	entries map[key]entry
	// generation counts a community's invalidations: an answer read while
	// an invalidation happened is not stored, or a membership change
	// committed during the read could be forgotten for a whole TTL.
	generation map[uuid.UUID]uint64
}

// NewCache returns a cache reading through q.
func NewCache(q *db.Queries, ttl time.Duration) *Cache {
	return &Cache{q: q, ttl: ttl, now: time.Now, entries: map[key]entry{}, generation: map[uuid.UUID]uint64{}}
}

// Readable returns the channels pubkey (hex) may read in community.
func (c *Cache) Readable(ctx context.Context, community uuid.UUID, pubkey string) (Channels, error) {
	k := key{community, pubkey}
	c.mu.Lock()
	e, ok := c.entries[k]
	generation := c.generation[community]
	c.mu.Unlock()
	if ok && c.now().Sub(e.loadedAt) < c.ttl {
		return e.channels, nil
	}
	pk, _ := nostr.DecodeHex32(pubkey)
	ids, err := c.q.ChannelsReadable(ctx, db.ChannelsReadableParams{CommunityID: community, Pubkey: pk[:]})
	if err != nil {
		return nil, err
	}
	set := make(Channels, len(ids))
	for _, id := range ids {
		set[id] = struct{}{}
	}
	loadedAt := c.now()
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.generation[community] != generation {
		return set, nil // fresh enough for this caller; too old to keep
	}
	if len(c.entries) >= maxEntries {
		c.evictExpired()
	}
	c.entries[k] = entry{channels: set, loadedAt: loadedAt}
	return set, nil
}

// maxEntries bounds the cache: past it, expired answers are dropped, and if
// every answer is fresh the cache starts over (answers are cheap to reload).
const maxEntries = 50_000

func (c *Cache) evictExpired() {
	now := c.now()
	for k, e := range c.entries {
		if now.Sub(e.loadedAt) >= c.ttl {
			delete(c.entries, k)
		}
	}
	if len(c.entries) >= maxEntries {
		clear(c.entries)
	}
}

// Invalidate drops every cached answer for community (after a membership
// or visibility change committed).
func (c *Cache) Invalidate(community uuid.UUID) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.generation[community]++
	for k := range c.entries {
		if k.community == community {
			delete(c.entries, k)
		}
	}
}
