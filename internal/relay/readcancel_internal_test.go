package relay

import (
	"context"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/stretchr/testify/require"
)

// Reads are not given the connection's context, so its cancellation must
// still end a read in progress (a writer that failed, a shutdown) and close
// the socket, as it did when every read was given the context.
//
// Mutation killed: readMessage without its context.AfterFunc (a read in
// progress waits for a message that never comes; one started after the
// cancellation returns, but the socket stays open).
func TestCancellingTheConnectionEndsAReadInProgress(t *testing.T) {
	t.Parallel()
	c, client := acceptTestConn(t)
	want := []byte(`["REQ","s",{}]`)
	// The client's calls outlive the bound below, so nothing but the
	// cancellation can end the read within it.
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	require.NoError(t, client.Write(ctx, websocket.MessageText, want))
	_, data, _, _, err := c.readMessage()
	require.NoError(t, err)
	require.Equal(t, want, data)

	ended := make(chan error, 1)
	go func() {
		_, _, _, _, err := c.readMessage()
		ended <- err
	}()
	c.cancel()
	select {
	case err := <-ended:
		require.Error(t, err)
	case <-time.After(30 * time.Second):
		t.Fatal("the read went on after the connection was cancelled")
	}
	closedCtx, cancelClosed := context.WithTimeout(ctx, 30*time.Second)
	defer cancelClosed()
	_, _, err = client.Read(closedCtx)
	require.Error(t, err)
	require.NoError(t, closedCtx.Err(), "the client sees the connection closed, not the end of its wait: %v", err)
	_, _, _, _, err = c.readMessage()
	require.ErrorIs(t, err, context.Canceled, "no read starts on a cancelled connection")
}

// benchConn is a connection of the relay's and the client dialled to it,
// closed when the benchmark ends.
func benchConn(b *testing.B) (*conn, *websocket.Conn, context.Context) {
	url, accepted := serveTestConns(b)
	ctx, cancel := context.WithCancel(context.Background())
	b.Cleanup(cancel)
	client, _, err := websocket.Dial(ctx, url, nil)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { client.CloseNow() })
	c := <-accepted
	b.Cleanup(c.cancel)
	return c, client, ctx
}

// BenchmarkReadMessageOverWebSocket is one EVENT read off a real socket by
// readMessage: the frame, the library's reader and the pooled buffer.
func BenchmarkReadMessageOverWebSocket(b *testing.B) {
	data := benchEventMessage(b)
	c, client, ctx := benchConn(b)
	n := b.N
	go func() {
		for range n {
			if client.Write(ctx, websocket.MessageText, data) != nil {
				return
			}
		}
	}()
	b.ReportAllocs()
	b.ResetTimer()
	for range n {
		_, got, _, _, err := c.readMessage()
		if err != nil || len(got) != len(data) {
			b.Fatal(err)
		}
		readBuffers.put(got)
	}
}

// BenchmarkReadOversizedMessageOverWebSocket is one EVENT of 1000 KiB, its
// id after the content, read past by readMessage: what a client sending
// messages over the limit costs the relay per byte.
func BenchmarkReadOversizedMessageOverWebSocket(b *testing.B) {
	id := strings.Repeat("ab", 32)
	data := []byte(`["EVENT",{"content":"` + strings.Repeat("x", 1000<<10) + `","id":"` + id + `"}]`)
	c, client, ctx := benchConn(b)
	c.ws.SetReadLimit(4 * int64(c.srv.cfg.MaxMessageBytes))
	n := b.N
	go func() {
		for range n {
			if client.Write(ctx, websocket.MessageText, data) != nil {
				return
			}
		}
	}()
	b.SetBytes(int64(len(data)))
	b.ReportAllocs()
	b.ResetTimer()
	for range n {
		_, got, size, oversized, err := c.readMessage()
		if err != nil || got != nil || size != int64(len(data)) || !strings.Contains(string(oversized.Refusal("x")), id) {
			b.Fatal(err)
		}
	}
}

// A client sending messages over the limit makes the relay fill a buffer
// of the whole limit for each before it reads past the rest; that buffer
// goes back to the pool instead of being grown anew every time (1.1 MB of
// allocations per message of 384 KiB before, measured by
// BenchmarkReadOversizedMessageOverWebSocket). Under the race detector the
// pool drops a quarter of what it is given, so the bound is one limit's
// worth per message, not zero.
// Mutation killed: readMessage not putting the buffer of an oversized
// message back.
func TestOversizedMessagesReuseTheirReadBuffer(t *testing.T) {
	// Not parallel: it counts the process's allocations.
	c, client := acceptTestConn(t)
	limit := c.srv.cfg.MaxMessageBytes
	c.ws.SetReadLimit(4 * int64(limit))
	msg := []byte(`["REQ","big",{"#t":["` + strings.Repeat("v", limit+limit/2) + `"]}]`)
	const messages = 100
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	go func() {
		for range messages + 1 {
			if client.Write(ctx, websocket.MessageText, msg) != nil {
				return
			}
		}
	}()
	read := func() {
		t.Helper()
		typ, data, size, oversized, err := c.readMessage()
		require.NoError(t, err)
		require.Equal(t, websocket.MessageText, typ)
		require.Nil(t, data)
		require.Equal(t, int64(len(msg)), size)
		require.Equal(t, "big", oversized.SubID())
	}
	read() // the first fills the pool
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	for range messages {
		read()
	}
	runtime.ReadMemStats(&after)
	perMessage := (after.TotalAlloc - before.TotalAlloc) / messages
	t.Logf("%d bytes allocated per oversized message of %d bytes", perMessage, len(msg))
	require.Less(t, perMessage, uint64(limit), "each oversized message allocated a buffer of the limit anew")
}
