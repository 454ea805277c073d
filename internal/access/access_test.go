package access

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/buzzrelay/buzz/internal/db"
	"github.com/buzzrelay/buzz/internal/dbtest"
	"github.com/buzzrelay/buzz/internal/nostr"
)

func TestMain(m *testing.M) { dbtest.Main(m) }

func TestReadableIsCachedUntilInvalidatedOrExpired(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := dbtest.Pool(t)
	q := db.New(pool)
	community, err := q.CommunityCreate(ctx, "access.example")
	require.NoError(t, err)
	reader := "ab" + "cd"
	for len(reader) < 64 {
		reader += "0"
	}
	owner, ok := nostr.DecodeHex32(reader)
	require.True(t, ok)
	clock := time.Unix(1_700_000_000, 0)
	cache := NewCache(q, 10*time.Second, time.Now)
	cache.now = func() time.Time { return clock }

	open := uuid.New()
	_, err = q.ChannelCreate(ctx, db.ChannelCreateParams{CommunityID: community.ID, ID: open, Name: "open", Visibility: db.ChannelVisibilityOpen, CreatedBy: owner[:]})
	require.NoError(t, err)
	got, err := cache.Readable(ctx, community.ID, reader)
	require.NoError(t, err)
	require.True(t, got.Has(open))
	first := got

	// A new channel is not seen while the answer is fresh...
	later := uuid.New()
	_, err = q.ChannelCreate(ctx, db.ChannelCreateParams{CommunityID: community.ID, ID: later, Name: "later", Visibility: db.ChannelVisibilityOpen, CreatedBy: owner[:]})
	require.NoError(t, err)
	got, err = cache.Readable(ctx, community.ID, reader)
	require.NoError(t, err)
	require.False(t, got.Has(later))
	// The cached answer is the one handed out before, and says so: a read
	// streamed in pages asks again before each page and rebuilds its list
	// only for another answer (Mutation killed: Same always false, or
	// always true, which kept a removed member's channels for every page).
	require.True(t, got.Same(first))
	// ...until a committed change invalidates the community, or the TTL passes.
	cache.Invalidate(community.ID)
	got, err = cache.Readable(ctx, community.ID, reader)
	require.NoError(t, err)
	require.True(t, got.Has(later))
	require.False(t, got.Same(first))

	private := uuid.New()
	_, err = q.ChannelCreate(ctx, db.ChannelCreateParams{CommunityID: community.ID, ID: private, Name: "p", Visibility: db.ChannelVisibilityPrivate, CreatedBy: owner[:]})
	require.NoError(t, err)
	clock = clock.Add(11 * time.Second)
	got, err = cache.Readable(ctx, community.ID, reader)
	require.NoError(t, err)
	require.False(t, got.Has(private), "a private channel needs membership")
	require.Len(t, got, 2)
}

func TestCacheStaysBounded(t *testing.T) {
	t.Parallel()
	clock := time.Unix(0, 0)
	a := newAnswers[string, Channels]()
	for i := 0; i < maxEntries; i++ {
		a.put(uuid.New(), "x", cached[Channels]{loadedAt: clock})
	}
	clock = clock.Add(2 * time.Second)
	fresh := uuid.New()
	a.put(fresh, "fresh", cached[Channels]{loadedAt: clock})
	a.makeRoom(clock, time.Second)
	require.Equal(t, 1, a.count, "expired answers are dropped first")
	_, ok := a.get(fresh, "fresh")
	require.True(t, ok)
}

func TestAddressedTo(t *testing.T) {
	t.Parallel()
	ev := &nostr.Event{Tags: nostr.Tags{{"p", "me"}, {"e", "x"}}}
	require.True(t, AddressedTo(ev, "me"))
	require.False(t, AddressedTo(ev, "x"))
}

// An answer read while the community was invalidated is returned but not
// kept: the change that caused the invalidation may have committed after
// the read's snapshot.
func TestAnswerReadAcrossAnInvalidationIsNotCached(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := dbtest.Pool(t)
	q := db.New(pool)
	community, err := q.CommunityCreate(ctx, "race.example")
	require.NoError(t, err)
	cache := NewCache(q, time.Hour, time.Now)
	reader := strings.Repeat("c", 64)
	// Invalidate between the read's start (generation taken) and its store:
	// with no cached entry, the now hook first runs after the query.
	calls := 0
	cache.now = func() time.Time {
		calls++
		if calls == 1 {
			cache.Invalidate(community.ID)
		}
		return time.Now()
	}
	_, err = cache.Readable(ctx, community.ID, reader)
	require.NoError(t, err)
	cache.mu.Lock()
	defer cache.mu.Unlock()
	require.Zero(t, cache.readable.count, "a possibly stale answer must not be cached")
}

