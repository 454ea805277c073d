package relay

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"net/http"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/buzzrelay/buzz/internal/nostr"
)

// The frames writeLiveNow builds are read by the WebSocket library as the
// messages they carry, at every length encoding: 7-bit, 16-bit and 64-bit,
// at both sides of each boundary, and wrapped in the EVENT envelope when
// the message has a subscription id.
// Mutations killed: the 7-bit form used for 126 (`n <= 126`), the 16-bit
// form for 65,536, the FIN bit left out (the client waits for more), the
// envelope left out.
func TestTextFramesReadByTheLibrary(t *testing.T) {
	t.Parallel()
	c, client := acceptTestConn(t)
	var want [][]byte
	var buf []byte
	for _, n := range []int{0, 1, 125, 126, 127, 65535, 65536, 300_000} {
		for _, subID := range []string{"", "sub-1"} {
			m := queued{msg: bytes.Repeat([]byte{'a' + byte(n%26)}, n), subID: subID}
			var start int
			buf, start = textFrame(buf, m)
			expect := m.msg
			if subID != "" {
				expect = nostr.EncodeEventRaw(subID, m.msg)
			}
			want = append(want, expect)
			frame := append([]byte(nil), buf[start:]...)
			go func() { _, _ = c.sock.Conn.Write(frame) }()
			got := readMessages(t, client, 1)[0]
			require.Equal(t, len(expect), len(got), "payload of %d bytes, sub %q", n, subID)
			require.Equal(t, expect, got)
		}
	}
	require.Len(t, want, 16)
}

// A live event for a connection with nothing queued is written on the
// goroutine that queues it: no writer runs afterwards, the live count is
// settled, and the client reads it whole.
// Mutation killed: enqueueLive always starting the writer goroutine (the
// writer is still running, or has not written, when enqueueLive returns).
func TestLiveDeliveryToAnIdleConnectionIsWrittenAtOnce(t *testing.T) {
	t.Parallel()
	c, client := acceptTestConn(t)
	for i := range 20 {
		ev := fmt.Appendf(nil, `{"id":"%064d"}`, i)
		before := c.sock.socketWrites()
		require.True(t, c.EnqueueEvent("s", ev))
		require.Equal(t, 1, c.sock.socketWrites()-before, "written before EnqueueEvent returned")
		c.out.mu.Lock()
		writing, live := c.out.writing, c.out.live
		c.out.mu.Unlock()
		require.False(t, writing, "no writer left running")
		require.Zero(t, live)
		require.Equal(t, nostr.EncodeEventRaw("s", ev), readMessages(t, client, 1)[0])
	}
}

// capSendBuffer caps the relay side's socket buffer (and stops the kernel
// growing it), so a frame larger than it and what the client has room for
// cannot be taken whole.
func capSendBuffer(t *testing.T, c *conn, size int) {
	t.Helper()
	tcp, ok := c.sock.Conn.(*net.TCPConn)
	require.True(t, ok)
	require.NoError(t, tcp.SetWriteBuffer(size))
}

// A frame the socket takes only part of, with nothing queued behind it:
// its tail goes out by itself once the client reads, before anything
// queued later, and every message arrives intact and in order.
// Mutations killed: the tail dropped (the client reads a broken frame);
// the writer not sending the tail when nothing else is queued (the client
// waits for the rest of the first message); the tail sent after what was
// queued later.
func TestFrameTheSocketTookInPartFinishesFirst(t *testing.T) {
	t.Parallel()
	c, client := acceptTestConn(t)
	capSendBuffer(t, c, 16<<10)
	big := fmt.Appendf(nil, `{"content":"%s"}`, strings.Repeat("x", 600_000))

	// Alone: nothing queued behind it brings the writer back.
	require.True(t, c.EnqueueEvent("big", big))
	tookPart(t, c, 1)
	require.Equal(t, nostr.EncodeEventRaw("big", big), readMessages(t, client, 1)[0])
	writerEnds(t, c)

	// Followed by messages queued while its tail waits.
	require.True(t, c.EnqueueEvent("big", big))
	tookPart(t, c, 2)
	want := [][]byte{nostr.EncodeEventRaw("big", big)}
	for i := range 5 {
		ev := fmt.Appendf(nil, `{"id":"%064d"}`, i)
		require.True(t, c.EnqueueEvent("s", ev))
		want = append(want, nostr.EncodeEventRaw("s", ev))
	}
	got := readMessages(t, client, len(want))
	for i := range want {
		require.Equal(t, want[i], got[i], "message %d", i)
	}
	writerEnds(t, c)
}

