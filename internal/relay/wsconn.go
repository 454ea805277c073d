package relay

import (
	"bufio"
	"encoding/binary"
	"errors"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"syscall"
	"unsafe"

	"github.com/buzzrelay/buzz/internal/nostr"
)

// The WebSocket library writes each message through a bufio.Writer and
// flushes it at the end of the message: one write system call per message
// per subscriber. And it keeps, for the connection's whole life, the two
// 4 KB buffers net/http handed over with the hijacked socket. The types
// here replace both: small buffers of our own, and a socket wrapper that
// the writer goroutine corks while it writes a batch of queued messages,
// so the batch leaves in one write. The room it gathers them in is
// borrowed from a pool shared by every connection, only while writing.
//
// A live event for a connection with nothing queued, the usual case of a
// fan-out to many subscribers, skips the writer goroutine altogether: the
// publishing goroutine frames it itself and writes it to the socket if the
// socket takes it without waiting (writeNoWait), else queues it as before.
// Starting a goroutine per subscriber per event, the library's two locks
// and the write watchdog's timer were a third of the relay's CPU per
// delivery.

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
	// raw writes to the socket without waiting (writeNoWait); nil when the
	// connection has no descriptor of its own (TLS).
	raw     syscall.RawConn
	mu      sync.Mutex
	pending *[]byte // non-nil while corked
	// unsent is the tail of a frame writeNoWait could not finish: it goes
	// out before anything else.
	unsent []byte
	// closeSent is set once the library wrote a close frame: no data frame
	// may follow it.
	closeSent bool
	// noWaitWrite is writeFrameNow as a function value, made once: a
	// closure made per call, with the results it sets, was three
	// allocations per delivery. noWaitFrame is the frame it writes, and
	// noWaitN and noWaitErr what the write returned (all under mu).
	noWaitWrite func(fd uintptr) bool
	noWaitFrame []byte
	noWaitN     int
	noWaitErr   error
	// writes counts socket writes, for the tests of coalescing; of them,
	// noWaitWrites were writeNoWait's, partialWrites left a tail. They are
	// atomic so a test can read them while a write holds mu, waiting for
	// the client to read.
	writes, noWaitWrites, partialWrites atomic.Int64
}

// opcodeClose is the first byte of a WebSocket close frame (FIN and opcode
// 8). The library writes a close frame, at most 127 bytes, through its
// 128-byte buffer in one flush, so it starts a Write call.
const opcodeClose = 0x88

func (c *corkConn) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(p) > 0 && p[0] == opcodeClose {
		// A data frame's later pieces may start with this byte too; taking
		// one for a close frame only stops writeNoWait on this socket.
		c.closeSent = true
	}
	if c.pending == nil {
		if err := c.writeUnsentLocked(); err != nil {
			return 0, err
		}
		c.writes.Add(1)
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
		*c.pending = append(*c.pending, c.unsent...)
		c.unsent = nil
	}
}

// writeUnsentLocked writes, waiting if it must, what writeNoWait left.
func (c *corkConn) writeUnsentLocked() error {
	if len(c.unsent) == 0 {
		return nil
	}
	c.writes.Add(1)
	_, err := c.Conn.Write(c.unsent)
	c.unsent = nil
	return err
}

// hasUnsent reports whether writeNoWait left part of a frame.
func (c *corkConn) hasUnsent() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.unsent) > 0
}

// flushUnsent writes what writeNoWait left, waiting if it must.
func (c *corkConn) flushUnsent() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.writeUnsentLocked()
}

