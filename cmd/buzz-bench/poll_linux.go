//go:build linux

package main

import (
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"runtime"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"
)

// Polled subscribers. A thousand subscribers each blocked in a read of its
// own cost the load generator, per delivery, a goroutine wake-up, the read
// of the message, and a second read that finds nothing and parks the
// goroutine again: on a 2-core machine that also runs the relay under
// test, about as much CPU as the relay spends sending it, taken from the
// relay. Once subscribed, each socket is taken from the WebSocket library
// and Go's poller, and a few pollers wait on epoll for all of them, reading
// each ready socket once. What is measured does not change: a delivery is
// received when the read that completed it returns, and each subscriber
// still records every event once (deliveryLog).

// pollerWaitMillis bounds each epoll wait, so a poller notices within it
// that the group is stopping.
const pollerWaitMillis = 50

// poller reads the subscribers registered with its epoll instance. Its
// fields belong to its goroutine until close.
type poller struct {
	epfd int
	subs map[int32]*polledSub // by socket descriptor
}

// polledSub is one subscriber's socket and the bytes read but not yet
// parsed, buf[start:end].
type polledSub struct {
	sub        *liveSubscriber
	fd         int
	buf        []byte
	start, end int
	oob        [64]byte // the receive timestamp's control message
}

// initialPollBuffer holds several relay messages; a larger one grows it.
const initialPollBuffer = 4 << 10

// startPollers moves every subscriber to pollers, one per processor, and
// starts them; false (nothing moved) when a subscriber has no plain TCP
// connection to take (TLS).
func (g *subscriberGroup) startPollers(runID string, clock *sendClock, errs *tally) bool {
	if len(g.subs) == 0 {
		return false
	}
	for _, s := range g.subs {
		if s.conn.tcp == nil {
			return false
		}
	}
	pollers := make([]*poller, min(runtime.GOMAXPROCS(0), len(g.subs)))
	for i := range pollers {
		epfd, err := syscall.EpollCreate1(syscall.EPOLL_CLOEXEC)
		if err != nil {
			for _, p := range pollers[:i] {
				p.close()
			}
			errs.addErr("subscriber poll", err)
			return false
		}
		pollers[i] = &poller{epfd: epfd, subs: map[int32]*polledSub{}}
	}
	for i, s := range g.subs {
		p := pollers[i%len(pollers)]
		if err := p.add(s); err != nil {
			errs.addErr("subscriber poll", err)
		}
	}
	g.pollers = pollers
	for _, p := range pollers {
		g.wg.Go(func() { p.run(runID, clock, &g.stopping, errs) })
	}
	return true
}

// add takes s's socket: a duplicate descriptor is registered here, and the
// original is closed, which takes it out of Go's poller while the socket
// stays open under the duplicate. Nothing is lost in the library's
// buffers: the relay sends a subscriber nothing between EOSE and the first
// live event, and the publisher starts only after this.
func (p *poller) add(s *liveSubscriber) error {
	raw, err := s.conn.tcp.SyscallConn()
	if err != nil {
		return err
	}
	fd, dupErr := -1, error(nil)
	if err := raw.Control(func(orig uintptr) { fd, dupErr = syscall.Dup(int(orig)) }); err != nil {
		return err
	}
	if dupErr != nil {
		return dupErr
	}
	syscall.CloseOnExec(fd)
	if err := syscall.SetNonblock(fd, true); err != nil {
		syscall.Close(fd)
		return err
	}
	// The kernel stamps what it receives, so each read also tells when its
	// bytes reached the socket (arrivalStamp).
	if err := syscall.SetsockoptInt(fd, syscall.SOL_SOCKET, syscall.SO_TIMESTAMPNS, 1); err != nil {
		syscall.Close(fd)
		return err
	}
	if err := s.conn.tcp.Close(); err != nil {
		syscall.Close(fd)
		return err
	}
	ev := syscall.EpollEvent{Events: syscall.EPOLLIN | syscall.EPOLLRDHUP, Fd: int32(fd)}
	if err := syscall.EpollCtl(p.epfd, syscall.EPOLL_CTL_ADD, fd, &ev); err != nil {
		syscall.Close(fd)
		return err
	}
	p.subs[int32(fd)] = &polledSub{sub: s, fd: fd, buf: make([]byte, initialPollBuffer)}
	return nil
}

// run reads ready sockets until the group stops or no socket is left.
func (p *poller) run(runID string, clock *sendClock, stopping *atomic.Bool, errs *tally) {
	events := make([]syscall.EpollEvent, 128)
	for !stopping.Load() && len(p.subs) > 0 {
		n, err := syscall.EpollWait(p.epfd, events, pollerWaitMillis)
		if errors.Is(err, syscall.EINTR) {
			continue
		}
		if err != nil {
			errs.addErr("subscriber poll", err)
			return
		}
		for _, ev := range events[:n] {
			ps := p.subs[ev.Fd]
			if ps == nil {
				continue
			}
			if err := ps.readReady(runID, clock, errs); err != nil {
				if !stopping.Load() {
					errs.addErr("subscriber read", err)
				}
				delete(p.subs, ev.Fd)
				syscall.Close(ps.fd) // also leaves the epoll set
			}
		}
	}
}