// tookPart checks that all n live writes so far went out at once and each
// left a tail. It reads counters, not the tail: the writer goroutine starts
// sending the tail at once, holding the socket's mutex until the client
// reads.
func tookPart(t *testing.T, c *conn, n int) {
	t.Helper()
	writes, partial := c.sock.noWaitCounts()
	require.Equal(t, n, writes, "written at once")
	require.Equal(t, n, partial, "the socket took only part of a 600 KB frame")
}

// Live deliveries from several publishing goroutines race replies to the
// client's own requests, in rounds that each start on an idle connection
// with a frame larger than the socket takes at once, the others queued
// behind its tail or, every other round, racing once it is written: each
// message arrives exactly once, whole, each goroutine's in the order it
// queued them, and the large frame's tail before what was queued behind it.
// Mutations killed: wroteFirst leaving the written message queued (a
// duplicate); wroteFirst ending the writer's run with messages queued
// behind it (they are stranded: the read times out); a live event written
// at once while a writer runs (out of order, or inside a batch).
func TestLiveWritesRaceTheWriterExactlyOnceInOrder(t *testing.T) {
	t.Parallel()
	c, client := acceptTestConn(t)
	capSendBuffer(t, c, 128<<10)
	const rounds, publishers, each = 30, 4, 6
	const replier, opener = publishers, publishers + 1 // senders that are not publishers
	message := func(sender, seq int) []byte {
		// Sender and sequence, padded to a size that varies up to 2 KB;
		// the opener's are 900 KB.
		pad := (seq*7919 + sender*104729) % 2_000
		if sender == opener {
			pad = 900_000
		}
		return fmt.Appendf(nil, "%02d:%06d:%s", sender, seq, bytes.Repeat([]byte{'p'}, pad))
	}
	envelope := []byte(`["EVENT","s",`)
	// readRound reads one round's messages and checks each; its bound is
	// per round, not one for the whole test: under the race detector on a
	// loaded machine the 30 rounds together took 59 s, and a stranded
	// message still fails its round within a minute.
	next := make([]int, opener+1)
	readRound := func() error {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		for range 1 + (publishers+1)*each {
			_, data, err := client.Read(ctx)
			if err != nil {
				return err
			}
			if bytes.HasPrefix(data, envelope) {
				data = data[len(envelope) : len(data)-1]
			}
			var sender, seq int
			if _, err := fmt.Sscanf(string(data[:min(len(data), 10)]), "%02d:%06d:", &sender, &seq); err != nil || sender > opener {
				return fmt.Errorf("unreadable message %q: %v", data[:min(len(data), 20)], err)
			}
			if seq != next[sender] {
				return fmt.Errorf("sender %d: got message %d, want %d", sender, seq, next[sender])
			}
			if !bytes.Equal(data, message(sender, seq)) {
				return fmt.Errorf("sender %d message %d arrived damaged", sender, seq)
			}
			next[sender]++
		}
		return nil
	}
	read := make(chan error)
	go func() {
		for range rounds {
			err := readRound()
			read <- err
			if err != nil {
				return
			}
		}
	}()
	for r := range rounds {
		require.True(t, c.EnqueueEvent("s", message(opener, r)))
		if r%2 == 1 {
			// This round the others race each other on an idle
			// connection, rather than queue behind the opener's tail.
			require.Eventually(t, func() bool {
				c.out.mu.Lock()
				defer c.out.mu.Unlock()
				return !c.out.writing
			}, 30*time.Second, 100*time.Microsecond)
		}
		var wg sync.WaitGroup
		for p := range publishers {
			wg.Go(func() {
				for i := range each {
					assert.True(t, c.EnqueueEvent("s", message(p, r*each+i)), "publisher %d message %d refused", p, i)
				}
			})
		}
		wg.Go(func() {
			for i := range each {
				assert.NoError(t, c.send(message(replier, r*each+i)))
			}
		})
		wg.Wait()
		require.NoError(t, <-read, "round %d", r)
	}
	direct, partial := c.sock.noWaitCounts()
	t.Logf("%d written at once, %d of them in part", direct, partial)
	require.Positive(t, direct, "some messages were written at once")
	require.Positive(t, partial, "some of them only in part")
}

// Once the library has written a close frame, no data frame follows it:
// writeNoWait refuses, and the message stays with the writer, which the
// library then refuses too.
// Mutation killed: corkConn not noticing the close frame.
func TestNoDataFrameWrittenAfterTheCloseFrame(t *testing.T) {
	t.Parallel()
	c, client := acceptTestConn(t)
	go func() { _, _, _ = client.Read(context.Background()) }() // answers the close
	go func() { _ = c.ws.Close(websocket.StatusNormalClosure, "bye") }()
	require.Eventually(t, func() bool {
		c.sock.mu.Lock()
		defer c.sock.mu.Unlock()
		return c.sock.closeSent
	}, time.Minute, time.Millisecond, "the library's close frame is seen")
	buf, start := textFrame(nil, queued{msg: []byte(`{"id":"late"}`), subID: "s"})
	taken, _ := c.sock.writeNoWait(buf[start:])
	require.False(t, taken)
}

