package relay

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/stretchr/testify/require"
	"golang.org/x/sync/semaphore"

	"github.com/buzzrelay/buzz/internal/config"
	"github.com/buzzrelay/buzz/internal/nostr"
)

// acceptTestConn serves one WebSocket connection the way the relay does
// (hijackWriter, corked socket) and returns the relay's side, not yet
// reading, and a client.
func acceptTestConn(t *testing.T) (*conn, *websocket.Conn) {
	t.Helper()
	url, accepted := serveTestConns(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	client, _, err := websocket.Dial(ctx, url, nil)
	require.NoError(t, err)
	client.SetReadLimit(1 << 20)
	c := <-accepted
	t.Cleanup(func() {
		client.CloseNow()
		c.ws.CloseNow()
		c.cancel()
	})
	return c, client
}

// serveTestConns serves WebSocket connections at url the way the relay
// does (hijackWriter, corked socket) and hands over the relay's side of
// each, not yet reading.
func serveTestConns(tb testing.TB) (url string, accepted <-chan *conn) {
	srv := &Server{cfg: config.Default(), metrics: NewMetrics(), log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	conns := make(chan *conn, 1)
	hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hw := &hijackWriter{ResponseWriter: w}
		ws, err := websocket.Accept(hw, r, &websocket.AcceptOptions{CompressionMode: websocket.CompressionDisabled})
		if err != nil {
			return
		}
		ctx, cancel := context.WithCancel(context.Background())
		c := &conn{
			srv: srv, ws: ws, sock: hw.conn, log: srv.log, ctx: ctx, cancel: cancel,
			replyRoom: semaphore.NewWeighted(int64(srv.cfg.ReplyQueueBytes)), subs: map[string]int{},
		}
		c.initWriteWatchdog()
		conns <- c
	}))
	tb.Cleanup(hs.Close)
	return "ws" + strings.TrimPrefix(hs.URL, "http"), conns
}

func readMessages(t *testing.T, client *websocket.Conn, n int) [][]byte {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	got := make([][]byte, 0, n)
	for range n {
		typ, data, err := client.Read(ctx)
		require.NoError(t, err)
		require.Equal(t, websocket.MessageText, typ)
		got = append(got, data)
	}
	return got
}

// writerEnds waits for the writer goroutine to finish with every delivery
// counted, so what is queued next starts a run of its own.
func writerEnds(t *testing.T, c *conn) {
	t.Helper()
	require.Eventually(t, func() bool {
		c.out.mu.Lock()
		defer c.out.mu.Unlock()
		return !c.out.writing && c.out.live == 0
	}, time.Minute, time.Millisecond, "the writer ended with every delivery counted")
}

// Messages queued while the writer is not running leave as one batch in one
// socket write, each intact, in order, live events wrapped for their own
// subscription and replies as queued; the queue's accounting is settled.
// Mutations killed: flushing the socket per message (n writes); an event
// written without its envelope; the batch's live count and reply room not
// given back.
func TestQueuedMessagesLeaveInOneWriteIntactAndInOrder(t *testing.T) {
	t.Parallel()
	c, client := acceptTestConn(t)
	const n = 200
	var want [][]byte
	for i := range n {
		switch i % 3 {
		case 0:
			ev := fmt.Appendf(nil, `{"id":"%064d","content":"event %d"}`, i, i)
			subID := fmt.Sprintf("sub-%d", i%7)
			ok, _ := c.out.pushLive(queued{msg: ev, subID: subID}, n, math.MaxInt)
			require.True(t, ok)
			want = append(want, nostr.EncodeEventRaw(subID, ev))
		case 1:
			msg := nostr.EncodeNotice(fmt.Sprintf("live message %d", i))
			ok, _ := c.out.pushLive(queued{msg: msg}, n, math.MaxInt)
			require.True(t, ok)
			want = append(want, msg)
		case 2:
			msg := nostr.EncodeEOSE(fmt.Sprintf("reply-%d", i))
			require.NoError(t, c.replyRoom.Acquire(context.Background(), c.replyWeight(msg)))
			ok, _ := c.out.pushReply(queued{msg: msg})
			require.True(t, ok)
			want = append(want, msg)
		}
	}
	before := c.sock.socketWrites()
	c.writeQueued()
	require.Equal(t, 1, c.sock.socketWrites()-before, "one socket write for the whole batch")
	got := readMessages(t, client, n)
	for i := range want {
		require.Equal(t, string(want[i]), string(got[i]), "message %d", i)
	}
	c.out.mu.Lock()
	defer c.out.mu.Unlock()
	require.Zero(t, c.out.live, "every live delivery accounted for")
	require.True(t, c.replyRoom.TryAcquire(int64(c.srv.cfg.ReplyQueueBytes)), "all reply room given back")
}