// The invalidation counts live only while their community's reads do:
// readers of ever new communities, each invalidated after its read, leave
// the map holding at most the reads in flight, and nothing once they end,
// where one count per community ever invalidated stayed for good.
// Mutation killed: the entry kept when its last read ends (4,000 left).
func TestInvalidationCountsLiveOnlyWithTheirReads(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	cache := NewCache(db.New(dbtest.Pool(t)), time.Hour, time.Now)
	reader := strings.Repeat("d", 64)
	const workers, perWorker = 8, 500
	most := make(chan int, workers)
	errs := make(chan error, workers)
	for range workers {
		go func() {
			held := 0
			for range perWorker {
				community := uuid.New()
				if _, err := cache.Readable(ctx, community, reader); err != nil {
					errs <- err
					return
				}
				cache.Invalidate(community)
				cache.mu.Lock()
				held = max(held, len(cache.loading))
				cache.mu.Unlock()
			}
			most <- held
			errs <- nil
		}()
	}
	for range workers {
		require.NoError(t, <-errs)
	}
	for range workers {
		require.LessOrEqual(t, <-most, workers-1, "at most the other workers' reads are in flight")
	}
	cache.mu.Lock()
	defer cache.mu.Unlock()
	require.Empty(t, cache.loading, "no read in flight, no count kept")
}

// A read still in flight keeps its community's count when another read of
// the community ends first: an invalidation after that is still seen by
// the read in flight, which does not store its answer.
// Mutation killed: the entry dropped when any read ends (the late read
// stores an answer older than the invalidation).
func TestReadInFlightSeesAnInvalidationAfterAnotherReadEnded(t *testing.T) {
	t.Parallel()
	cache := NewCache(nil, time.Hour, time.Now)
	community := uuid.New()
	started, release := make(chan struct{}), make(chan struct{})
	done := make(chan error, 1)
	go func() {
		_, err := load(cache, &cache.readable, community, "slow", func() (Channels, error) {
			close(started)
			<-release
			return Channels{}, nil
		})
		done <- err
	}()
	<-started
	_, err := load(cache, &cache.readable, community, "quick", func() (Channels, error) { return Channels{}, nil })
	require.NoError(t, err)
	cache.Invalidate(community)
	close(release)
	require.NoError(t, <-done)
	cache.mu.Lock()
	defer cache.mu.Unlock()
	_, stored := cache.readable.get(community, "slow")
	require.False(t, stored, "an answer read across an invalidation was kept")
	require.Empty(t, cache.loading)
}

// A cached reader set older than the readers version a write read is never
// answered, and one that a lookup stores late never replaces a newer one:
// the version check and the cache read are one step under the lock, so an
// older lookup's answer stored after the check cannot slip past it.
// Mutations killed: the version check dropped from loadAtLeast (the cached
// set without the new member is answered); storing over a newer answer
// (the late, older answer replaces it).
func TestReaderSetOlderThanAWriteIsNotAnswered(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := dbtest.Pool(t)
	q := db.New(pool)
	community, err := q.CommunityCreate(ctx, "versions.example")
	require.NoError(t, err)
	owner, joiner := strings.Repeat("a", 64), strings.Repeat("b", 64)
	ownerKey, _ := nostr.DecodeHex32(owner)
	joinerKey, _ := nostr.DecodeHex32(joiner)
	channel := uuid.New()
	_, err = q.ChannelCreate(ctx, db.ChannelCreateParams{CommunityID: community.ID, ID: channel, Name: "p", Visibility: db.ChannelVisibilityPrivate, CreatedBy: ownerKey[:]})
	require.NoError(t, err)
	cache := NewCache(q, time.Hour, time.Now)
	before, err := cache.ChannelReaders(ctx, community.ID, channel, 0)
	require.NoError(t, err)
	require.False(t, before.Has(joiner))

	// Another process adds a member; its invalidation has not arrived.
	added, err := q.ChannelMemberUpsert(ctx, db.ChannelMemberUpsertParams{CommunityID: community.ID, ChannelID: channel, Pubkey: joinerKey[:], MaxMembers: 10})
	require.NoError(t, err)
	require.EqualValues(t, 1, added)
	var version int64
	require.NoError(t, pool.QueryRow(ctx, "SELECT readers_version FROM channels WHERE community_id = $1 AND id = $2", community.ID, channel).Scan(&version))
	require.Greater(t, version, before.version)
	stale, err := cache.ChannelReaders(ctx, community.ID, channel, 0)
	require.NoError(t, err)
	require.False(t, stale.Has(joiner), "without a version the cached set is answered")
	after, err := cache.ChannelReaders(ctx, community.ID, channel, version)
	require.NoError(t, err)
	require.True(t, after.Has(joiner), "a set older than the write's version was answered")

	// A lookup that read before the change stores its answer late, after a
	// later lookup stored the newer one (the now hook runs between a
	// fetch and its store).
	cache.mu.Lock()
	cache.readers.drop(community.ID)
	cache.mu.Unlock()
	cache.now = func() time.Time {
		cache.mu.Lock()
		if _, ok := cache.readers.get(community.ID, channel); !ok {
			cache.readers.put(community.ID, channel, cached[Readers]{value: after, loadedAt: time.Now()})
		}
		cache.mu.Unlock()
		return time.Now()
	}
	_, err = loadAtLeast(cache, &cache.readers, community.ID, channel, 0, Readers.readersVersion,
		func() (Readers, error) { return stale, nil })
	require.NoError(t, err)
	cache.mu.Lock()
	held, _ := cache.readers.get(community.ID, channel)
	cache.mu.Unlock()
	require.Equal(t, after.version, held.value.version, "an older answer replaced a newer one")
}

