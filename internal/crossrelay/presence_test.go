package crossrelay

import (
	"context"
	"io"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/buzzrelay/buzz/internal/dbtest"
	"github.com/buzzrelay/buzz/internal/nostr"
	"github.com/buzzrelay/buzz/internal/presence"
	"github.com/buzzrelay/buzz/internal/redisserver"
)

func announcement(t *testing.T) *nostr.Event {
	key, err := nostr.GenerateSecretKey()
	require.NoError(t, err)
	ev := &nostr.Event{Kind: presence.Kind, CreatedAt: time.Now().Unix(), Tags: nostr.Tags{}, Content: "online"}
	require.NoError(t, ev.Sign(key))
	return ev
}

// cutOffPresence is presence through a bus on srv that is never run, so
// never subscribes and never writes to Redis: all it remembers is kept only
// in held, as when Redis refused it, and marked for a write-back. It holds
// up to max announcements and maxBytes per channel, 64 MiB per community.
func cutOffPresence(t *testing.T, srv *redisserver.Server, held presence.Store, max, maxBytes int) (*Bus, *SharedPresence) {
	t.Helper()
	cutOff, err := New(srv.URL(), 16, Handlers{}, slog.New(slog.NewTextHandler(io.Discard, nil)), NewMetrics(prometheus.NewRegistry()))
	require.NoError(t, err)
	t.Cleanup(func() { _ = cutOff.client.Close() })
	return cutOff, cutOff.Presence(time.Minute, max, maxBytes, 64<<20, held)
}

func noneClosed(context.Context, []uuid.UUID) (map[uuid.UUID]bool, error) { return nil, nil }

// restored runs Restore until it succeeds and returns what that run sent:
// on a loaded machine a batch may pass its deadline, and a failed
// write-back is given back whole, to be sent again.
func restored(t *testing.T, p *SharedPresence, now time.Time) int {
	t.Helper()
	for range 10 {
		sent, err := p.Restore(t.Context(), now, noneClosed)
		if err == nil {
			return sent
		}
		t.Logf("write-back failed, trying again: %v", err)
	}
	t.Fatal("the write-back never succeeded")
	return 0
}

// After an announcement was kept only in the process's memory (Redis could
// not take it), the write-back sends that one, not every announcement the
// process holds: the others are in Redis already, and writing the whole
// store back (100,000 announcements at the defaults) cost Redis 2.7 s of
// CPU, for each failed write of one. Redis fails nothing on demand, so the
// announcement kept only in memory goes through a second bus on the same
// Redis and the same memory, which never subscribed and so never writes to
// Redis.
// Mutation killed: Restore writing back every announcement held (it sends
// 21, not 1).
func TestPresenceWriteBackSendsOnlyWhatRedisLacks(t *testing.T) {
	t.Parallel()
	srv := dbtest.RedisServer(t)
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	held := presence.NewMemory(time.Minute, 1000, 1<<20, 1<<20)
	bus, err := New(srv.URL(), 16, Handlers{}, log, NewMetrics(prometheus.NewRegistry()))
	require.NoError(t, err)
	run(t, bus)
	require.Eventually(t, bus.Hears, 30*time.Second, 10*time.Millisecond)
	shared := bus.Presence(time.Minute, 100, 1<<20, 1<<20, held)
	cutOff, alone := cutOffPresence(t, srv, held, 100, 1<<20)

	community, channel := uuid.New(), uuid.New()
	now := time.Now()
	for range 20 {
		require.NoError(t, shared.Remember(community, channel, announcement(t), now))
	}
	lost := announcement(t)
	require.NoError(t, alone.Remember(community, channel, lost, now))
	require.True(t, alone.behind.Load(), "an announcement kept only in memory marks a write-back due")

	require.Equal(t, 1, restored(t, alone, now), "only the announcement Redis lacked is written back")
	require.EqualValues(t, 1, testutil.ToFloat64(cutOff.metrics.PresenceWrittenBack))
	rc := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	t.Cleanup(func() { _ = rc.Close() })
	n, err := rc.HLen(t.Context(), PresenceKey(community, channel)).Result()
	require.NoError(t, err)
	require.EqualValues(t, 21, n)
	require.Zero(t, restored(t, alone, now), "nothing is missing any more")
}

