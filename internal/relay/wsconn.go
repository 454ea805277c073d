package relay

import (
	"bufio"
	"net"
	"net/http"
	"sync"
)

// The WebSocket library writes each message through a bufio.Writer and
// flushes it at the end of the message: one write system call per message
// per subscriber. And it keeps, for the connection's whole life, the two
// 4 KB buffers net/http handed over with the hijacked socket. The types
// here replace both: small buffers of our own, and a socket wrapper that
// the writer goroutine corks while it writes a batch of queued messages,
// so the batch leaves in one write. The room it gathers them in is
// borrowed from a pool shared by every connection, only while writing.

const (
	// wsReadBuffer holds one typical client message (a signed event is
	// well under a kilobyte) so it is read in one call; larger ones are read
	// straight into the message.
	wsReadBuffer = 1024
	// wsWriteBuffer fits a whole control frame (2-byte header and at most
	// 125 bytes of payload), so a ping, pong or close frame written
	// outside a batch still leaves in one write. Message payloads pass
	// through it into the corked socket.
	wsWriteBuffer = 128
	// corkFlushBytes is how much a corked socket gathers before it writes
	// anyway: a long batch (a history being read) leaves in chunks this
	// size rather than held whole a second time.
	corkFlushBytes = 64 << 10
)

// corkBuffers lend the gathering room of a batch to whichever connection is
// writing one.
var corkBuffers = sync.Pool{New: func() any { b := make([]byte, 0, 4<<10); return &b }}

// corkConn is the hijacked socket. While corked, writes are gathered in a
// borrowed buffer; uncork writes them out together. Writes reach the socket
// in the order they were made: the mutex is held across the socket write,
// so a control frame written while a batch is corked cannot overtake the
// batch, nor land inside a frame half gathered.
type corkConn struct {
	net.Conn
	mu      sync.Mutex
	pending *[]byte // non-nil while corked
	// writes counts socket writes, for the tests of coalescing.
	writes int
}

func (c *corkConn) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.pending == nil {
		c.writes++
		return c.Conn.Write(p)
	}
	*c.pending = append(*c.pending, p...)
	if len(*c.pending) >= corkFlushBytes {
		if err := c.flushLocked(); err != nil {
			return 0, err
		}
	}
	return len(p), nil
}

// cork starts gathering writes.
func (c *corkConn) cork() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.pending == nil {
		c.pending = corkBuffers.Get().(*[]byte)
	}
}

// uncork writes what was gathered in one call and returns the buffer.
func (c *corkConn) uncork() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.pending == nil {
		return nil
	}
	err := c.flushLocked()
	b := c.pending
	c.pending = nil
	if cap(*b) <= corkFlushBytes*2 {
		*b = (*b)[:0]
		corkBuffers.Put(b)
	}
	return err
}

func (c *corkConn) flushLocked() error {
	if len(*c.pending) == 0 {
		return nil
	}
	c.writes++
	_, err := c.Conn.Write(*c.pending)
	*c.pending = (*c.pending)[:0]
	return err
}

// socketWrites is the number of writes that reached the socket.
func (c *corkConn) socketWrites() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.writes
}

// hijackWriter hands the WebSocket library a corkConn and small buffers of
// its own instead of net/http's. Once the handler returns, net/http's
// per-connection state (its buffers, the request, the serving goroutine)
// is garbage.
type hijackWriter struct {
	http.ResponseWriter
	conn *corkConn
}

func (w *hijackWriter) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	conn, brw, err := http.NewResponseController(w.ResponseWriter).Hijack()
	if err != nil {
		return nil, nil, err
	}
	w.conn = &corkConn{Conn: conn}
	r := brw.Reader
	// A client may send its first frames right behind the handshake; they
	// sit in net/http's reader, which is then kept rather than lose them.
	if r.Buffered() == 0 {
		r = bufio.NewReaderSize(w.conn, wsReadBuffer)
	}
	return w.conn, bufio.NewReadWriter(r, bufio.NewWriterSize(w.conn, wsWriteBuffer)), nil
}

// Unwrap lets http.ResponseController reach the server's writer.
func (w *hijackWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }
