package crossrelay

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/buzzrelay/buzz/internal/clock"
	"github.com/buzzrelay/buzz/internal/dbtest"
	"github.com/buzzrelay/buzz/internal/nostr"
)

func TestMain(m *testing.M) { dbtest.Main(m) }

func TestCommunityOfChannelName(t *testing.T) {
	t.Parallel()
	id := uuid.New()
	got, ok := communityOf(ChannelName(id), channelSuffix)
	require.True(t, ok)
	require.Equal(t, id, got)
	got, ok = communityOf(ControlChannel(id), controlSuffix)
	require.True(t, ok)
	require.Equal(t, id, got)
	for _, bad := range []string{"buzz:not-a-uuid:fanout", "other:" + id.String() + ":fanout", "buzz:" + id.String() + ":rate", ControlChannel(id)} {
		_, ok := communityOf(bad, channelSuffix)
		require.False(t, ok, bad)
	}
}

type received struct {
	community uuid.UUID
	event     *nostr.Event
	channel   *uuid.UUID
}

// A message that does not decode is skipped without ending the
// subscription; a well-formed one from another process arrives with its
// channel; an invalidation reaches Invalidate.
// Mutations killed: handing the event over without its channel (a private
// channel's event would reach unpinned subscriptions); failing hard on an
// undecodable message.
func TestBusSkipsGarbageAndDeliversTheRest(t *testing.T) {
	t.Parallel()
	// Its own redis-server: the junk published here must not reach the
	// tests running beside it, which count and log what they hear (nor theirs here).
	url := dbtest.RedisServer(t).URL()
	// The bus hears every community on this redis-server, which other
	// packages' tests share: keep only this test's community, and never
	// block the bus on a full channel.
	community, channel := uuid.New(), uuid.New()
	events := make(chan received, 4)
	invalidated := make(chan uuid.UUID, 4)
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	bus, err := New(url, 16, Handlers{
		Deliver: func(c uuid.UUID, ev *nostr.Event, ch *uuid.UUID, _ int64) {
			if c == community {
				select {
				case events <- received{c, ev, ch}:
				default:
				}
			}
		},
		Invalidate: func(c uuid.UUID) {
			if c == community {
				select {
				case invalidated <- c:
				default:
				}
			}
		},
	}, log, NewMetrics(prometheus.NewRegistry()))
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { bus.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	require.Eventually(t, bus.Connected, 30*time.Second, 10*time.Millisecond)

	opts, err := redis.ParseURL(url)
	require.NoError(t, err)
	other := redis.NewClient(opts)
	t.Cleanup(func() { other.Close() })
	key, err := nostr.GenerateSecretKey()
	require.NoError(t, err)
	ev := &nostr.Event{Kind: 9, CreatedAt: time.Now().Unix(), Tags: nostr.Tags{{"h", channel.String()}}, Content: "hi"}
	require.NoError(t, ev.Sign(key))

	name := ChannelName(community)
	require.NoError(t, other.Publish(ctx, name, "not json").Err())
	require.NoError(t, other.Publish(ctx, name, `{"o":"elsewhere","e":{"kind":"nine"}}`).Err())
	require.NoError(t, other.Publish(ctx, name, `{"o":"elsewhere","e":`+string(ev.AppendJSON(nil))+`,"c":"`+channel.String()+`"}`).Err())
	require.NoError(t, other.Publish(ctx, name, `{"o":"elsewhere"}`).Err())

	select {
	case got := <-events:
		require.Equal(t, community, got.community)
		require.Equal(t, ev.ID, got.event.ID)
		require.Equal(t, &channel, got.channel)
	case <-time.After(30 * time.Second):
		t.Fatal("the well-formed event never arrived")
	}
	select {
	case got := <-invalidated:
		require.Equal(t, community, got)
	case <-time.After(30 * time.Second):
		t.Fatal("the invalidation never arrived")
	}
	require.True(t, bus.Connected(), "garbage does not cost the subscription")
}

// Every connection of a bus is named after its process in CLIENT LIST,
// where an operator counts each relay's Redis clients; a name in the URL
// wins. Mutation checked: the default name removed (CLIENT LIST shows
// name= for the bus's connections).
func TestBusConnectionsAreNamed(t *testing.T) {
	t.Parallel()
	url := dbtest.RedisServer(t).URL()
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	for _, tc := range []struct{ url, prefix string }{
		{url, "buzz-relay-"},
		{url + "?client_name=pod-7", "pod-7"},
	} {
		bus, err := New(tc.url, 16, Handlers{}, log, NewMetrics(prometheus.NewRegistry()))
		require.NoError(t, err)
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { bus.Run(ctx); close(done) }()
		require.Eventually(t, bus.Connected, 30*time.Second, 10*time.Millisecond)

		opts, err := redis.ParseURL(url)
		require.NoError(t, err)
		admin := redis.NewClient(opts)
		list, err := admin.ClientList(ctx).Result()
		require.NoError(t, err)
		admin.Close()
		cancel()
		<-done
		named := 0
		for _, line := range strings.Split(strings.TrimSpace(list), "\n") {
			if strings.Contains(line, " name="+tc.prefix) {
				named++
			}
		}
		require.Positive(t, named, "no connection named %s*: %s", tc.prefix, list)
	}
}

// A Redis user denied CLIENT (hardened set-ups deny it) still connects: the
// default name is set where it may be, not required. Mutation killed: the
// default name given as the client's ClientName (the library fails every
// connection whose name it cannot set; the bus never connects).
func TestBusConnectsWithoutLeaveToNameItsConnections(t *testing.T) {
	t.Parallel()
	server := dbtest.RedisServer(t)
	opts, err := redis.ParseURL(server.URL())
	require.NoError(t, err)
	admin := redis.NewClient(opts)
	defer admin.Close()
	ctx := context.Background()
	user := "relay-" + strconv.FormatInt(time.Now().UnixNano(), 36)
	require.NoError(t, admin.Do(ctx, "ACL", "SETUSER", user, "on", ">secret", "~*", "&*", "+@all", "-client").Err())

	u, err := url.Parse(server.URL())
	require.NoError(t, err)
	u.User = url.UserPassword(user, "secret")
	bus, err := New(u.String(), 16, Handlers{}, slog.New(slog.NewTextHandler(io.Discard, nil)), NewMetrics(prometheus.NewRegistry()))
	require.NoError(t, err)
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { bus.Run(runCtx); close(done) }()
	defer func() { cancel(); <-done }()
	require.Eventually(t, bus.Connected, 30*time.Second, 10*time.Millisecond, "a user denied CLIENT SETNAME never connected")
}

// An unknown control message is logged by its length and start, not
// whole: a peer (or a tool) publishing megabytes on the control channel,
// once or in a loop, must not write them to every relay's log. The
// community is still closed by a well-formed message after it.
// Mutation killed: logging the whole payload (the log holds the megabyte).
func TestUnknownControlMessageIsNotLoggedWhole(t *testing.T) {
	t.Parallel()
	// Its own redis-server: the junk published here must not reach the
	// tests running beside it, which count and log what they hear (nor theirs here).
	url := dbtest.RedisServer(t).URL()
	community := uuid.New()
	var logged syncBuffer
	closed := make(chan struct{}, 1)
	bus, err := New(url, 16, Handlers{
		CloseCommunity: func(c uuid.UUID) {
			if c == community {
				closed <- struct{}{}
			}
		},
	}, slog.New(slog.NewTextHandler(&logged, nil)), NewMetrics(prometheus.NewRegistry()))
	require.NoError(t, err)
	run(t, bus)
	require.Eventually(t, bus.Connected, 30*time.Second, 10*time.Millisecond)

	opts, err := redis.ParseURL(url)
	require.NoError(t, err)
	other := redis.NewClient(opts)
	t.Cleanup(func() { other.Close() })
	huge := `{"op":"` + strings.Repeat("x", 1<<20) + `"}`
	require.NoError(t, other.Publish(t.Context(), ControlChannel(community), huge).Err())
	require.NoError(t, other.Publish(t.Context(), ControlChannel(community), DisconnectCommunity).Err())
	select {
	case <-closed:
	case <-time.After(30 * time.Second):
		t.Fatal("the well-formed control message never arrived")
	}
	require.Contains(t, logged.String(), "unknown connection control message")
	require.Less(t, logged.Len(), 4096, "the megabyte was logged")
}

// syncBuffer is a bytes.Buffer the bus's goroutines may log into.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

func (b *syncBuffer) Len() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Len()
}

// recorder runs a bus that notes, in order, what reaches it for one
// community: "invalidate" or the event's id.
func recorder(t *testing.T, url string, community uuid.UUID) (*Bus, <-chan string) {
	t.Helper()
	seen := make(chan string, 64)
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	bus, err := New(url, 16, Handlers{
		Deliver: func(c uuid.UUID, ev *nostr.Event, _ *uuid.UUID, _ int64) {
			if c == community {
				seen <- ev.ID
			}
		},
		Invalidate: func(c uuid.UUID) {
			if c == community {
				seen <- "invalidate"
			}
		},
	}, log, NewMetrics(prometheus.NewRegistry()))
	require.NoError(t, err)
	run(t, bus)
	require.Eventually(t, bus.Connected, 30*time.Second, 10*time.Millisecond)
	return bus, seen
}

func run(t *testing.T, bus *Bus) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { bus.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
}

func signed(t testing.TB, content string) *nostr.Event {
	key, err := nostr.GenerateSecretKey()
	require.NoError(t, err)
	ev := &nostr.Event{Kind: 9, CreatedAt: time.Now().Unix(), Tags: nostr.Tags{}, Content: content}
	require.NoError(t, ev.Sign(key))
	return ev
}

// next is what the recorder saw next.
func next(t *testing.T, seen <-chan string) string {
	t.Helper()
	select {
	case got := <-seen:
		return got
	case <-time.After(30 * time.Second):
		t.Fatal("nothing arrived")
		return ""
	}
}

// An invalidation that finds the publish queue full is not dropped: the
// events queued after it would reach the other processes while their
// cached answer still lets a member removed before those events read the
// channel. It goes out ahead of the next batch.
// Mutation killed: dropping the invalidation when the queue is full (the
// other process sees the later event with no invalidation before it).
func TestInvalidationFindingTheQueueFullIsSentAheadOfLaterEvents(t *testing.T) {
	t.Parallel()
	url := dbtest.RedisURL(t)
	community := uuid.New()
	_, seen := recorder(t, url, community)

	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	publisher, err := New(url, 1, Handlers{}, log, NewMetrics(prometheus.NewRegistry()))
	require.NoError(t, err)
	// Not running yet: the queue of one holds the first event, and the
	// invalidation finds it full.
	before := signed(t, "before the change")
	publisher.PublishEvent(community, before, nil, 0)
	publisher.PublishInvalidation(community)
	run(t, publisher)

	var got []string
	for len(got) == 0 || got[len(got)-1] != before.ID {
		got = append(got, next(t, seen))
	}
	// The queue has room again: the sender took the first event.
	after := signed(t, "after the change")
	publisher.PublishEvent(community, after, nil, 0)
	for got[len(got)-1] != after.ID {
		got = append(got, next(t, seen))
	}
	require.Contains(t, got, "invalidate", "the invalidation reaches the other process before the event published after it")
}

// An invalidation whose publish failed is sent again ahead of the next
// event once Redis answers, where a failed event is not (it could arrive
// twice; an invalidation twice is harmless).
// Mutation killed: not keeping the invalidations of a failed batch (the
// event published after Redis returns arrives with no invalidation before
// it).
func TestInvalidationThatFailedToPublishIsSentAheadOfLaterEvents(t *testing.T) {
	t.Parallel()
	// The publisher may send the kept invalidation as Redis returns,
	// before the recorder subscribed: such an attempt shows nothing either
	// way and is made again.
	for range 5 {
		if invalidationSentAheadOfALaterEvent(t) {
			return
		}
	}
	t.Fatal("the kept invalidation always went out before the recorder subscribed")
}

// invalidationSentAheadOfALaterEvent is one attempt of the test above:
// false when the invalidation was published before the recorder heard.
func invalidationSentAheadOfALaterEvent(t *testing.T) bool {
	srv := dbtest.RedisServer(t)
	community := uuid.New()
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	publisher, err := New(srv.URL(), 16, Handlers{}, log, NewMetrics(prometheus.NewRegistry()))
	require.NoError(t, err)
	srv.Kill()
	run(t, publisher)
	publisher.PublishInvalidation(community)
	require.Eventually(t, func() bool {
		return testutil.ToFloat64(publisher.metrics.Dropped.WithLabelValues("redis_error")) == 1
	}, 30*time.Second, 10*time.Millisecond, "the invalidation's publish fails while Redis is down")

	require.NoError(t, srv.Restart(context.Background()))
	_, seen := recorder(t, srv.URL(), community)
	// Published already (a try in flight while Redis was down may succeed
	// as it returns), the invalidation may have gone out before the
	// recorder heard: an event seen first then proves nothing. Not yet
	// published, it goes out with the event's batch or before it.
	publishedBefore := testutil.ToFloat64(publisher.metrics.Published)
	after := signed(t, "after Redis returned")
	publisher.PublishEvent(community, after, nil, 0)
	first := next(t, seen)
	if first == after.ID && publishedBefore > 0 {
		return false
	}
	require.Equal(t, "invalidate", first)
	require.Equal(t, after.ID, next(t, seen))
	return true
}

// The log tells how many events an outage dropped, not only the first
// failed batch's: the warning names its batch (one event here), and the
// line saying publishing works again names every event dropped meanwhile.
// Measured with two relay processes and Redis killed for 3 s while one
// published 20 events a second: the warning said "dropped":1 for 40 events
// dropped, which only the metric told.
// Mutation killed: the recovery line without the count (or counting only
// the first batch: it says 1).
func TestRecoveryLogTellsEveryEventTheOutageDropped(t *testing.T) {
	t.Parallel()
	srv := dbtest.RedisServer(t)
	var logged syncBuffer
	bus, err := New(srv.URL(), 16, Handlers{}, slog.New(slog.NewTextHandler(&logged, nil)), NewMetrics(prometheus.NewRegistry()))
	require.NoError(t, err)
	run(t, bus)
	require.Eventually(t, bus.Connected, 30*time.Second, 10*time.Millisecond)
	srv.Kill()
	community := uuid.New()
	for i := range 3 {
		bus.PublishEvent(community, signed(t, fmt.Sprint("during the outage ", i)), nil, 0)
		require.Eventually(t, func() bool {
			return testutil.ToFloat64(bus.metrics.Dropped.WithLabelValues("redis_error")) == float64(i+1)
		}, 30*time.Second, 10*time.Millisecond, "event %d's publish fails while Redis is down", i)
	}
	require.NoError(t, srv.Restart(context.Background()))
	bus.PublishEvent(community, signed(t, "after"), nil, 0)
	require.Eventually(t, func() bool { return strings.Contains(logged.String(), "publishing to the other relays again") },
		30*time.Second, 10*time.Millisecond)
	require.Contains(t, logged.String(), "dropped=1", "the warning names its own batch")
	require.Contains(t, logged.String(), "dropped_while_failing=3")
}

// An invalidation whose publish failed is kept and sent again with the
// next batch, not dropped: the recovery line counts the events the outage
// dropped, not each failed try of a kept invalidation. Before, one
// invalidation retried with each batch (the alive announcement's too) and
// one event dropped were logged as dropped_while_failing=3 or more, growing
// twice a second for as long as Redis was down.
// Mutation killed: counting the kept invalidations of a failed batch as
// dropped.
func TestRecoveryLogDoesNotCountKeptInvalidationsAsDropped(t *testing.T) {
	t.Parallel()
	srv := dbtest.RedisServer(t)
	var logged syncBuffer
	bus, err := New(srv.URL(), 16, Handlers{}, slog.New(slog.NewTextHandler(&logged, nil)), NewMetrics(prometheus.NewRegistry()))
	require.NoError(t, err)
	run(t, bus)
	require.Eventually(t, bus.Connected, 30*time.Second, 10*time.Millisecond)
	srv.Kill()
	community := uuid.New()
	bus.PublishInvalidation(community)
	require.Eventually(t, func() bool {
		return testutil.ToFloat64(bus.metrics.Dropped.WithLabelValues("redis_error")) >= 1
	}, 30*time.Second, 10*time.Millisecond, "the invalidation's publish fails while Redis is down")
	bus.PublishEvent(community, signed(t, "during the outage"), nil, 0)
	require.Eventually(t, func() bool { return testutil.ToFloat64(bus.metrics.Pending) == 0 },
		30*time.Second, 10*time.Millisecond, "the event's batch was tried")
	require.NoError(t, srv.Restart(context.Background()))
	require.Eventually(t, func() bool { return strings.Contains(logged.String(), "publishing to the other relays again") },
		30*time.Second, 10*time.Millisecond)
	require.Contains(t, logged.String(), "dropped_while_failing=1\n")
}

// A call to a stalled Redis (stopped: it takes the command into its socket
// and never answers) ends at the caller's deadline, not at the client's
// socket read timeout: presence and the publish limit give Redis 500 ms
// before falling back, and a stall is not noticed by the subscription for
// a few seconds.
// Mutation killed: ContextTimeoutEnabled off (the call waits the 5 s read
// timeout).
func TestStalledRedisCallEndsAtTheCallersDeadline(t *testing.T) {
	t.Parallel()
	redis := dbtest.RedisServer(t)
	bus, _ := recorder(t, redis.URL(), uuid.New())
	require.NoError(t, bus.client.Ping(t.Context()).Err())

	require.NoError(t, syscall.Kill(redis.Pid(), syscall.SIGSTOP))
	t.Cleanup(func() { _ = syscall.Kill(redis.Pid(), syscall.SIGCONT) })
	ctx, cancel := context.WithTimeout(t.Context(), 100*time.Millisecond)
	defer cancel()
	start := time.Now()
	err := bus.client.Ping(ctx).Err()
	waited := time.Since(start)

	var netErr net.Error
	require.ErrorAs(t, err, &netErr)
	require.True(t, netErr.Timeout(), "a stalled Redis fails the call by its deadline: %v", err)
	// Just under the read timeout, which the mutation waits out whole: a
	// loaded machine firing the 100 ms deadline late has the rest (half
	// the read timeout left it half as much).
	require.Less(t, waited, bus.client.Options().ReadTimeout-250*time.Millisecond,
		"the call must end at its own 100 ms deadline, not at the socket's read timeout")
}

// An invalidation does not wait behind events the fan-out has yet to
// deliver: while the fan-out is busy with an earlier event, the
// invalidation read after it drops the cached answers at once. Before, a
// process whose fan-out lagged (a large audience, a burst) went on
// delivering a private channel to a member another process had removed,
// its own publishes included, for as long as it lagged.
// Mutation killed: handing invalidations to the handlers in line with the
// events (the invalidation waits for the blocked delivery).
func TestInvalidationOvertakesEventsWaitingForTheFanout(t *testing.T) {
	t.Parallel()
	url := dbtest.RedisURL(t)
	community := uuid.New()
	blocked, unblock := make(chan struct{}), make(chan struct{})
	invalidated := make(chan struct{}, 1)
	delivered := make(chan string, 4)
	var once sync.Once
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	bus, err := New(url, 16, Handlers{
		Deliver: func(c uuid.UUID, ev *nostr.Event, _ *uuid.UUID, _ int64) {
			if c != community {
				return
			}
			once.Do(func() {
				close(blocked)
				<-unblock
			})
			delivered <- ev.ID
		},
		Invalidate: func(c uuid.UUID) {
			if c == community {
				invalidated <- struct{}{}
			}
		},
	}, log, NewMetrics(prometheus.NewRegistry()))
	require.NoError(t, err)
	run(t, bus)
	require.Eventually(t, bus.Connected, 30*time.Second, 10*time.Millisecond)

	opts, err := redis.ParseURL(url)
	require.NoError(t, err)
	other := redis.NewClient(opts)
	t.Cleanup(func() { other.Close() })
	first, second := signed(t, "first"), signed(t, "second")
	name := ChannelName(community)
	for _, payload := range []string{
		`{"o":"elsewhere","e":` + string(first.AppendJSON(nil)) + `}`,
		`{"o":"elsewhere"}`,
		`{"o":"elsewhere","e":` + string(second.AppendJSON(nil)) + `}`,
	} {
		require.NoError(t, other.Publish(t.Context(), name, payload).Err())
	}
	<-blocked
	select {
	case <-invalidated:
	case <-time.After(10 * time.Second):
		close(unblock)
		t.Fatal("the invalidation waited for the fan-out of the event before it")
	}
	close(unblock)
	require.Equal(t, first.ID, next(t, delivered), "events still reach the fan-out, in order")
	require.Equal(t, second.ID, next(t, delivered))
}