// ReadableInSlot waits for its slot only to read the database: a reader
// whose answer is in memory never queues behind the statements holding
// the slots, and a miss never reads without one. Mutations killed: the
// slot taken on every call (the cached call fails with the busy slot); a
// miss reading without it (the first call succeeds).
func TestReadableWaitsForItsSlotOnlyOnAMiss(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := dbtest.Pool(t)
	q := db.New(pool)
	community, err := q.CommunityCreate(ctx, "slot.example")
	require.NoError(t, err)
	reader := strings.Repeat("ef", 32)
	cache := NewCache(q, time.Minute, time.Now)
	busy := errors.New("every slot busy")
	slots := 0
	noSlot := func(context.Context) (func(), error) { slots++; return nil, busy }
	freeSlot := func(context.Context) (func(), error) { slots++; return func() {}, nil }

	_, err = cache.ReadableInSlot(ctx, community.ID, reader, noSlot)
	require.ErrorIs(t, err, busy, "a miss waits for a slot")
	_, err = cache.ReadableInSlot(ctx, community.ID, reader, freeSlot)
	require.NoError(t, err)
	_, err = cache.ReadableInSlot(ctx, community.ID, reader, noSlot)
	require.NoError(t, err, "an answer in memory needs no slot")
	require.Equal(t, 2, slots)
}

// A community whose readers fill the cache (fresh keys cost nothing) loses
// its own answers to make room, not a small community's: the cache used
// to start over, and every community's readers went back to the database
// each time one community filled it. Mutation killed: makeRoom clearing
// every community's answers (B's cached set is read again, now with the
// private channel).
func TestOneCommunityFillingTheCacheKeepsTheOthersAnswers(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := dbtest.Pool(t)
	q := db.New(pool)
	a, err := q.CommunityCreate(ctx, "filler.example")
	require.NoError(t, err)
	b, err := q.CommunityCreate(ctx, "bystander.example")
	require.NoError(t, err)
	reader := strings.Repeat("d", 64)
	readerKey, _ := nostr.DecodeHex32(reader)
	_, err = q.ChannelCreate(ctx, db.ChannelCreateParams{CommunityID: b.ID, ID: uuid.New(), Name: "open", Visibility: db.ChannelVisibilityOpen, CreatedBy: readerKey[:]})
	require.NoError(t, err)
	cache := NewCache(q, time.Hour, time.Now)
	held, err := cache.Readable(ctx, b.ID, reader)
	require.NoError(t, err)
	require.Len(t, held, 1)

	// B's reader joins a private channel through another process: its
	// invalidation never arrives, so the cached set is B's answer still.
	private := uuid.New()
	_, err = q.ChannelCreate(ctx, db.ChannelCreateParams{CommunityID: b.ID, ID: private, Name: "p", Visibility: db.ChannelVisibilityPrivate, CreatedBy: readerKey[:]})
	require.NoError(t, err)
	_, err = q.ChannelMemberUpsert(ctx, db.ChannelMemberUpsertParams{CommunityID: b.ID, ChannelID: private, Pubkey: readerKey[:], MaxMembers: 10})
	require.NoError(t, err)

	// A's readers under fresh keys fill the cache, and one more reads.
	cache.mu.Lock()
	for i := cache.readable.count; i < maxEntries; i++ {
		cache.readable.put(a.ID, uuid.NewString(), cached[Channels]{value: Channels{}, loadedAt: time.Now()})
	}
	cache.mu.Unlock()
	_, err = cache.Readable(ctx, a.ID, strings.Repeat("e", 64))
	require.NoError(t, err)

	got, err := cache.Readable(ctx, b.ID, reader)
	require.NoError(t, err)
	require.False(t, got.Has(private), "B's cached answer was dropped to make room for A's readers")
	cache.mu.Lock()
	defer cache.mu.Unlock()
	require.LessOrEqual(t, cache.readable.count, maxEntries)
}

