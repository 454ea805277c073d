package access

import (
	"context"
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

	// A new channel is not seen while the answer is fresh...
	later := uuid.New()
	_, err = q.ChannelCreate(ctx, db.ChannelCreateParams{CommunityID: community.ID, ID: later, Name: "later", Visibility: db.ChannelVisibilityOpen, CreatedBy: owner[:]})
	require.NoError(t, err)
	got, err = cache.Readable(ctx, community.ID, reader)
	require.NoError(t, err)
	require.False(t, got.Has(later))
	// ...until a committed change invalidates the community, or the TTL passes.
	cache.Invalidate(community.ID)
	got, err = cache.Readable(ctx, community.ID, reader)
	require.NoError(t, err)
	require.True(t, got.Has(later))

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
	m := map[readableKey]cached[Channels]{}
	for i := 0; i < maxEntries; i++ {
		m[readableKey{uuid.New(), "x"}] = cached[Channels]{loadedAt: clock}
	}
	clock = clock.Add(2 * time.Second)
	m[readableKey{uuid.New(), "fresh"}] = cached[Channels]{loadedAt: clock}
	evictExpired(m, clock, time.Second)
	require.Len(t, m, 1, "expired answers are dropped first")
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
			cache.mu.Lock()
			cache.generation[community.ID]++
			cache.mu.Unlock()
		}
		return time.Now()
	}
	_, err = cache.Readable(ctx, community.ID, reader)
	require.NoError(t, err)
	cache.mu.Lock()
	defer cache.mu.Unlock()
	require.Empty(t, cache.readable, "a possibly stale answer must not be cached")
}