// Resync (the relay's: drop every cached access answer) runs before the
// bus counts as connected again. The relay trusts its cached access
// answers only while Connected holds: between the two, a cached answer
// from before the outage (a member since removed through another process)
// would be trusted again before the resync dropped it.
// Mutation killed: setConnected(true) before Resync (Resync sees the bus
// connected).
func TestResyncRunsBeforeTheBusCountsAsConnected(t *testing.T) {
	t.Parallel()
	var bus *Bus
	connectedDuringResync := make(chan bool, 1)
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	bus, err := New(dbtest.RedisURL(t), 16, Handlers{
		Resync: func() {
			select {
			case connectedDuringResync <- bus.Connected():
			default:
			}
		},
	}, log, NewMetrics(prometheus.NewRegistry()))
	require.NoError(t, err)
	run(t, bus)
	require.Eventually(t, bus.Connected, 30*time.Second, 10*time.Millisecond)
	require.False(t, <-connectedDuringResync, "cached answers were trusted before the resync")
}

// A subscription that fails while the fan-out still works through events
// read before the failure counts as lost at once, not once the fan-out
// caught up: no invalidation is heard any more, and the relay trusts its
// cached access answers (for its own clients' publishes too) only while
// Connected holds. The gap to catch up on opens then too: the hub keeps
// the ids it publishes for as long as CatchingUp holds
// (fanout.Hub.RememberPublished), and the events a lagging fan-out
// delivers while it drains fall in the catch-up's window, so their ids
// must still be there when the catch-up replays them.
// Mutations killed: marking the bus disconnected only after the events
// read ahead were delivered (Connected holds while Deliver is stuck);
// opening the gap only after the drain (CatchingUp is false meanwhile).
func TestBusCountsAsCutOffWhileTheFanoutDrains(t *testing.T) {
	t.Parallel()
	srv := dbtest.RedisServer(t)
	community := uuid.New()
	entered, release := make(chan struct{}, 1), make(chan struct{})
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	bus, err := New(srv.URL(), 16, Handlers{
		Deliver: func(c uuid.UUID, _ *nostr.Event, _ *uuid.UUID, _ int64) {
			if c == community {
				entered <- struct{}{}
				<-release
			}
		},
	}, log, NewMetrics(prometheus.NewRegistry()))
	require.NoError(t, err)
	run(t, bus)
	released := false
	defer func() {
		if !released {
			close(release) // before run's cleanup waits for the bus
		}
	}()
	require.Eventually(t, bus.Connected, 30*time.Second, 10*time.Millisecond)
	require.Eventually(t, func() bool { return !bus.CatchingUp() }, 30*time.Second, 10*time.Millisecond,
		"the start's gap is caught up on the first subscription")

	opts, err := redis.ParseURL(srv.URL())
	require.NoError(t, err)
	other := redis.NewClient(opts)
	defer other.Close()
	ev := signed(t, "read before the failure")
	require.NoError(t, other.Publish(context.Background(), ChannelName(community), `{"o":"elsewhere","e":`+string(ev.AppendJSON(nil))+`}`).Err())
	<-entered // the fan-out is busy with it

	srv.Kill()
	require.Eventually(t, func() bool { return !bus.Connected() }, time.Minute, 10*time.Millisecond,
		"the bus still counts as connected while the fan-out drains")
	require.Eventually(t, bus.CatchingUp, time.Minute, 10*time.Millisecond,
		"the gap waits for the fan-out to drain before it opens")
	close(release)
	released = true
	// The gap stays open, with Redis gone, until a catch-up on a new
	// subscription returns.
	time.Sleep(50 * time.Millisecond)
	require.True(t, bus.CatchingUp())
}

// A stalled Redis (stopped, or cut off without a reset) is noticed by
// Hears within about a second, long before the subscription is given up:
// an invalidation another process published meanwhile is unheard, and
// what must not outlive one (cached access answers) asks Hears. Once Redis
// answers again, the pongs of the pings sent meanwhile arrive in order
// with whatever was published, and the bus hears again.
// Mutation killed: Hears reporting Connected (a stalled Redis was trusted
// until the subscription was dropped, about 4 s, during which a member
// removed through another process kept receiving a private channel).
func TestBusStopsHearingAStalledRedisBeforeDroppingIt(t *testing.T) {
	t.Parallel()
	srv := dbtest.RedisServer(t)
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	bus, err := New(srv.URL(), 16, Handlers{}, log, NewMetrics(prometheus.NewRegistry()))
	require.NoError(t, err)
	bus.stall = time.Hour // only Hears is watched here
	run(t, bus)
	require.Eventually(t, bus.Hears, 30*time.Second, 10*time.Millisecond)

	require.NoError(t, syscall.Kill(srv.Pid(), syscall.SIGSTOP))
	t.Cleanup(func() { _ = syscall.Kill(srv.Pid(), syscall.SIGCONT) })
	require.Eventually(t, func() bool { return !bus.Hears() }, 30*time.Second, 10*time.Millisecond,
		"a stalled Redis is still trusted")
	require.True(t, bus.Connected(), "the subscription itself is kept")

	require.NoError(t, syscall.Kill(srv.Pid(), syscall.SIGCONT))
	require.Eventually(t, bus.Hears, 30*time.Second, 10*time.Millisecond, "the bus hears again once Redis answers")
}

// A reader held up by a lagging fan-out (its queue full) reads no pongs
// meanwhile, which is no sign of a stall: the subscription is kept, and
// every event read is delivered once the fan-out catches up.
// Mutation killed: prove counting the reader's wait for the fan-out as
// silence (the subscription was dropped and the queued events lost).
func TestFanoutLagIsNotTakenForAStall(t *testing.T) {
	t.Parallel()
	srv := dbtest.RedisServer(t)
	community := uuid.New()
	release := make(chan struct{})
	var delivered sync.WaitGroup
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	bus, err := New(srv.URL(), 16, Handlers{
		Deliver: func(uuid.UUID, *nostr.Event, *uuid.UUID, int64) {
			<-release
			delivered.Done()
		},
	}, log, NewMetrics(prometheus.NewRegistry()))
	require.NoError(t, err)
	bus.stall = 300 * time.Millisecond
	run(t, bus)
	releaseFanout := sync.OnceFunc(func() { close(release) })
	defer releaseFanout() // before run's cleanup waits for the bus
	require.Eventually(t, bus.Hears, 30*time.Second, 10*time.Millisecond)

	opts, err := redis.ParseURL(srv.URL())
	require.NoError(t, err)
	other := redis.NewClient(opts)
	defer other.Close()
	payload := `{"o":"elsewhere","e":` + string(signed(t, "lagging").AppendJSON(nil)) + `}`
	events := receiveAhead + 100 // more than the fan-out's queue holds
	delivered.Add(events)
	pipe := other.Pipeline()
	for range events {
		pipe.Publish(t.Context(), ChannelName(community), payload)
	}
	_, err = pipe.Exec(t.Context())
	require.NoError(t, err)

	require.Eventually(t, bus.waitingForRoom.Load, 30*time.Second, time.Millisecond, "the reader never waited for the fan-out")
	time.Sleep(hearingWindow + bus.stall) // longer than both, with no pong read
	require.False(t, bus.Hears(), "unread pongs prove nothing")
	releaseFanout()
	all := make(chan struct{})
	go func() { delivered.Wait(); close(all) }()
	select {
	case <-all:
	case <-time.After(30 * time.Second):
		t.Fatal("events published before the lag ended were lost: a lagging fan-out was taken for a stalled Redis")
	}
	require.True(t, bus.Connected())
	require.Eventually(t, bus.Hears, 30*time.Second, 10*time.Millisecond)
}