// writeNoWait writes frame, a whole WebSocket frame, to the socket if that
// needs no waiting: nothing else is being written, nothing is left over,
// no close frame went out, and the socket's buffer takes at least part of
// it. taken reports that the frame is the socket's now; when the buffer
// took only part, the rest is kept (unsent) and finished is false: a
// writer that may wait must send it before anything else.
func (c *corkConn) writeNoWait(frame []byte) (taken, finished bool) {
	if c.raw == nil || !c.mu.TryLock() {
		return false, false
	}
	defer c.mu.Unlock()
	if c.pending != nil || c.unsent != nil || c.closeSent {
		return false, false
	}
	if c.noWaitWrite == nil {
		c.noWaitWrite = c.writeFrameNow // allocated once, not per write
	}
	c.noWaitFrame = frame
	err := c.raw.Write(c.noWaitWrite)
	n, werr := c.noWaitN, c.noWaitErr
	c.noWaitFrame, c.noWaitN, c.noWaitErr = nil, 0, nil
	if err != nil || werr != nil || n <= 0 {
		// Full, or failing: a writer that waits finds out which.
		return false, false
	}
	c.writes.Add(1)
	c.noWaitWrites.Add(1)
	if n < len(frame) {
		c.partialWrites.Add(1)
		c.unsent = append([]byte(nil), frame[n:]...)
		return true, false
	}
	return true, true
}

// writeFrameNow writes noWaitFrame to fd, never waiting for room
// (writeNoWait, under mu).
func (c *corkConn) writeFrameNow(fd uintptr) bool {
	for {
		c.noWaitN, c.noWaitErr = writeNonblocking(fd, c.noWaitFrame)
		if !errors.Is(c.noWaitErr, syscall.EINTR) {
			return true
		}
	}
}

// writeNonblocking is write(2) on a non-blocking socket (every socket Go's
// net package opens is one) without telling the scheduler it entered a
// system call, as syscall.Write does. The call cannot wait, so nothing is
// gained by handing the processor over; but a write on loopback takes
// about as long as the runtime's monitor waits (20 µs) before it takes
// the processor of a goroutine in a system call away, and in a fan-out
// to 1,000 it did so again and again: the monitor kept waking every
// 20 µs, handed the processor to another thread, and the writer had to
// get one back before its next write, about a tenth of the relay's CPU
// per delivery.
func writeNonblocking(fd uintptr, p []byte) (n int, err error) {
	r, _, errno := syscall.RawSyscall(syscall.SYS_WRITE, fd, uintptr(unsafe.Pointer(unsafe.SliceData(p))), uintptr(len(p)))
	if errno != 0 {
		return 0, errno
	}
	return int(r), nil
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
	c.writes.Add(1)
	_, err := c.Conn.Write(*c.pending)
	*c.pending = (*c.pending)[:0]
	return err
}

// noWaitCounts returns writeNoWait's writes so far, and how many of them
// left a tail.
func (c *corkConn) noWaitCounts() (writes, partial int) {
	return int(c.noWaitWrites.Load()), int(c.partialWrites.Load())
}

// socketWrites is the number of writes that reached the socket.
func (c *corkConn) socketWrites() int {
	return int(c.writes.Load())
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
	if sc, ok := conn.(syscall.Conn); ok {
		if raw, err := sc.SyscallConn(); err == nil {
			w.conn.raw = raw
		}
	}
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

// maxFrameHeader is the longest header of an unmasked frame (server to
// client): 2 bytes and an 8-byte length.
const maxFrameHeader = 10

// textFrame builds m as one unmasked text frame in buf: the header the
// library would write, then the message (wrapped in its EVENT envelope when
// it has a subscription id). The message goes after room for the longest
// header, which is then written right before it: the frame is
// buf[start:], and buf is returned for reuse.
func textFrame(buf []byte, m queued) (_ []byte, start int) {
	dst := append(buf[:0], make([]byte, maxFrameHeader)...)
	if m.subID != "" {
		dst = nostr.AppendEventRaw(dst, m.subID, m.msg)
	} else {
		dst = append(dst, m.msg...)
	}
	n := len(dst) - maxFrameHeader
	var hdr [maxFrameHeader]byte
	hdr[0] = 0x81 // FIN, text
	h := 2
	switch {
	case n < 126:
		hdr[1] = byte(n)
	case n <= 0xffff:
		hdr[1] = 126
		binary.BigEndian.PutUint16(hdr[2:], uint16(n))
		h = 4
	default:
		hdr[1] = 127
		binary.BigEndian.PutUint64(hdr[2:], uint64(n))
		h = 10
	}
	start = maxFrameHeader - h
	copy(dst[start:], hdr[:h])
	return dst, start
}
