package relay_test

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/buzzrelay/buzz/internal/dbtest"
	"github.com/buzzrelay/buzz/internal/nostr"
	"github.com/buzzrelay/buzz/internal/relaytest"
)

// readAuthCounter counts the queries that decide who may read a channel.
type readAuthCounter struct{ n atomic.Int64 }

func (c *readAuthCounter) TraceQueryStart(ctx context.Context, _ *pgx.Conn, data pgx.TraceQueryStartData) context.Context {
	if strings.Contains(data.SQL, "name: ChannelsReadable") || strings.Contains(data.SQL, "name: ChannelReaders") {
		c.n.Add(1)
	}
	return ctx
}

func (c *readAuthCounter) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// After a membership change drops every cached answer, one event published
// into a private channel with many pinned subscribers costs one read
// authorization query, not one per subscriber on the publisher's goroutine.
// Mutation killed: asking the per-reader readable set for each subscriber in
// fan-out (as before) makes the count equal the subscribers.
func TestLiveChannelAuthorizationIsOneQueryPerPublish(t *testing.T) {
	t.Parallel()
	counter := &readAuthCounter{}
	pool := dbtest.PoolOn(t, dbtest.URL(t), 0, func(c *pgxpool.Config) { c.ConnConfig.Tracer = counter })
	r := relaytest.StartOn(t, pool)

	owner := r.Dial(t, "")
	owner.Auth(nil)
	ch := createChannel(t, owner, "many readers", true)
	const subscribers = 20
	members := make([]*relaytest.Client, subscribers)
	for i := range members {
		m := r.Dial(t, "")
		m.Auth(nil)
		require.True(t, owner.Publish(owner.Sign(9000, "", nostr.Tags{{"h", ch}, {"p", m.Key.PublicKeyHex()}}, 0)).OK)
		m.Send("REQ", "live", map[string]any{"kinds": []int{9}, "#h": []string{ch}, "limit": 0})
		m.Expect("EOSE")
		members[i] = m
	}
	// A membership change invalidates every cached answer of the community.
	newcomer := relaytest.NewKey(t)
	require.True(t, owner.Publish(owner.Sign(9000, "", nostr.Tags{{"h", ch}, {"p", newcomer.PublicKeyHex()}}, 0)).OK)

	counter.n.Store(0)
	msg := owner.Sign(9, "to everyone", nostr.Tags{{"h", ch}}, 0)
	require.True(t, owner.Publish(msg).OK)
	for _, m := range members {
		got := m.Expect("EVENT")
		require.Equal(t, msg.ID, got.Event.ID)
	}
	require.LessOrEqual(t, counter.n.Load(), int64(1), "read authorization must be decided once per publish, not per subscriber")
}