// A failed write-back is tried again whole: what it did not send is still
// missing from Redis.
// Mutation killed: Restore forgetting what it took when it fails (the
// second try sends nothing).
func TestPresenceWriteBackThatFailedIsTriedAgain(t *testing.T) {
	t.Parallel()
	srv := dbtest.RedisServer(t)
	held := presence.NewMemory(time.Minute, 1000, 1<<20, 1<<20)
	_, alone := cutOffPresence(t, srv, held, 100, 1<<20)
	community, channel := uuid.New(), uuid.New()
	now := time.Now()
	require.NoError(t, alone.Remember(community, channel, announcement(t), now))

	failing := func(context.Context, []uuid.UUID) (map[uuid.UUID]bool, error) {
		return nil, context.DeadlineExceeded // as a database that did not answer
	}
	_, err := alone.Restore(t.Context(), now, failing)
	require.Error(t, err)
	require.True(t, alone.behind.Load(), "a failed write-back is due again")
	require.Equal(t, 1, restored(t, alone, now))
}

// A process writes every announcement it holds back to a Redis that
// restarted (it may be empty), and none to one that only dropped its
// subscription (here a CLIENT KILL of it), which still holds them: writing
// the whole store back on every resubscription cost Redis 2.7 s of CPU at
// 100,000 announcements, each time a flapping connection resubscribed.
// Mutations killed: a new subscription marking every announcement missing
// whatever Redis it is to (the write-back after the CLIENT KILL sends 20);
// one never marking them (nothing is written back after the restart).
func TestPresenceIsWrittenBackWholeOnlyToARestartedRedis(t *testing.T) {
	t.Parallel()
	srv := dbtest.RedisServer(t)
	var logged syncBuffer
	held := presence.NewMemory(time.Minute, 1000, 1<<20, 1<<20)
	bus, err := New(srv.URL(), 16, Handlers{}, slog.New(slog.NewTextHandler(&logged, nil)), NewMetrics(prometheus.NewRegistry()))
	require.NoError(t, err)
	shared := bus.Presence(time.Minute, 100, 1<<20, 1<<20, held)
	run(t, bus)
	subscribed := func(times int) func() bool {
		return func() bool {
			return strings.Count(logged.String(), "subscribed to the other relays' live traffic") == times && bus.Hears()
		}
	}
	require.Eventually(t, subscribed(1), 30*time.Second, 10*time.Millisecond)
	community, channel := uuid.New(), uuid.New()
	now := time.Now()
	for range 20 {
		require.NoError(t, shared.Remember(community, channel, announcement(t), now))
	}
	// The first subscription is to a Redis this process never wrote to.
	restored(t, shared, now)

	rc := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	t.Cleanup(func() { _ = rc.Close() })
	require.NoError(t, rc.ClientKillByFilter(t.Context(), "TYPE", "pubsub").Err())
	require.Eventually(t, subscribed(2), 30*time.Second, 10*time.Millisecond)
	require.Zero(t, restored(t, shared, now), "a Redis that kept everything gets nothing written back")

	srv.Kill()
	require.NoError(t, srv.Restart(t.Context()))
	require.Eventually(t, subscribed(3), 30*time.Second, 10*time.Millisecond)
	require.Equal(t, 20, restored(t, shared, now), "a restarted Redis gets everything written back")
	n, err := rc.HLen(t.Context(), PresenceKey(community, channel)).Result()
	require.NoError(t, err)
	require.EqualValues(t, 20, n)
}