// A REQ's replies, queued together by sendAll, leave in one socket write
// however the writer goroutine is scheduled, intact and in order; a batch
// larger than the whole reply budget still goes out, because the writer
// starts as soon as room runs out.
// Mutations killed: starting the writer at the first reply (it races the
// rest and sends them a few at a time: more writes in some round); never
// starting it before the last reply (sendAll waits for room forever).
func TestRepliesQueuedTogetherLeaveInOneWrite(t *testing.T) {
	t.Parallel()
	batch := func(n int) ([]queued, [][]byte) {
		var replies []queued
		var want [][]byte
		for i := range n {
			ev := fmt.Appendf(nil, `{"i":%d}`, i)
			replies = append(replies, queued{msg: ev, subID: "s"})
			want = append(want, nostr.EncodeEventRaw("s", ev))
		}
		eose := nostr.EncodeEOSE("s")
		return append(replies, queued{msg: eose}), append(want, eose)
	}
	c, client := acceptTestConn(t)
	for round := range 5 {
		// Enough replies that queueing them takes far longer than starting
		// a goroutine, and few enough bytes for one corked write.
		replies, want := batch(2000)
		before := c.sock.socketWrites()
		require.NoError(t, c.sendAll(replies))
		got := readMessages(t, client, len(want))
		for i := range want {
			require.Equal(t, string(want[i]), string(got[i]), "round %d, message %d", round, i)
		}
		require.Equal(t, 1, c.sock.socketWrites()-before, "round %d: one write for the REQ's replies", round)
		writerEnds(t, c) // else the next round's first replies may join this writer's run
	}

	small, smallClient := acceptTestConn(t)
	small.srv.cfg.ReplyQueueBytes = 1000
	small.replyRoom = semaphore.NewWeighted(1000)
	replies, want := batch(100) // about 2.5 KB
	sent := make(chan error, 1)
	go func() { sent <- small.sendAll(replies) }()
	got := readMessages(t, smallClient, len(want))
	for i := range want {
		require.Equal(t, string(want[i]), string(got[i]), "message %d", i)
	}
	require.NoError(t, <-sent)
}

// A batch larger than the corked socket gathers leaves in several writes,
// every byte once, in order.
// Mutations killed: a flush that does not empty the gathered bytes
// (repeated bytes corrupt the stream); gathering without bound (one write).
func TestLargeBatchLeavesInChunksIntact(t *testing.T) {
	t.Parallel()
	c, client := acceptTestConn(t)
	const n = 6
	var want [][]byte
	for i := range n {
		msg := nostr.EncodeNotice(fmt.Sprintf("%d:%s", i, bytes.Repeat([]byte{'a' + byte(i)}, corkFlushBytes/2)))
		ok, _ := c.out.pushLive(queued{msg: msg}, n, math.MaxInt)
		require.True(t, ok)
		want = append(want, msg)
	}
	before := c.sock.socketWrites()
	c.writeQueued()
	writes := c.sock.socketWrites() - before
	require.Greater(t, writes, 1)
	require.Less(t, writes, n)
	got := readMessages(t, client, n)
	for i := range want {
		require.Equal(t, string(want[i]), string(got[i]), "message %d", i)
	}
}

