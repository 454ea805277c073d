package relay

import (
	"io"
	"sync"
	"sync/atomic"
)

// handlers runs connections' short jobs, handling a message and writing
// what is queued for a client, on goroutines kept between jobs. Both need
// a deep stack (decoding, hashing, verifying, a database round trip; the
// WebSocket library's writer); a goroutine started per job began small and
// grew its stack by copying, two or three times per job, and then gave it
// back. A kept goroutine has grown once. Only maxIdle of them wait for work
// at a time: the others end as they finish, so what is kept is bounded by
// the process, not by its connections, and the reading goroutines stay
// shallow (see conn.handleAside).
type handlers struct {
	work    chan func() // unbuffered: a send succeeds only to a waiting goroutine
	idle    atomic.Int32
	maxIdle int32
	started atomic.Int64 // goroutines ever started
	live    atomic.Int32 // goroutines running or waiting now
}

// messageHandlers is shared by every server of the process: goroutines are
// a process's resource, and a test running many servers keeps no more.
var messageHandlers = newHandlers(64)

// jobs is where the server's connections run their short jobs:
// messageHandlers unless a test gave the server its own.
func (s *Server) jobs() *handlers {
	if s.handlers != nil {
		return s.handlers
	}
	return messageHandlers
}

func newHandlers(maxIdle int32) *handlers {
	return &handlers{work: make(chan func()), maxIdle: maxIdle}
}

// run calls fn on a waiting goroutine, or on a new one if none waits. It
// does not wait for fn.
func (h *handlers) run(fn func()) {
	select {
	case h.work <- fn:
	default:
		h.started.Add(1)
		h.live.Add(1)
		go h.loop(fn)
	}
}

func (h *handlers) loop(fn func()) {
	for {
		fn()
		if h.idle.Add(1) > h.maxIdle {
			h.idle.Add(-1)
			h.live.Add(-1)
			return
		}
		fn = <-h.work
		h.idle.Add(-1)
	}
}

// readBuffers hold client messages while they are handled. A message read
// into a fresh slice cost two or three allocations as the slice grew, for
// every message; a buffer is taken for one message and given back once it
// was handled, and held by no connection in between.
var readBuffers bufferPool

// keptReadBuffer is the largest small buffer: a message that outgrows it is
// read into a buffer of the whole limit (see read).
const keptReadBuffer = 64 << 10

// bufferPool keeps small buffers, up to keptReadBuffer, and apart from them
// large ones of a whole message limit: a rare large message (a long-form
// note) must not hand its buffer to every small one, and a message over the
// limit, which fills one before it is read past, must not allocate it anew
// each time (growing to 256 KiB by appending cost 1.1 MB of allocations per
// oversized message). Both are sync.Pools, so what is idle goes at the
// next collections: the pool keeps no more large buffers than were in use
// at once.
type bufferPool struct{ small, large sync.Pool }

func (p *bufferPool) get() []byte {
	if b, ok := p.small.Get().(*[]byte); ok {
		return (*b)[:0]
	}
	return make([]byte, 0, 4<<10)
}

// getLarge is an empty buffer of at least size bytes.
func (p *bufferPool) getLarge(size int) []byte {
	if b, ok := p.large.Get().(*[]byte); ok && cap(*b) >= size {
		return (*b)[:0]
	}
	return make([]byte, 0, size)
}

func (p *bufferPool) put(b []byte) {
	if cap(b) > keptReadBuffer {
		p.large.Put(&b)
		return
	}
	p.small.Put(&b)
}

// read reads what r holds, up to limit bytes, until EOF, into a buffer of
// the pool's: a small one, doubled up to keptReadBuffer, then one of limit
// bytes. The caller puts it back.
func (p *bufferPool) read(r io.Reader, limit int) ([]byte, error) {
	buf := p.get()
	for len(buf) < limit {
		if len(buf) == cap(buf) {
			var grown []byte
			if cap(buf) < keptReadBuffer {
				// Doubled exactly: append's growth would make a buffer
				// just over keptReadBuffer, taken for a large one when
				// put back.
				grown = make([]byte, 0, min(max(2*cap(buf), 4<<10), keptReadBuffer))
			} else {
				grown = p.getLarge(limit)
			}
			grown = append(grown, buf...)
			p.put(buf)
			buf = grown
		}
		n, err := r.Read(buf[len(buf):min(cap(buf), limit)])
		buf = buf[:len(buf)+n]
		if err == io.EOF {
			return buf, nil
		}
		if err != nil {
			return buf, err
		}
	}
	return buf, nil
}