// close closes every socket and the epoll instance; after run returned.
func (p *poller) close() {
	for _, ps := range p.subs {
		syscall.Close(ps.fd)
	}
	p.subs = nil
	syscall.Close(p.epfd)
}

// readReady reads what one ready socket holds, once, and handles every
// whole frame read so far.
func (ps *polledSub) readReady(runID string, clock *sendClock, errs *tally) error {
	if ps.end == len(ps.buf) {
		ps.makeRoom()
	}
	n, oobn, _, _, err := syscall.Recvmsg(ps.fd, ps.buf[ps.end:], ps.oob[:], 0)
	// Both clocks from one reading: read apart, a preemption between them
	// would move the arrival.
	wall := time.Now()
	now := int64(wall.Sub(epoch)) + 1 // monoNow
	arrived := arrivalStamp(ps.oob[:max(oobn, 0)], now, wall.UnixNano())
	switch {
	case errors.Is(err, syscall.EAGAIN) || errors.Is(err, syscall.EINTR):
		return nil
	case err != nil:
		return err
	case n == 0:
		return io.EOF
	}
	ps.end += n
	for {
		f, size, err := nextFrame(ps.buf[ps.start:ps.end])
		if err != nil {
			return err
		}
		if size == 0 {
			break
		}
		ps.start += size
		switch f.opcode {
		case opText:
			msg, err := decodeRelayMsg(f.payload)
			if err != nil {
				errs.addErr("subscriber decode", err)
				continue
			}
			ps.sub.handle(msg, now, arrived, runID, clock, errs)
		case opPing:
			if err := ps.pong(f.payload); err != nil {
				return err
			}
		case opPong:
		case opClose:
			return fmt.Errorf("closed by the relay: %q", f.payload)
		default:
			return fmt.Errorf("unexpected frame, opcode %d", f.opcode)
		}
	}
	if ps.start == ps.end {
		ps.start, ps.end = 0, 0
	}
	return nil
}

// arrivalStamp turns the receive timestamp of a read's control messages
// into the monotonic clock of monoNow: now and wallNow are the two clocks
// read together right after the read. TCP stamps a read with the arrival of
// the last segment it took, so a read taking several frames gives the
// earlier ones a later arrival than theirs, never an earlier one. Without
// a stamp it returns now: no arrival before the read is claimed.
//
// A thousand subscribers on the load generator's two processors are read
// one after another; the read time then includes the wait for the
// generator to reach a socket, which a subscriber on a machine of its own
// would not have. The arrival time leaves that wait out.
func arrivalStamp(oob []byte, now, wallNow int64) int64 {
	for len(oob) >= syscall.SizeofCmsghdr {
		h := (*syscall.Cmsghdr)(unsafe.Pointer(&oob[0]))
		if h.Len < syscall.SizeofCmsghdr || int(h.Len) > len(oob) {
			break
		}
		data := oob[syscall.CmsgLen(0):h.Len]
		if h.Level == syscall.SOL_SOCKET && h.Type == syscall.SCM_TIMESTAMPNS && len(data) >= int(unsafe.Sizeof(syscall.Timespec{})) {
			ts := (*syscall.Timespec)(unsafe.Pointer(&data[0]))
			if ago := wallNow - ts.Nano(); ago > 0 {
				return now - ago
			}
			return now
		}
		oob = oob[min(syscall.CmsgSpace(int(h.Len)-syscall.CmsgLen(0)), len(oob)):]
	}
	return now
}

// makeRoom moves the unparsed bytes to the front, or doubles the buffer
// when they fill it (a frame larger than the buffer).
func (ps *polledSub) makeRoom() {
	if ps.start > 0 {
		ps.end = copy(ps.buf, ps.buf[ps.start:ps.end])
		ps.start = 0
		return
	}
	grown := make([]byte, 2*len(ps.buf))
	copy(grown, ps.buf[:ps.end])
	ps.buf = grown
}

// pong answers a ping; the relay closes a connection that does not.
func (ps *polledSub) pong(payload []byte) error {
	var key [4]byte
	_, _ = rand.Read(key[:])
	frame := pongFrame(payload, key)
	for len(frame) > 0 {
		n, err := syscall.Write(ps.fd, frame)
		if errors.Is(err, syscall.EINTR) {
			continue
		}
		if err != nil {
			return fmt.Errorf("pong: %w", err)
		}
		frame = frame[n:]
	}
	return nil
}