// A control frame written while a batch is being gathered (a ping from the
// timer, a pong, a close) reaches the client whole, not inside a message.
// Mutation killed: the corked socket gathering without its mutex (the
// writer and the pinger append to one buffer at once).
func TestControlFramesWhileCorkedStayWhole(t *testing.T) {
	t.Parallel()
	c, client := acceptTestConn(t)
	// The client must read for the relay's pings to be answered; the
	// relay's side reads for the pongs.
	go func() {
		for {
			if _, _, err := c.ws.Read(context.Background()); err != nil {
				return
			}
		}
	}()
	const rounds, perRound = 50, 20
	received := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		for i := range rounds * perRound {
			_, data, err := client.Read(ctx)
			if err == nil && string(data) != string(nostr.EncodeNotice(fmt.Sprint(i))) {
				err = fmt.Errorf("message %d: got %q", i, data)
			}
			if err != nil {
				received <- err
				return
			}
		}
		received <- nil
		// Keep answering the remaining pings until the test ends.
		_, _, _ = client.Read(ctx)
	}()
	pings := make(chan error, 1)
	go func() {
		for range rounds {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			err := c.ws.Ping(ctx)
			cancel()
			if err != nil {
				pings <- err
				return
			}
		}
		pings <- nil
	}()
	for r := range rounds {
		for i := range perRound {
			ok, _ := c.out.pushLive(queued{msg: nostr.EncodeNotice(fmt.Sprint(r*perRound + i))}, rounds*perRound, math.MaxInt)
			require.True(t, ok)
		}
		c.writeQueued()
	}
	require.NoError(t, <-received)
	require.NoError(t, <-pings)
}

// The fan-out write delay histogram gets one sample per live delivery that
// reached the socket, measured from when it was queued, and none for
// replies. Mutations killed: no observation; replies observed too; the
// delay measured from the start of the write instead of the queueing.
func TestWriteDelayIsObservedPerLiveDeliveryFromQueueing(t *testing.T) {
	t.Parallel()
	c, client := acceptTestConn(t)
	const live, replies = 5, 3
	const waited = 50 * time.Millisecond
	queuedAt := monoNow() - int64(waited)
	for i := range live {
		ok, _ := c.out.pushLive(queued{msg: []byte(`{"id":"x"}`), subID: "s", queuedAt: queuedAt}, live, math.MaxInt)
		require.True(t, ok)
		if i < replies {
			msg := nostr.EncodeEOSE("r")
			require.NoError(t, c.replyRoom.Acquire(context.Background(), c.replyWeight(msg)))
			ok, _ := c.out.pushReply(queued{msg: msg})
			require.True(t, ok)
		}
	}
	c.writeQueued()
	readMessages(t, client, live+replies)
	count, sum := histogramCountSum(t, c.srv.metrics.FanoutWriteDelay)
	require.Equal(t, uint64(live), count, "one sample per live delivery, none per reply")
	require.GreaterOrEqual(t, sum, live*waited.Seconds(), "measured from when each was queued")
}

// A live delivery is stamped when it is queued: its observed delay is
// within the time the test spent around queueing and reading it.
// Mutation killed: enqueueLive not stamping the delivery (the delay would
// then count from the clock's origin).
func TestEnqueuedDeliveryIsStampedWhenQueued(t *testing.T) {
	t.Parallel()
	c, client := acceptTestConn(t)
	before := monoNow()
	require.True(t, c.EnqueueEvent("s", []byte(`{"id":"y"}`)))
	readMessages(t, client, 1)
	deadline := time.Now().Add(30 * time.Second)
	for {
		if count, _ := histogramCountSum(t, c.srv.metrics.FanoutWriteDelay); count == 1 || time.Now().After(deadline) {
			break
		}
		time.Sleep(time.Millisecond)
	}
	elapsed := time.Duration(monoNow() - before)
	count, sum := histogramCountSum(t, c.srv.metrics.FanoutWriteDelay)
	require.Equal(t, uint64(1), count)
	require.LessOrEqual(t, sum, elapsed.Seconds())
}

func histogramCountSum(t *testing.T, h prometheus.Histogram) (uint64, float64) {
	t.Helper()
	var m dto.Metric
	require.NoError(t, h.Write(&m))
	return m.GetHistogram().GetSampleCount(), m.GetHistogram().GetSampleSum()
}
