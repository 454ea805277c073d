package relay_test

import (
	"bytes"
	"context"
	"fmt"
	"runtime"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/buzzrelay/buzz/internal/relaytest"
)

// openSubscribers opens n connections that authenticate, read a little
// history through a live subscription and then sit idle, as fan-out
// subscribers do. One event is delivered live to each, so every connection
// has also run its writer.
func openSubscribers(t *testing.T, r *relaytest.Relay, n int) {
	t.Helper()
	publisher := r.Dial(t, "")
	publisher.Auth(nil)
	for i := range 3 {
		publisher.Publish(publisher.Sign(1, fmt.Sprintf("history %d", i), nil, 0))
	}
	subs := make([]*relaytest.Client, n)
	for i := range subs {
		subs[i] = r.Dial(t, "")
		subs[i].Auth(nil)
		subs[i].Send("REQ", "live", map[string]any{"kinds": []int{1}, "limit": 3})
		for range 3 {
			subs[i].Expect("EVENT")
		}
		subs[i].Expect("EOSE")
	}
	publisher.Publish(publisher.Sign(1, "live", nil, 0))
	for _, s := range subs {
		require.Equal(t, "live", s.Expect("EVENT").SubID)
	}
}

// connectionGoroutines counts the goroutines running a connection's code
// (its reader, writer or message handler), and those of net/http serving a
// connection.
func connectionGoroutines() (relayConn, httpServe int) {
	for g := range bytes.SplitSeq(allStacks(), []byte("\n\n")) {
		if bytes.Contains(g, []byte("internal/relay.(*conn)")) {
			relayConn++
		}
		if bytes.Contains(g, []byte("net/http.(*conn).serve")) {
			httpServe++
		}
	}
	return relayConn, httpServe
}

// An idle subscribed connection holds exactly one goroutine, its reader:
// no writer parked between deliveries, no handler left behind, and
// net/http's serving goroutine (with its stack, buffers and request) gone
// once the connection is upgraded.
// Mutations killed: a writer goroutine parked for the connection's life
// (two per connection); a message handler that does not end; running the
// connection inside net/http's handler, as before (a serving goroutine per
// connection).
//
// Not parallel: it counts the process's goroutines, so another test's
// connections would be counted as this one's.
func TestIdleConnectionHoldsOneGoroutine(t *testing.T) {
	r := relaytest.Start(t)
	const n = 20
	openSubscribers(t, r, n)
	require.Eventually(t, func() bool {
		relayConn, httpServe := connectionGoroutines()
		return relayConn == n+1 && httpServe == 0 // the publisher counts too
	}, 30*time.Second, 10*time.Millisecond, "want one goroutine per connection (%d) and none of net/http's", n+1)
}

// A message is handled on a goroutine of its own, never on the goroutine
// that reads the connection, so that goroutine's stack stays as shallow as
// reading needs. Caught in the act: a REQ blocked on a locked table.
// Mutation killed: handling messages on the reading goroutine.
func TestMessageHandledOffTheReadingGoroutine(t *testing.T) {
	t.Parallel()
	r := relaytest.Start(t)
	c := r.Dial(t, "")
	c.Auth(nil)
	ctx := t.Context()
	tx, err := r.Pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(context.Background()) }()
	_, err = tx.Exec(ctx, "LOCK TABLE events IN ACCESS EXCLUSIVE MODE")
	require.NoError(t, err)
	c.Send("REQ", "blocked", map[string]any{"kinds": []int{1}})
	var handling [][]byte
	require.Eventually(t, func() bool {
		handling = goroutinesRunning("internal/relay.(*conn).onReq")
		return len(handling) > 0
	}, 30*time.Second, 10*time.Millisecond, "the REQ never reached its handler")
	for _, g := range handling {
		require.NotContains(t, string(g), "internal/relay.(*conn).run(", "handled on the reading goroutine")
	}
	require.NoError(t, tx.Rollback(ctx))
	c.Expect("EOSE")
}

// goroutinesRunning returns the stacks of the goroutines whose stack
// names fn.
func goroutinesRunning(fn string) [][]byte {
	var found [][]byte
	for g := range bytes.SplitSeq(allStacks(), []byte("\n\n")) {
		if bytes.Contains(g, []byte(fn)) {
			found = append(found, g)
		}
	}
	return found
}

func allStacks() []byte {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			return buf[:n]
		}
		buf = make([]byte, 2*len(buf))
	}
}
