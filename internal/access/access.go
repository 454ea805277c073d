// Package access answers "which channels may this pubkey read?" (for REQ and
// COUNT) and "who may read this channel?" (for live delivery, once per
// published event): every open channel plus every channel the pubkey is an
// active member of, never a deleted one. Answers are cached for a short TTL
// and dropped as soon as this process commits a membership change in the
// community, so a removed member stops receiving a private channel at once
// when the change went through this relay (and within the TTL otherwise).
package access

import (
	"context"
	"encoding/hex"
	"reflect"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"

	"github.com/buzzrelay/buzz/internal/db"
	"github.com/buzzrelay/buzz/internal/dberr"
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

// Same reports whether c and o are one answer: the cache hands out the
// answer it holds, unchanged, until it is dropped or expires, so a caller
// holding an earlier answer tells "nothing changed" without walking either.
func (c Channels) Same(o Channels) bool {
	return reflect.ValueOf(c).UnsafePointer() == reflect.ValueOf(o).UnsafePointer()
}

// IDs lists the set for a query parameter.
func (c Channels) IDs() []uuid.UUID {
	out := make([]uuid.UUID, 0, len(c))
	for id := range c {
		out = append(out, id)
	}
	return out
}

// Readers is who may read one channel: everyone when it is open, else its
// active members. The zero value (a deleted or unknown channel) admits
// nobody.
type Readers struct {
	open    bool
	members map[string]struct{}
	// version is the channel's readers_version the answer was read at.
	version int64
}

// Has reports whether pubkey (hex) may read the channel.
func (r Readers) Has(pubkey string) bool {
	if r.open {
		return true
	}
	_, ok := r.members[pubkey]
	return ok
}

type cached[V any] struct {
	value    V
	loadedAt time.Time
}

// Cache computes and caches readable channel sets (per reader, for REQ and
// COUNT) and reader sets (per channel, for live delivery).
type Cache struct {
	q   *db.Queries
	ttl time.Duration
	now func() time.Time

	mu       sync.Mutex
	readable answers[string, Channels]   // by reader pubkey
	readers  answers[uuid.UUID, Readers] // by channel
	// loading holds, for each community with a database read in flight,
	// how many invalidations it had since the first of them began: an
	// answer read while an invalidation happened is not stored, or a
	// membership change committed during the read could be forgotten for a
	// whole TTL. An entry lives only while its community's reads do, so
	// the map holds the communities being read now, not every community
	// ever invalidated.
	loading map[uuid.UUID]*loads
	// epoch counts InvalidateAll calls, for the same reason.
	epoch uint64
	// trusted, when set, says whether cached answers may be used: false
	// while this process cannot hear the other processes' invalidations
	// (Redis lost), when every answer is read from the database and none
	// is kept. Atomic: it is set while the relay's background work may
	// already be asking.
	trusted atomic.Pointer[func() bool]
}

// TrustOnlyWhile makes the cache answer from memory only while trusted
// reports true. A process joined to
// others passes whether it hears their invalidations: a member removed
// through another process during a Redis outage would otherwise go on
// receiving a private channel here for as long as the answer cached before
// the removal lives.
func (c *Cache) TrustOnlyWhile(trusted func() bool) { c.trusted.Store(&trusted) }

// NewCache returns a cache reading through q; now is the process clock.
func NewCache(q *db.Queries, ttl time.Duration, now func() time.Time) *Cache {
	return &Cache{
		q: q, ttl: ttl, now: now,
		readable: newAnswers[string, Channels](), readers: newAnswers[uuid.UUID, Readers](),
		loading: map[uuid.UUID]*loads{},
	}
}

// loads counts a community's database reads in flight and the
// invalidations since the first of them began.
type loads struct {
	inFlight   int
	generation uint64
}

// Readable returns the channels pubkey (hex) may read in community.
func (c *Cache) Readable(ctx context.Context, community uuid.UUID, pubkey string) (Channels, error) {
	return c.ReadableInSlot(ctx, community, pubkey, nil)
}

// ReadableInSlot is Readable whose database read, on a miss, first waits
// for slot (nil: none) and holds it for the statement: a caller any client
// can drive with fresh keys bounds what the misses cost, and an answer in
// memory waits for nothing.
func (c *Cache) ReadableInSlot(ctx context.Context, community uuid.UUID, pubkey string, slot func(context.Context) (release func(), err error)) (Channels, error) {
	return load(c, &c.readable, community, pubkey, func() (Channels, error) {
		if slot != nil {
			release, err := slot(ctx)
			if err != nil {
				return nil, err
			}
			defer release()
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
		return set, nil
	})
}

// ChannelReaders returns who may read channel in community. Live delivery
// asks it once per published channel event and checks every subscriber
// against the answer, so the cost does not grow with the subscribers.
//
// atLeast is the channel's readers version an event's write read (0:
// none). A cached answer older than it predates a membership change
// committed before that write, by a relay process whose invalidation has
// not reached this one yet: the write proves it, so the community's answers
// are dropped as that invalidation would drop them, and read again.
func (c *Cache) ChannelReaders(ctx context.Context, community, channel uuid.UUID, atLeast int64) (Readers, error) {
	return loadAtLeast(c, &c.readers, community, channel, atLeast, Readers.readersVersion, func() (Readers, error) {
		row, err := c.q.ChannelReaders(ctx, db.ChannelReadersParams{CommunityID: community, ID: channel})
		if dberr.IsNotFound(err) {
			return Readers{}, nil // deleted or unknown: nobody
		}
		if err != nil {
			return Readers{}, err
		}
		r := Readers{open: row.Visibility == db.ChannelVisibilityOpen, members: make(map[string]struct{}, len(row.Members)), version: row.ReadersVersion}
		for _, pk := range row.Members {
			r.members[hex.EncodeToString(pk)] = struct{}{}
		}
		return r, nil
	})
}

// MayRead is ChannelReaders in the shape the fan-out hub asks for.
func (c *Cache) MayRead(ctx context.Context, community, channel uuid.UUID, atLeast int64) (func(pubkey string) bool, error) {
	readers, err := c.ChannelReaders(ctx, community, channel, atLeast)
	return readers.Has, err
}

// readersVersion is the channel's readers_version the answer was read at.
func (r Readers) readersVersion() int64 { return r.version }

// load answers community's k from a while fresh, else through fetch,
// storing the answer unless community was invalidated meanwhile.
func load[K comparable, V any](c *Cache, a *answers[K, V], community uuid.UUID, k K, fetch func() (V, error)) (V, error) {
	return loadAtLeast(c, a, community, k, 0, nil, fetch)
}

// loadAtLeast is load for answers that carry a version: a cached answer
// older than atLeast predates a change of who may read that a write has
// proved committed (by another process, whose invalidation has not arrived
// yet), so the community's answers are dropped as that invalidation would
// drop them. The check and the read of the cache are one step under the
// lock: an answer another lookup stores in between cannot slip past it. An
// answer is never stored over a newer one.
func loadAtLeast[K comparable, V any](c *Cache, a *answers[K, V], community uuid.UUID, k K, atLeast int64, version func(V) int64, fetch func() (V, error)) (V, error) {
	// Asked outside the lock: the caller's check may take locks of its own.
	trusted := true
	if f := c.trusted.Load(); f != nil {
		trusted = (*f)()
	}
	c.mu.Lock()
	e, ok := a.get(community, k)
	if ok && version != nil && version(e.value) < atLeast {
		c.invalidateLocked(community)
		ok = false
	}
	if ok && trusted && c.now().Sub(e.loadedAt) < c.ttl {
		c.mu.Unlock()
		return e.value, nil
	}
	l := c.loading[community]
	if l == nil {
		l = &loads{}
		c.loading[community] = l
	}
	l.inFlight++
	generation, epoch := l.generation, c.epoch
	c.mu.Unlock()
	// The read leaves the count however fetch ends, a panic included (the
	// connection that panicked is closed, the process goes on): left
	// counted, the community's entry outlived every read for good. It
	// leaves in the same hold of the lock that decides whether the answer
	// is stored, so an invalidation cannot fall between the two.
	defer func() {
		if l.inFlight--; l.inFlight == 0 {
			delete(c.loading, community)
		}
		c.mu.Unlock()
	}()
	v, loadedAt, err := fetchThenLock(c, fetch)
	if err != nil {
		return v, err
	}
	if l.generation != generation || c.epoch != epoch {
		return v, nil // fresh enough for this caller; too old to keep
	}
	if !trusted {
		return v, nil // not used before the resync that would drop it
	}
	held, ok := a.get(community, k)
	if ok && version != nil && version(held.value) > version(v) {
		return v, nil // a later lookup already stored a newer answer
	}
	if !ok && a.count >= maxEntries {
		a.makeRoom(c.now(), c.ttl)
	}
	a.put(community, k, cached[V]{value: v, loadedAt: loadedAt})
	return v, nil
}

// fetchThenLock runs fetch and reads the clock when it returns, then
// takes c.mu, whether fetch returned or panicked (the deferred Lock runs
// on both), so the caller releases the in-flight count under the lock
// either way. The clock is read before the lock: a test's clock hook may
// call Invalidate, which takes c.mu.
func fetchThenLock[V any](c *Cache, fetch func() (V, error)) (v V, loadedAt time.Time, err error) {
	defer c.mu.Lock()
	v, err = fetch()
	return v, c.now(), err
}

// maxEntries bounds each kind of answer the cache holds, over all
// communities: past it, expired answers are dropped, then the answers of
// the communities holding the most until a tenth is free (answers are cheap
// to reload).
const maxEntries = 50_000

// answers holds one kind of cached answer by community, then by key. A
// community's invalidation drops its own answers and looks at no other
// community's: in one map of every community's answers, each membership
// change anywhere walked them all (50,000 of each kind: about 6 ms) under
// the lock every REQ, COUNT and live channel event of every community
// takes, so one community's churn of joins and leaves stalled the others.
type answers[K comparable, V any] struct {
	of    map[uuid.UUID]map[K]cached[V]
	count int // answers held, over all communities
}

func newAnswers[K comparable, V any]() answers[K, V] {
	return answers[K, V]{of: map[uuid.UUID]map[K]cached[V]{}}
}

func (a *answers[K, V]) get(community uuid.UUID, k K) (cached[V], bool) {
	e, ok := a.of[community][k]
	return e, ok
}

func (a *answers[K, V]) put(community uuid.UUID, k K, e cached[V]) {
	m := a.of[community]
	if m == nil {
		m = map[K]cached[V]{}
		a.of[community] = m
	}
	if _, held := m[k]; !held {
		a.count++
	}
	m[k] = e
}

func (a *answers[K, V]) drop(community uuid.UUID) {
	a.count -= len(a.of[community])
	delete(a.of, community)
}

func (a *answers[K, V]) clear() {
	clear(a.of)
	a.count = 0
}

// roomAfterFull is how many answers makeRoom leaves free at least: its walk
// of every answer runs under the lock every read takes, so it must free
// enough for thousands of stores, not the one at hand (at the bound,
// answers expire one at a time, and a walk per store cost 2-44 ms).
const roomAfterFull = maxEntries / 10

// makeRoom drops the expired answers and then, until roomAfterFull answers
// are free, the answers of the communities holding the most, largest
// first: keys cost nothing, so one community's readers under fresh keys
// could otherwise fill the cache and empty every other community's
// answers each time it filled; filling it, that community soon holds the
// most, and loses its own.
func (a *answers[K, V]) makeRoom(now time.Time, ttl time.Duration) {
	type held struct {
		community uuid.UUID
		n         int
	}
	var sizes []held
	for community, m := range a.of {
		for k, e := range m {
			if now.Sub(e.loadedAt) >= ttl {
				delete(m, k)
				a.count--
			}
		}
		if len(m) == 0 {
			delete(a.of, community)
		} else {
			sizes = append(sizes, held{community, len(m)})
		}
	}
	slices.SortFunc(sizes, func(x, y held) int { return y.n - x.n })
	for _, h := range sizes {
		if a.count <= maxEntries-roomAfterFull {
			break
		}
		a.drop(h.community)
	}
}

// Invalidate drops every cached answer for community (after a membership
// or visibility change committed).
func (c *Cache) Invalidate(community uuid.UUID) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.invalidateLocked(community)
}

func (c *Cache) invalidateLocked(community uuid.UUID) {
	if l := c.loading[community]; l != nil {
		l.generation++
	}
	c.readable.drop(community)
	c.readers.drop(community)
}

// InvalidateAll drops every cached answer of every community: after a
// stretch in which invalidations from other relay processes may have been
// missed.
func (c *Cache) InvalidateAll() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.epoch++
	c.readable.clear()
	c.readers.clear()
}