// An event crosses with the readers version its write read, so the
// receiving fan-out refuses a reader set older than it even when the
// removing process's invalidation has not arrived yet (fanout.Hub.
// PublishWritten).
// Mutation killed: the version left out of the message (0 arrives).
func TestEventCrossesWithItsReadersVersion(t *testing.T) {
	t.Parallel()
	url := dbtest.RedisURL(t)
	community, channel := uuid.New(), uuid.New()
	versions := make(chan int64, 4)
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	receiver, err := New(url, 16, Handlers{
		Deliver: func(c uuid.UUID, _ *nostr.Event, ch *uuid.UUID, readersVersion int64) {
			if c == community && ch != nil && *ch == channel {
				versions <- readersVersion
			}
		},
	}, log, NewMetrics(prometheus.NewRegistry()))
	require.NoError(t, err)
	run(t, receiver)
	require.Eventually(t, receiver.Connected, 30*time.Second, 10*time.Millisecond)
	publisher, err := New(url, 16, Handlers{}, log, NewMetrics(prometheus.NewRegistry()))
	require.NoError(t, err)
	run(t, publisher)
	require.Eventually(t, publisher.Connected, 30*time.Second, 10*time.Millisecond)

	publisher.PublishEvent(community, signed(t, "in the channel"), &channel, 7)
	select {
	case got := <-versions:
		require.Equal(t, int64(7), got)
	case <-time.After(30 * time.Second):
		t.Fatal("the event never crossed")
	}
}

// On shutdown the events still queued for the fan-out are dropped, not
// delivered one by one: each delivery may wait up to 2 s on a database that
// hangs, and a full queue would hold the shutdown for minutes.
// Mutation killed: delivering the queue after ctx ended (all 50 delivered).
func TestShutdownDropsWhatWaitsForTheFanout(t *testing.T) {
	t.Parallel()
	srv := dbtest.RedisServer(t)
	community := uuid.New()
	entered, release := make(chan struct{}, 1), make(chan struct{})
	var delivered atomic.Int32
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	bus, err := New(srv.URL(), 16, Handlers{
		Deliver: func(uuid.UUID, *nostr.Event, *uuid.UUID, int64) {
			if delivered.Add(1) == 1 {
				entered <- struct{}{}
				<-release
			}
		},
	}, log, NewMetrics(prometheus.NewRegistry()))
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	stopped := make(chan struct{})
	go func() { bus.Run(ctx); close(stopped) }()
	defer func() { cancel(); <-stopped }()
	require.Eventually(t, bus.Hears, 30*time.Second, 10*time.Millisecond)

	opts, err := redis.ParseURL(srv.URL())
	require.NoError(t, err)
	other := redis.NewClient(opts)
	defer other.Close()
	payload := `{"o":"elsewhere","e":` + string(signed(t, "queued").AppendJSON(nil)) + `}`
	pipe := other.Pipeline()
	for range 50 {
		pipe.Publish(t.Context(), ChannelName(community), payload)
	}
	_, err = pipe.Exec(t.Context())
	require.NoError(t, err)
	<-entered // the fan-out is busy with the first; the rest queue behind it
	require.Eventually(t, func() bool { return testutil.ToFloat64(bus.metrics.Received) == 50 }, 30*time.Second, time.Millisecond)

	cancel()
	close(release)
	<-stopped
	require.Equal(t, int32(1), delivered.Load(), "events queued at shutdown were delivered")
}

// A subscription that fails while its catch-up runs opens a gap of its
// own: the next subscription catches up on it, from no earlier than what
// the failed one started hearing, and CatchingUp holds throughout.
// Mutation killed: clearing CatchingUp when a catch-up returns whatever
// happened meanwhile (it is false between the two catch-ups).
func TestFailureDuringACatchUpIsCaughtUpNext(t *testing.T) {
	t.Parallel()
	srv := dbtest.RedisServer(t)
	type window struct{ since, until time.Time }
	windows := make(chan window, 4)
	entered, release := make(chan struct{}, 4), make(chan struct{})
	var calls atomic.Int32
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	bus, err := New(srv.URL(), 16, Handlers{
		CatchUp: func(_ context.Context, since, until time.Time) (int, error) {
			windows <- window{since, until}
			if calls.Add(1) == 1 {
				entered <- struct{}{}
				<-release
			}
			return 0, nil
		},
	}, log, NewMetrics(prometheus.NewRegistry()))
	require.NoError(t, err)
	run(t, bus)
	released := false
	defer func() {
		if !released {
			close(release)
		}
	}()
	require.Eventually(t, bus.Connected, 30*time.Second, 10*time.Millisecond)

	srv.Kill() // the first gap
	require.Eventually(t, bus.CatchingUp, time.Minute, 10*time.Millisecond)
	require.NoError(t, srv.Restart(t.Context()))
	<-entered // the first catch-up runs, on the second subscription
	first := <-windows
	srv.Kill() // the second subscription fails while it runs
	require.Eventually(t, func() bool { return !bus.Connected() }, time.Minute, 10*time.Millisecond)
	close(release)
	released = true
	time.Sleep(50 * time.Millisecond)
	require.True(t, bus.CatchingUp(), "the second gap is not caught up yet")

	require.NoError(t, srv.Restart(t.Context()))
	select {
	case second := <-windows:
		require.False(t, second.since.Before(first.until), "the second gap began once the second subscription heard")
	case <-time.After(30 * time.Second):
		t.Fatal("the gap opened during the first catch-up was never caught up")
	}
	require.Eventually(t, func() bool { return !bus.CatchingUp() }, 30*time.Second, 10*time.Millisecond)
}