// Announcements kept only in memory while write-backs run in parallel
// (as KeepRestored runs them: the mark cleared, then Restore) all reach
// Redis: an announcement is marked missing only once the memory holds it,
// so a write-back that cleared its mark reads it. Marked before the memory
// held it, a write-back in between read the store without it and cleared
// the mark, and nothing wrote it back until some other announcement failed.
// Mutation killed: keepOnlyHere marking before the fallback's Remember
// (announcements are missing from Redis at the end: in 3 runs of 4 with
// -race at 1,000 announcements a writer, 1 of 3 at 300).
func TestPresenceKeptOnlyHereDuringAWriteBackIsWrittenBack(t *testing.T) {
	t.Parallel()
	srv := dbtest.RedisServer(t)
	held := presence.NewMemory(time.Minute, 100000, 64<<20, 4<<20)
	_, alone := cutOffPresence(t, srv, held, 10000, 4<<20)
	community := uuid.New()
	now := time.Now()
	writeBack := func() {
		if alone.behind.Swap(false) {
			// A failed one (a batch past its deadline on a loaded machine)
			// is given back and marked again.
			_, _ = alone.Restore(t.Context(), now, noneClosed)
		}
	}

	const writers, each = 4, 1000
	channels := make([]uuid.UUID, writers)
	events := make([][]*nostr.Event, writers)
	for w := range writers {
		channels[w] = uuid.New()
		for range each {
			events[w] = append(events[w], announcement(t))
		}
	}
	var wg sync.WaitGroup
	done := make(chan struct{})
	for w := range writers {
		wg.Go(func() {
			for _, ev := range events[w] {
				assert.NoError(t, alone.Remember(community, channels[w], ev, now))
			}
		})
	}
	go func() { wg.Wait(); close(done) }()
	for running := true; running; {
		select {
		case <-done:
			running = false
		default:
		}
		writeBack()
	}
	for range 10 {
		writeBack()
	}
	require.False(t, alone.behind.Load(), "the last write-back succeeded")

	rc := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	t.Cleanup(func() { _ = rc.Close() })
	for _, channel := range channels {
		n, err := rc.HLen(t.Context(), PresenceKey(community, channel)).Result()
		require.NoError(t, err)
		require.EqualValues(t, each, n, "every announcement kept only in memory reached Redis")
	}
}

// A write-back that keeps failing is tried again less and less often: the
// wait after each failure doubles (1, 2, 4, 8 looks...), so 20 looks make
// 5 tries, not 20. Before, every process tried four times a second for as
// long as Redis refused writes or the database did not answer.
// Mutation killed: trying again at the next look (20 tries).
func TestPresenceWriteBackThatKeepsFailingBacksOff(t *testing.T) {
	t.Parallel()
	srv := dbtest.RedisServer(t)
	bus, err := New(srv.URL(), 16, Handlers{}, slog.New(slog.NewTextHandler(io.Discard, nil)), NewMetrics(prometheus.NewRegistry()))
	require.NoError(t, err)
	held := presence.NewMemory(time.Minute, 1000, 1<<20, 1<<20)
	shared := bus.Presence(time.Minute, 100, 1<<20, 1<<20, held)
	run(t, bus)
	require.Eventually(t, bus.Hears, 30*time.Second, 10*time.Millisecond)
	now := time.Now()
	require.NoError(t, held.Remember(uuid.New(), uuid.New(), announcement(t), now))
	shared.redisLost()

	var tries atomic.Int32
	failing := func(context.Context, []uuid.UUID) (map[uuid.UUID]bool, error) {
		tries.Add(1)
		return nil, context.DeadlineExceeded // as a database that did not answer
	}
	looks := make(chan time.Time) // unbuffered: a look is taken once the one before was handled
	ctx, cancel := context.WithCancel(t.Context())
	stopped := make(chan struct{})
	go func() { shared.keepRestored(ctx, looks, func() time.Time { return now }, failing); close(stopped) }()
	for range 21 {
		looks <- now
	}
	cancel()
	<-stopped
	require.GreaterOrEqual(t, tries.Load(), int32(2), "a failed write-back is tried again")
	require.LessOrEqual(t, tries.Load(), int32(5), "tried at looks 1, 3, 6, 11 and 20")
	require.EqualValues(t, tries.Load(), testutil.ToFloat64(bus.metrics.PresenceWriteBackFailures), "each failure is counted")
}