// A full cache makes room for many stores, not for the one at hand: with
// fresh answers spread over many communities (10 each) and none expired,
// one makeRoom frees roomAfterFull, so the walk of every answer under the
// read lock runs once per thousands of stores. InvalidateAll leaves none
// counted. Mutations killed: dropping only the largest community (10
// freed, every next store walks again); clear() keeping the count.
func TestMakeRoomFreesForManyStores(t *testing.T) {
	t.Parallel()
	now := time.Now()
	a := newAnswers[string, Channels]()
	for a.count < maxEntries {
		community := uuid.New()
		for range 10 {
			a.put(community, uuid.NewString(), cached[Channels]{value: Channels{}, loadedAt: now})
		}
	}
	a.makeRoom(now, time.Hour)
	require.LessOrEqual(t, a.count, maxEntries-roomAfterFull)
	require.Greater(t, a.count, maxEntries-roomAfterFull-10, "no more dropped than needed")
	held := 0
	for _, m := range a.of {
		held += len(m)
	}
	require.Equal(t, held, a.count)

	cache := NewCache(nil, time.Hour, time.Now)
	cache.readable.put(uuid.New(), "k", cached[Channels]{loadedAt: now})
	cache.readers.put(uuid.New(), uuid.New(), cached[Readers]{loadedAt: now})
	cache.InvalidateAll()
	require.Zero(t, cache.readable.count)
	require.Zero(t, cache.readers.count)
}

// BenchmarkInvalidateAmongOtherCommunities is one community's invalidation
// while every other community's answers fill the cache: with one map of
// all communities' answers it walked them all (about 6 ms at 50,000 of
// each kind on the 2-core development machine), under the lock every read
// takes.
func BenchmarkInvalidateAmongOtherCommunities(b *testing.B) {
	c := NewCache(nil, time.Hour, time.Now)
	now := time.Now()
	for i := 0; i < maxEntries; i++ {
		c.readable.put(uuid.New(), "x", cached[Channels]{loadedAt: now})
		c.readers.put(uuid.New(), uuid.New(), cached[Readers]{loadedAt: now})
	}
	community := uuid.New()
	b.ResetTimer()
	for range b.N {
		c.Invalidate(community)
	}
}

// A read whose fetch panics (the connection that ran it is closed, the
// process goes on) leaves the count of reads in flight as one that
// returned does: the cache's lock is free, the next read of the key
// completes and is stored, a read in flight beside it still sees a later
// invalidation, and once every read has ended no entry is left.
// Mutation killed: the count taken down only after fetch returns (the
// community's entry stays for good).
func TestPanickingReadLeavesNoCount(t *testing.T) {
	t.Parallel()
	cache := NewCache(nil, time.Hour, time.Now)
	community := uuid.New()
	started, release := make(chan struct{}), make(chan struct{})
	done := make(chan error, 1)
	go func() {
		_, err := load(cache, &cache.readable, community, "slow", func() (Channels, error) {
			close(started)
			<-release
			return Channels{}, nil
		})
		done <- err
	}()
	<-started

	require.PanicsWithValue(t, "fetch failed", func() {
		_, _ = load(cache, &cache.readable, community, "panics", func() (Channels, error) { panic("fetch failed") })
	})
	next, err := load(cache, &cache.readable, community, "panics", func() (Channels, error) {
		return Channels{community: {}}, nil
	})
	require.NoError(t, err)
	require.True(t, next.Has(community))

	cache.Invalidate(community)
	close(release)
	require.NoError(t, <-done)
	cache.mu.Lock()
	defer cache.mu.Unlock()
	_, stored := cache.readable.get(community, "slow")
	require.False(t, stored, "an answer read across an invalidation was kept")
	require.Empty(t, cache.loading, "a panicked read is still counted")
}