// A process that starts while Redis is down serves its own subscribers
// without hearing the others, as after a lost subscription: its first
// subscription catches up from the bus's start, and CatchingUp holds
// until then. A start with Redis up replays nothing and counts no gap.
// Mutations killed: no gap at start (CatchingUp is false while Redis is
// down, and the first subscription never catches up); counting the
// start's gap when it replayed nothing (the quiet start counts one).
func TestStartDuringAnOutageIsCaughtUpOnTheFirstSubscription(t *testing.T) {
	t.Parallel()
	srv := dbtest.RedisServer(t)
	srv.Kill()
	type window struct{ since, until time.Time }
	windows := make(chan window, 4)
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	metrics := NewMetrics(prometheus.NewRegistry())
	before := time.Now()
	bus, err := New(srv.URL(), 16, Handlers{
		CatchUp: func(_ context.Context, since, until time.Time) (int, error) {
			windows <- window{since, until}
			return 1, nil
		},
	}, log, metrics)
	require.NoError(t, err)
	run(t, bus)
	time.Sleep(50 * time.Millisecond)
	require.False(t, bus.Connected())
	require.True(t, bus.CatchingUp(), "unheard since the start")

	require.NoError(t, srv.Restart(t.Context()))
	select {
	case w := <-windows:
		require.False(t, w.since.After(time.Now()))
		require.False(t, w.since.Before(before.Add(-time.Second)), "from the bus's start")
	case <-time.After(30 * time.Second):
		t.Fatal("the first subscription never caught up on the time before it")
	}
	require.Eventually(t, func() bool { return !bus.CatchingUp() }, 30*time.Second, 10*time.Millisecond)
	require.Equal(t, 1.0, testutil.ToFloat64(metrics.Gaps.WithLabelValues("replayed")))

	// A start with Redis up: its catch-up finds nothing, and no gap counts.
	quiet := NewMetrics(prometheus.NewRegistry())
	idle, err := New(srv.URL(), 16, Handlers{
		CatchUp: func(context.Context, time.Time, time.Time) (int, error) { return 0, nil },
	}, log, quiet)
	require.NoError(t, err)
	run(t, idle)
	require.Eventually(t, func() bool { return idle.Connected() && !idle.CatchingUp() }, 30*time.Second, 10*time.Millisecond)
	require.Zero(t, testutil.CollectAndCount(quiet.Gaps))
}

// What announces itself on the alive channel is remembered only as a
// process id, at most mostPeers of them; a goodbye forgets one; silence
// counts only while this process hears itself or others, and all the
// peers gone silent together are one replay from the earliest last sign
// of life.
// Mutations killed: tracking any payload (garbage is a peer that then
// dies); no bound on the peers; counting silence while nothing is heard.
func TestPeersRememberedAreBoundedAndGarbageIsIgnored(t *testing.T) {
	t.Parallel()
	start := time.Now()
	p := newPeers(start)
	const self = "00000000000000aa"
	for _, garbage := range []string{"", "not hex at all!", "0123", strings.Repeat("f", 17), strings.Repeat("z", 16), strings.Repeat("ab", 1<<16)} {
		p.heard(garbage, self, start.Add(time.Second))
		p.heard(garbage+" "+goodbyeWord, self, start.Add(time.Second))
	}
	require.Empty(t, p.lastHeard, "garbage is no peer")
	require.Equal(t, start, p.heardAny, "garbage is no sign of anyone's life")

	p.heard(self, self, start)
	require.Empty(t, p.lastHeard, "this process is not its own peer")
	for i := range mostPeers + 100 {
		p.heard(fmt.Sprintf("%016x", i+1), self, start.Add(time.Duration(i)*time.Microsecond))
	}
	require.Len(t, p.lastHeard, mostPeers)
	p.heard(fmt.Sprintf("%016x", 1)+" "+goodbyeWord, self, start)
	require.Len(t, p.lastHeard, mostPeers-1, "a goodbye forgets its process")

	later := start.Add(peerDeadAfter + time.Second)
	_, dead := p.dead(later, false)
	require.Zero(t, dead, "nothing dies while this process does not hear Redis")
	_, dead = p.dead(later, true)
	require.Zero(t, dead, "nothing dies while no announcement is heard, this process's own included")
	p.heard(self, self, later)
	since, dead := p.dead(later, true)
	require.Equal(t, mostPeers-1, dead)
	require.Equal(t, start.Add(time.Microsecond), since, "one replay, from the earliest last sign of life")
	require.Empty(t, p.lastHeard, "each dead peer is replayed once")
}

// Messages on the bus's channels that do not decode are counted each, and
// warned about once per interval: a buggy or hostile publisher flooding a
// channel with junk must not write a line per message into every relay's
// log. The next warning says how many went unlogged.
// Mutations killed: a warning per message (100 lines); no count.
func TestUndecodableMessagesAreCountedAndWarnedAboutOncePerInterval(t *testing.T) {
	t.Parallel()
	// Its own redis-server: the junk published here must not reach the
	// tests running beside it, which count and log what they hear (nor theirs here).
	url := dbtest.RedisServer(t).URL()
	community := uuid.New()
	var logged syncBuffer
	delivered := make(chan string, 4)
	bus, err := New(url, 16, Handlers{
		Deliver: func(c uuid.UUID, ev *nostr.Event, _ *uuid.UUID, _ int64) {
			if c == community {
				delivered <- ev.ID
			}
		},
	}, slog.New(slog.NewTextHandler(&logged, nil)), NewMetrics(prometheus.NewRegistry()))
	require.NoError(t, err)
	bus.junk.interval = time.Hour
	run(t, bus)
	require.Eventually(t, bus.Connected, 30*time.Second, 10*time.Millisecond)

	opts, err := redis.ParseURL(url)
	require.NoError(t, err)
	other := redis.NewClient(opts)
	t.Cleanup(func() { other.Close() })
	// After junk, a well-formed event: once it arrives, the junk before it
	// was read.
	publishJunk := func(n int) {
		for i := range n {
			junk := []string{"not json", `{"o":"elsewhere","e":{"kind":"nine"}}`}[i%2]
			require.NoError(t, other.Publish(t.Context(), ChannelName(community), junk).Err())
		}
		ev := signed(t, "after the junk")
		require.NoError(t, other.Publish(t.Context(), ChannelName(community), `{"o":"elsewhere","e":`+string(ev.AppendJSON(nil))+`}`).Err())
		require.Equal(t, ev.ID, next(t, delivered))
	}
	publishJunk(100)
	require.Equal(t, 100.0, testutil.ToFloat64(bus.metrics.Undecodable))
	require.Equal(t, 1, strings.Count(logged.String(), "level=WARN"), "one warning for the flood:\n%s", logged.String())

	bus.junk.mu.Lock()
	bus.junk.interval = time.Nanosecond
	bus.junk.mu.Unlock()
	publishJunk(1)
	require.Equal(t, 101.0, testutil.ToFloat64(bus.metrics.Undecodable))
	require.Equal(t, 2, strings.Count(logged.String(), "level=WARN"))
	require.Contains(t, logged.String(), "skipped_without_warning=99", "the next warning tells how many went unlogged")
}