// The bytes a live delivery holds in the queue are given back once it is
// written, whichever goroutine writes it (the one that queued it, or the
// writer, for the tail of a frame the socket took in part and for what was
// queued behind it): a connection that reads along receives any number of
// events, however many bytes they add up to, and ends with nothing
// counted. A leak here would close every long-lived subscriber as slow
// once its lifetime traffic passed BUZZ_SEND_QUEUE_BYTES.
// Mutations killed: sent not giving back a written delivery's bytes
// (written(0)); wroteFirst not giving them back.
func TestLiveBytesAreGivenBackOnceWritten(t *testing.T) {
	t.Parallel()
	c, client := acceptTestConn(t)
	capSendBuffer(t, c, 16<<10)
	big := func(i int) []byte {
		return fmt.Appendf(nil, `{"id":"%064d","content":"%s"}`, i, strings.Repeat("x", 600_000))
	}
	c.srv.cfg.SendQueueBytes = 3 * len(big(0)) // before anything is queued
	const rounds = 4
	for i := range rounds {
		// The socket takes part of the big one; the small one waits for
		// the writer behind its tail.
		small := fmt.Appendf(nil, `{"id":"%064d"}`, i)
		require.True(t, c.EnqueueEvent("s", big(i)), "round %d", i)
		require.True(t, c.EnqueueEvent("s", small), "round %d", i)
		got := readMessages(t, client, 2)
		require.Equal(t, nostr.EncodeEventRaw("s", big(i)), got[0])
		require.Equal(t, nostr.EncodeEventRaw("s", small), got[1])
	}
	_, partial := c.sock.noWaitCounts()
	require.NotZero(t, partial, "the writer wrote some of them")
	require.Eventually(t, func() bool {
		c.out.mu.Lock()
		defer c.out.mu.Unlock()
		return c.out.live == 0 && c.out.liveBytes == 0
	}, 30*time.Second, time.Millisecond, "live deliveries still counted after all were read")
}

// BenchmarkLiveEventToIdleConnection is one live delivery as a fan-out
// makes it: an event queued for a connection with nothing queued, framed
// and written to its socket on the caller's goroutine. The client reads the
// raw socket meanwhile (no WebSocket library on its side, whose per-message
// work would be most of the time), a few frames behind at most, as a
// subscriber of a fan-out has one event at a time to read. Over loopback
// the kernel's share (the write, and the client's receive path, which runs
// in the writer's system call) is in the time.
func BenchmarkLiveEventToIdleConnection(b *testing.B) {
	c, client := acceptRawClient(b)
	ev := fmt.Appendf(nil, `{"id":"%064d","pubkey":"%064d","created_at":1700000000,"kind":1,"tags":[["t","fanout-run"]],"content":"%s","sig":"%0128d"}`, 1, 2, strings.Repeat("lorem ", 33), 3)
	frame, start := textFrame(nil, queued{msg: ev, subID: "live"})
	frameLen := int64(len(frame) - start)
	var readBytes atomic.Int64
	done := make(chan struct{})
	go func() {
		defer close(done)
		buf := make([]byte, 64<<10)
		for {
			n, err := client.Read(buf)
			readBytes.Add(int64(n))
			if err != nil {
				return
			}
		}
	}()
	b.ReportAllocs()
	var sent int64
	for b.Loop() {
		for sent-readBytes.Load()/frameLen > 8 {
			runtime.Gosched()
		}
		if !c.EnqueueEvent("live", ev) {
			b.Fatal("not queued")
		}
		sent++
	}
	b.StopTimer()
	client.Close()
	<-done
}

// acceptRawClient is acceptTestConn with the client's socket itself, once
// the handshake is done, for a reader without the WebSocket library.
func acceptRawClient(tb testing.TB) (*conn, net.Conn) {
	tb.Helper()
	url, accepted := serveTestConns(tb)
	var raw net.Conn
	client := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
		var d net.Dialer
		nc, err := d.DialContext(ctx, network, addr)
		raw = nc
		return nc, err
	}}}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	_, _, err := websocket.Dial(ctx, url, &websocket.DialOptions{HTTPClient: client})
	require.NoError(tb, err)
	c := <-accepted
	tb.Cleanup(func() {
		raw.Close()
		c.ws.CloseNow()
		c.cancel()
	})
	return c, raw
}
