package crossrelay

import (
	"context"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

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
	url := dbtest.RedisURL(t)
	// The bus hears every community on this redis-server, which other
	// packages' tests share: keep only this test's community, and never
	// block the bus on a full channel.
	community, channel := uuid.New(), uuid.New()
	events := make(chan received, 4)
	invalidated := make(chan uuid.UUID, 4)
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	bus, err := New(url, 16, Handlers{
		Deliver: func(c uuid.UUID, ev *nostr.Event, ch *uuid.UUID) {
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