// An announcement that reports unpublished events makes the process that
// hears it replay from the database from that time; a time older than
// what the fan-out still remembers is brought forward to it, so nothing
// delivered before is sent twice. The process's own announcements and
// malformed ones replay nothing.
// Mutation killed: no reach (the replay starts an hour back).
func TestReportedUnpublishedEventsAreReplayedWithinReach(t *testing.T) {
	t.Parallel()
	srv := dbtest.RedisServer(t)
	replays := make(chan time.Time, 8)
	bus, err := New(srv.URL(), 16, Handlers{
		CatchUp: func(_ context.Context, since, _ time.Time) (int, error) {
			replays <- since
			return 0, nil
		},
	}, slog.New(slog.NewTextHandler(io.Discard, nil)), NewMetrics(prometheus.NewRegistry()))
	require.NoError(t, err)
	run(t, bus)
	require.Eventually(t, bus.Connected, 30*time.Second, 10*time.Millisecond)
	require.Equal(t, bus.start, <-replays, "the gap before the first subscription")

	opts, err := redis.ParseURL(srv.URL())
	require.NoError(t, err)
	other := redis.NewClient(opts)
	t.Cleanup(func() { other.Close() })
	const peer = "00000000000000bb"
	announce := func(payload string) {
		require.NoError(t, other.Publish(t.Context(), aliveChannel, payload).Err())
	}
	// Alive throughout: its death would be a replay of its own.
	stopAnnouncing := keepAnnouncing(t, other, peer)
	recent := time.Now().Add(-time.Second)
	announce(bus.origin + " unpublished " + fmt.Sprint(time.Now().UnixNano()))
	announce(peer + " unpublished not-a-time")
	announce(peer + " unpublished " + fmt.Sprint(recent.UnixNano()))
	select {
	case since := <-replays:
		require.True(t, since.Equal(recent), "replayed from %s, reported %s", since, recent)
	case <-time.After(30 * time.Second):
		t.Fatal("no replay for the reported events")
	}

	old := time.Now().Add(-time.Hour)
	before := time.Now()
	stopAnnouncing()
	announce(peer + " unpublished " + fmt.Sprint(old.UnixNano()))
	announce(peer + " " + goodbyeWord)
	select {
	case since := <-replays:
		require.False(t, since.Before(before.Add(-unpublishedReach)), "replayed from %s, an hour back", since)
	case <-time.After(30 * time.Second):
		t.Fatal("no replay for the events reported before a goodbye")
	}
	require.Eventually(t, func() bool {
		return testutil.ToFloat64(bus.metrics.Gaps.WithLabelValues("unpublished_replayed")) == 2
	}, 30*time.Second, 10*time.Millisecond)
	require.Empty(t, replays, "this process's own report and a malformed one replay nothing")
}

// An event queued after the bus said goodbye (a writer the shutdown did
// not wait for) is counted and logged, not left in a queue nobody reads:
// the others replay nothing for a process that said goodbye.
// Mutation killed: no check after the goodbye (nothing counted, the event
// stays pending).
func TestEventQueuedAfterTheGoodbyeIsCountedAsDropped(t *testing.T) {
	t.Parallel()
	var logged syncBuffer
	bus, err := New(dbtest.RedisURL(t), 16, Handlers{}, slog.New(slog.NewTextHandler(&logged, nil)), NewMetrics(prometheus.NewRegistry()))
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { bus.Run(ctx); close(done) }()
	require.Eventually(t, bus.Connected, 30*time.Second, 10*time.Millisecond)
	cancel()
	<-done

	bus.PublishEvent(uuid.New(), signed(t, "too late"), nil, 0)
	require.Equal(t, 1.0, testutil.ToFloat64(bus.metrics.Dropped.WithLabelValues("after_goodbye")))
	require.Zero(t, testutil.ToFloat64(bus.metrics.Pending))
	require.Contains(t, logged.String(), "committed after this relay said goodbye")
}

// Reports of unpublished events heard while a replay for them waits to
// start join that replay: a peer reporting again and again (a burst of
// failures, or a bug) costs one replay at a time, from the oldest time
// reported, not one database read per report.
// Mutation killed: a replay queued per report (101 replays).
func TestReportsOfUnpublishedEventsShareOneReplay(t *testing.T) {
	t.Parallel()
	srv := dbtest.RedisServer(t)
	replays := make(chan time.Time, 256)
	release := make(chan struct{})
	bus, err := New(srv.URL(), 16, Handlers{
		CatchUp: func(_ context.Context, since, _ time.Time) (int, error) {
			replays <- since
			<-release
			return 0, nil
		},
	}, slog.New(slog.NewTextHandler(io.Discard, nil)), NewMetrics(prometheus.NewRegistry()))
	require.NoError(t, err)
	run(t, bus)
	require.Equal(t, bus.start, next0(t, replays), "the gap before the first subscription")
	// The fan-out is held in that first replay while the reports arrive.
	require.Eventually(t, bus.Connected, 30*time.Second, 10*time.Millisecond)

	opts, err := redis.ParseURL(srv.URL())
	require.NoError(t, err)
	other := redis.NewClient(opts)
	t.Cleanup(func() { other.Close() })
	const peer = "00000000000000bb"
	keepAnnouncing(t, other, peer) // alive throughout: its death would be a replay of its own
	first := time.Now().Add(-time.Second)
	for i := range 100 {
		at := first.Add(time.Duration(i) * time.Millisecond)
		require.NoError(t, other.Publish(t.Context(), aliveChannel, peer+" unpublished "+fmt.Sprint(at.UnixNano())).Err())
	}
	// After the burst, an older report: the waiting replay starts from it.
	oldest := first.Add(-time.Second)
	require.NoError(t, other.Publish(t.Context(), aliveChannel, peer+" unpublished "+fmt.Sprint(oldest.UnixNano())).Err())
	// Every report read (the fan-out, held, cannot tell).
	require.Eventually(t, func() bool { return bus.reportedSince.Load() == oldest.UnixNano() }, 30*time.Second, 10*time.Millisecond)
	close(release)
	require.True(t, oldest.Equal(next0(t, replays)), "one replay, from the oldest report")
	require.Eventually(t, func() bool {
		return testutil.ToFloat64(bus.metrics.Gaps.WithLabelValues("unpublished_replayed")) == 1
	}, 30*time.Second, 10*time.Millisecond)
	require.Empty(t, replays, "the other reports joined that replay")
}

// keepAnnouncing announces peer on the alive channel through client every
// 200 ms until the returned stop is called or the test ends.
func keepAnnouncing(t *testing.T, client *redis.Client, peer string) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		for ctx.Err() == nil {
			_ = client.Publish(ctx, aliveChannel, peer).Err()
			select {
			case <-ctx.Done():
			case <-time.After(200 * time.Millisecond):
			}
		}
	}()
	stop = sync.OnceFunc(func() { cancel(); <-done })
	t.Cleanup(stop)
	return stop
}

// next0 is the next time on ch.
func next0(t *testing.T, ch <-chan time.Time) time.Time {
	t.Helper()
	select {
	case got := <-ch:
		return got
	case <-time.After(30 * time.Second):
		t.Fatal("nothing arrived")
		return time.Time{}
	}
}

// aliveMessages subscribes to the alive channel of the Redis at url and
// hands on what is published there.
func aliveMessages(t *testing.T, url string) <-chan string {
	t.Helper()
	opts, err := redis.ParseURL(url)
	require.NoError(t, err)
	client := redis.NewClient(opts)
	t.Cleanup(func() { client.Close() })
	sub := client.Subscribe(t.Context(), aliveChannel)
	t.Cleanup(func() { sub.Close() })
	_, err = sub.Receive(t.Context()) // the confirmation
	require.NoError(t, err)
	out := make(chan string, 64)
	go func() {
		for m := range sub.Channel() {
			out <- m.Payload
		}
	}()
	return out
}

// nextFrom is the next message on ch from the process origin.
func nextFrom(t *testing.T, ch <-chan string, origin string) string {
	t.Helper()
	for {
		select {
		case m := <-ch:
			if strings.HasPrefix(m, origin) {
				return m
			}
		case <-time.After(30 * time.Second):
			t.Fatal("nothing announced")
			return ""
		}
	}
}

// busThatDroppedOne is a bus, not yet run, whose queue of one was full
// for the second of two events queued within dropped. (Stopped at once,
// its sender may try the first too, under the ended context, and fail:
// the report may then name the first.)
func busThatDroppedOne(t *testing.T, url string) (*Bus, span) {
	t.Helper()
	bus, err := New(url, 1, Handlers{}, slog.New(slog.NewTextHandler(io.Discard, nil)), NewMetrics(prometheus.NewRegistry()))
	require.NoError(t, err)
	community := uuid.New()
	dropped := span{from: time.Now()}
	bus.PublishEvent(community, signed(t, "queued"), nil, 0)
	bus.PublishEvent(community, signed(t, "dropped: the queue holds one"), nil, 0)
	dropped.until = time.Now()
	require.Equal(t, 1.0, testutil.ToFloat64(bus.metrics.Dropped.WithLabelValues("queue_full")))
	return bus, dropped
}

// requireReported checks that m is origin's report of events unpublished
// since a time within dropped.
func requireReported(t *testing.T, m, origin string, dropped span) {
	t.Helper()
	nanos, ok := strings.CutPrefix(m, origin+" "+unpublishedWord+" ")
	require.True(t, ok, "a report of unpublished events, not %q", m)
	n, err := strconv.ParseInt(nanos, 10, 64)
	require.NoError(t, err)
	at := time.Unix(0, n)
	require.False(t, at.Before(dropped.from) || at.After(dropped.until), "reported %s, dropped between %s and %s", at, dropped.from, dropped.until)
}

// An event that finds the publish queue full is reported, in a message of
// its own just before the process's next announcement, which a process of
// a release that knows no reports still reads as a plain announcement.
// Mutation killed: the full queue not noted (no report is ever sent).
func TestAnEventDroppedOnAFullQueueIsReported(t *testing.T) {
	t.Parallel()
	srv := dbtest.RedisServer(t)
	alive := aliveMessages(t, srv.URL())
	bus, dropped := busThatDroppedOne(t, srv.URL())
	run(t, bus)

	requireReported(t, nextFrom(t, alive, bus.origin), bus.origin, dropped)
	require.Equal(t, bus.origin, nextFrom(t, alive, bus.origin), "the announcement follows its report, as it always read")
}

// A process that stops with events unpublished reports them just before
// its goodbye, so the others replay them before forgetting it.
// Mutation killed: the goodbye reporting nothing.
func TestAGoodbyeIsPrecededByItsReport(t *testing.T) {
	t.Parallel()
	srv := dbtest.RedisServer(t)
	alive := aliveMessages(t, srv.URL())
	bus, dropped := busThatDroppedOne(t, srv.URL())
	// Stopped at once: its first announcement would come 500 ms after
	// it subscribed.
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	bus.Run(ctx)

	requireReported(t, nextFrom(t, alive, bus.origin), bus.origin, dropped)
	require.Equal(t, bus.origin+" "+goodbyeWord, nextFrom(t, alive, bus.origin))
}

// Writers publishing while the bus says goodbye leave nothing in its
// queue: an event queued in the instant between a writer's look at the
// goodbye and its send is taken out again by that writer, not left
// pending in a queue nobody reads. A race, so many tries.
// Mutation killed: no second look after the send (an event stays queued,
// the pending gauge above 0; seen within 9 tries of 200, so 50 are made).
func TestPublishingThroughTheGoodbyeLeavesNothingQueued(t *testing.T) {
	t.Parallel()
	url := dbtest.RedisURL(t)
	ev := signed(t, "racing the goodbye")
	for try := range 50 {
		bus, err := New(url, 100000, Handlers{}, slog.New(slog.NewTextHandler(io.Discard, nil)), NewMetrics(prometheus.NewRegistry()))
		require.NoError(t, err)
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { bus.Run(ctx); close(done) }()
		require.Eventually(t, bus.Connected, 30*time.Second, time.Millisecond)
		var stop atomic.Bool
		var writers sync.WaitGroup
		for range 4 {
			writers.Go(func() {
				for !stop.Load() {
					bus.PublishEvent(uuid.Nil, ev, nil, 0)
				}
			})
		}
		cancel()
		<-done
		// Writing on after the goodbye until every writer has seen it.
		require.Eventually(t, func() bool {
			return testutil.ToFloat64(bus.metrics.Dropped.WithLabelValues("after_goodbye")) >= 4
		}, 30*time.Second, time.Millisecond)
		stop.Store(true)
		writers.Wait()
		require.Zero(t, testutil.ToFloat64(bus.metrics.Pending), "try %d: pending after the goodbye", try)
		require.Zero(t, len(bus.queue), "try %d: left in the queue after the goodbye", try)
	}
}

// A process whose publishes keep failing reports its unpublished events at
// most once per reportEvery of its clock, however many announcements it
// makes meanwhile: each report makes every other process replay from the
// database. Between reports the failures join the next one. The bus's
// clock stands still while it announces (several times, a failure before
// each), and moves on only between those rounds.
//
// Mutation killed: a report with every announcement (no spacing): each
// round reports after each failure, 4 times, not at most once.
func TestReportsOfUnpublishedEventsAreSpacedByTheClock(t *testing.T) {
	t.Parallel()
	srv := dbtest.RedisServer(t)
	alive := aliveMessages(t, srv.URL())
	bus, err := New(srv.URL(), 16, Handlers{}, slog.New(slog.NewTextHandler(io.Discard, nil)), NewMetrics(prometheus.NewRegistry()))
	require.NoError(t, err)
	start := time.Now()
	var elapsed atomic.Int64
	bus.clock = clock.Stub(func() time.Time { return start.Add(time.Duration(elapsed.Load())) })
	community := uuid.New()
	fail := func() {
		bus.FailNextPublish()
		bus.PublishEvent(community, signed(t, "not published"), nil, 0)
		require.Eventually(t, func() bool { return !bus.failNextPublish.Load() }, 30*time.Second, time.Millisecond, "the publish fails")
	}
	run(t, bus)
	require.Eventually(t, bus.Connected, 30*time.Second, 10*time.Millisecond)

	// round counts the reports among the next four announcements, with a
	// failed publish before each.
	round := func() int {
		reports := 0
		for range 4 {
			fail()
			for {
				m := nextFrom(t, alive, bus.origin)
				if m == bus.origin {
					break
				}
				requireReported(t, m, bus.origin, span{from: start, until: time.Now()})
				reports++
			}
		}
		return reports
	}
	var got []int
	for _, at := range []time.Duration{0, reportEvery - time.Millisecond, reportEvery, 2 * reportEvery} {
		elapsed.Store(int64(at))
		got = append(got, round())
	}
	require.Equal(t, []int{1, 0, 1, 1}, got, "reports per round, at 0, 1.999 s, 2 s and 4 s of the bus's clock")
}
