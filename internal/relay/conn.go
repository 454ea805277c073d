package relay

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"time"

	"github.com/coder/websocket"
	"github.com/google/uuid"
	"golang.org/x/sync/semaphore"

	"github.com/buzzrelay/buzz/internal/access"
	"github.com/buzzrelay/buzz/internal/community"
	"github.com/buzzrelay/buzz/internal/eventstore"
	"github.com/buzzrelay/buzz/internal/fanout"
	"github.com/buzzrelay/buzz/internal/ingest"
	"github.com/buzzrelay/buzz/internal/nipoa"
	"github.com/buzzrelay/buzz/internal/nostr"
	"github.com/buzzrelay/buzz/internal/presence"
	"github.com/buzzrelay/buzz/internal/trace"
)

// conn is one WebSocket client, bound to one community for its lifetime.
// Messages are handled one at a time on the read goroutine, so replies keep
// the order of requests; a writer goroutine owns the socket's write side.
type conn struct {
	srv       *Server
	ws        *websocket.Conn
	sock      *corkConn // ws's socket, corked while a batch is written
	tenant    community.Tenant
	log       *slog.Logger
	challenge string
	pubkey    string      // authenticated pubkey (NIP-42), "" before AUTH
	authed    atomic.Bool // pubkey != "", readable off the read goroutine
	addr      string      // client address the connection caps count it under

	// out holds fan-out deliveries and replies to this client's own
	// requests (history, EOSE, OK ...) in order. Live deliveries are
	// bounded by count (overflow means a slow client), replies by bytes
	// (a large history waits for room), so a history being read never
	// crowds out live events.
	out    sendQueue
	pinger *time.Timer // runs ping every PingInterval
	// started counts the messages whose handling began, and handling is
	// set while one is handled: meanwhile the read loop, the only reader
	// of pongs, waits for the handler, so a missed pong proves nothing.
	started  atomic.Uint64
	handling atomic.Bool
	// writeWatchdog closes the socket under a write that outlives
	// WriteTimeout: one timer per connection instead of a context per
	// message (an allocation plus a registration with the connection's
	// context, a measurable share of fan-out to 1,000 subscribers).
	writeWatchdog *time.Timer
	ctx           context.Context
	cancel        context.CancelFunc
	slowOnce      sync.Once
	// closesOnCancel: ctx's cancellation closes ws (see readMessage), so
	// reads need no context of their own. Read goroutine only.
	closesOnCancel bool
	// closedForCommunity is set once the connection is being closed because
	// its community was deleted or archived.
	closedForCommunity atomic.Bool
	// subs maps each open subscription id to the filter values it holds,
	// which count against MaxFilterValues (read goroutine only).
	subs map[string]int
	// messages is the connection's bucket of messages read
	// (MessagesPerSecond; read goroutine only, see pace), authChecks its
	// bucket of AUTH signature checks (message handlers, one at a time),
	// pings its bucket of pings answered (pacePing, called by the library
	// with the read lock held, so one at a time).
	messages, authChecks, pings tokenBucket
	// closing is closed (stopPings) before the relay closes the socket:
	// Close waits for the library's read lock, which a ping hook parked in
	// pacePing holds until it returns.
	closing     chan struct{}
	closingOnce sync.Once
	// replyRoom bounds the bytes queued in replies (ReplyQueueBytes): a
	// client that reads its history slowly holds at most that much here,
	// whatever the size of its events.
	replyRoom *semaphore.Weighted
}

func newChallenge() string {
	var b [32]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// Enqueue implements fanout.Receiver: it never blocks. A client whose queue
// is full is closed rather than silently missing live events; it reconnects
// and resumes with since.
func (c *conn) Enqueue(msg []byte) bool {
	return c.enqueueLive(queued{msg: msg})
}

// EnqueueEvent implements fanout.EventReceiver: the event is queued as the
// JSON every subscriber shares, and wrapped for subID when written.
func (c *conn) EnqueueEvent(subID string, rawEvent []byte) bool {
	return c.enqueueLive(queued{msg: rawEvent, subID: subID})
}

func (c *conn) enqueueLive(m queued) bool {
	m.queuedAt = monoNow()
	ok, startWriter := c.out.pushLive(m, c.srv.cfg.SendQueue, c.srv.cfg.SendQueueBytes)
	if startWriter && !c.writeLiveNow(m) {
		c.srv.jobs().run(c.writeQueued)
	}
	if !ok {
		c.closeSlow()
	}
	return ok
}

// closeSlow closes a client that let more live events wait than it may.
func (c *conn) closeSlow() {
	c.slowOnce.Do(func() {
		c.srv.metrics.SlowClosed.Inc()
		c.log.Warn("closing slow client: send queue full", "queue", c.srv.cfg.SendQueue, "queue_bytes", c.srv.cfg.SendQueueBytes)
		go c.closeWS(websocket.StatusPolicyViolation, "slow consumer: send queue overflow")
	})
}

// writeLiveNow writes m, the only message queued, on the caller's goroutine
// when the socket takes it without waiting; false leaves it queued for a
// writer goroutine. The caller holds the writer role (pushLive said to
// start the writer), so nothing else writes a data frame meanwhile.
func (c *conn) writeLiveNow(m queued) bool {
	frame := envelopes.Get().(*[]byte)
	defer putEnvelope(frame)
	var start int
	*frame, start = textFrame(*frame, m)
	taken, finished := c.sock.writeNoWait((*frame)[start:])
	if !taken {
		return false
	}
	c.observeLiveWrite(m, monoNow())
	if c.out.wroteFirst(finished) {
		c.srv.jobs().run(c.writeQueued)
	}
	return true
}

// send queues a reply to this client's own request, waiting for room.
func (c *conn) send(msg []byte) error {
	return c.sendAll([]queued{{msg: msg}})
}

// sendAll queues replies in order, waiting for room, and starts the writer
// once, after the last of them: a REQ's stored events and its EOSE then
// leave in one corked write, instead of racing a writer that would send
// them a few at a time. When the reply budget runs out first, the writer
// starts at once, since only it gives room back.
func (c *conn) sendAll(replies []queued) error {
	startWriter := false
	defer func() {
		if startWriter {
			c.srv.jobs().run(c.writeQueued)
		}
	}()
	for _, m := range replies {
		weight := c.replyWeight(m.msg)
		if !c.replyRoom.TryAcquire(weight) {
			if startWriter {
				startWriter = false
				c.srv.jobs().run(c.writeQueued)
			}
			if err := c.replyRoom.Acquire(c.ctx, weight); err != nil {
				return err
			}
		}
		c.srv.metrics.ReplyQueueBytes.Add(float64(weight))
		ok, claimed := c.out.pushReply(m)
		if !ok {
			c.replySent(m.msg)
			return context.Canceled
		}
		startWriter = startWriter || claimed
	}
	return nil
}

// replyBatch gathers a REQ's replies until they fill a corked write.
type replyBatch struct {
	replies []queued
	bytes   int
}

// add appends a reply (for a stored event, its JSON and the subscription
// the writer wraps it for) and reports whether the batch is full.
func (r *replyBatch) add(m queued) (full bool) {
	r.replies = append(r.replies, m)
	r.bytes += len(m.msg)
	return r.bytes >= corkFlushBytes
}

// take returns the batch and starts an empty one.
func (r *replyBatch) take() []queued {
	replies := r.replies
	r.replies, r.bytes = nil, 0
	return replies
}

// replyOverhead is what a queued reply costs beyond its bytes: its entry
// in the queue (56 bytes, in a slice that grows by doubling) and the
// rounding of its allocation. Weighed by its bytes alone, a 12-byte EOSE
// left the budget room for 87,000 of them: a client that sent tiny REQs
// and read nothing held 6.6 MiB of heap per connection under the 1 MiB
// budget (about 84 bytes per EOSE, measured).
const replyOverhead = 128

// replyWeight is the room msg takes in the reply queue: its size and
// replyOverhead, or the whole queue for a message larger than that.
func (c *conn) replyWeight(msg []byte) int64 {
	return min(int64(len(msg))+replyOverhead, int64(c.srv.cfg.ReplyQueueBytes))
}

// replySent gives back the room a reply took once it left the queue.
func (c *conn) replySent(msg []byte) {
	weight := c.replyWeight(msg)
	c.srv.metrics.ReplyQueueBytes.Sub(float64(weight))
	c.replyRoom.Release(weight)
}

func (c *conn) run() {
	defer c.cleanup()
	// Created stopped, then armed: ping reads c.pinger, which must be set
	// before the timer can first fire.
	c.pinger = time.AfterFunc(time.Hour, c.ping)
	c.pinger.Stop()
	c.pinger.Reset(c.srv.cfg.PingInterval)
	defer c.pinger.Stop()
	// Every socket costs memory and a slot under the connection caps; one
	// that has not authenticated in time is closed rather than held idle.
	authDeadline := time.AfterFunc(c.srv.cfg.AuthTimeout, func() {
		if !c.authed.Load() {
			c.srv.metrics.AuthTimeouts.Inc()
			c.closeWS(websocket.StatusPolicyViolation, fmt.Sprintf("auth-required: no AUTH within %s", c.srv.cfg.AuthTimeout))
		}
	})
	defer authDeadline.Stop()
	_ = c.send(nostr.EncodeAuthChallenge(c.challenge))
	for {
		c.pace()
		typ, data, size, oversized, err := c.readMessage()
		if err != nil {
			if status := websocket.CloseStatus(err); status == -1 && !errors.Is(err, context.Canceled) {
				c.log.Debug("read ended", "err", err)
			}
			return
		}
		if typ != websocket.MessageText {
			_ = c.send(nostr.EncodeNotice("invalid: binary frames are not supported; send JSON text"))
			continue
		}
		if data == nil {
			c.endSub(oversized.SubID())
			if oversized.EventID() != "" {
				// An event refused by its size, as one refused by its
				// content's length or its tags' count is.
				c.rejected("invalid")
			}
			_ = c.send(oversized.Refusal(fmt.Sprintf("invalid: message of %d bytes exceeds the %d-byte limit", size, c.srv.cfg.MaxMessageBytes)))
			continue
		}
		c.handleAside(data)
		// Nothing handled keeps data: the parser copies what it keeps.
		readBuffers.put(data)
	}
}

// messageBurstSeconds is how many seconds of MessagesPerSecond a
// connection may send at once: a client looking up 300 profiles at start,
// a REQ and a CLOSE each, is read at once rather than over four seconds.
// The sustained rate is what bounds a flood; see docs/limits.md.
const messageBurstSeconds = 10

// messageBurst is how many messages a connection may send at once, at the
// start and after an idle spell alike.
func (s *Server) messageBurst() float64 {
	return messageBurstSeconds * float64(s.cfg.MessagesPerSecond)
}

// pace waits, before the next message is read, until the connection may
// have one more: MessagesPerSecond sustained, messageBurstSeconds' worth at
// once. Every message costs the relay a parse, a reply and a wake-up of two goroutines
// whatever it says, while a client writes thousands in one system call:
// unpaced, four connections sending CLOSE frames kept two thirds of a core
// busy. Waiting is free: the client's messages stay in the socket, and TCP
// stops it sending more. Nothing is refused, so a client with a burst above
// the bucket is only slowed.
func (c *conn) pace() {
	rate := float64(c.srv.cfg.MessagesPerSecond)
	for counted := false; ; {
		wait, ok := c.messages.take(c.srv.now(), rate, c.srv.messageBurst())
		if ok {
			return
		}
		if !counted {
			counted = true
			c.srv.metrics.MessagesPaced.Inc()
		}
		timer := time.NewTimer(wait)
		select {
		case <-c.ctx.Done():
			timer.Stop()
			return
		case <-timer.C:
		}
	}
}

// pacePing waits, before a client's ping is answered, until the connection
// may have one more: pingsAtOnce, then one every pingEvery. The library
// answers pings inside its reader, outside pace: unpaced, four connections
// pinging flat out kept 40% of a core busy writing pongs. Waiting holds the
// read, so the client's next frames stay in the socket and TCP slows it, as
// pace does for messages; closing the connection instead would only make
// it dial again, which costs more than a pong. It says whether to answer:
// not once the connection ends or is being closed, nor once the library's
// ctx ends.
func (c *conn) pacePing(ctx context.Context) bool {
	for counted := false; ; {
		wait, ok := c.pings.take(c.srv.now(), 1/pingEvery.Seconds(), pingsAtOnce)
		if ok {
			return true
		}
		if !counted {
			counted = true
			c.srv.metrics.PingsPaced.Inc()
		}
		timer := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			timer.Stop()
			return false
		case <-c.ctx.Done():
			timer.Stop()
			return false
		case <-c.closing:
			timer.Stop()
			return false
		case <-timer.C:
		}
	}
}

// stopPings releases a ping hook parked in pacePing, and any to come.
func (c *conn) stopPings() { c.closingOnce.Do(func() { close(c.closing) }) }

// closeWS closes the socket with code and reason, first releasing a ping
// hook parked in pacePing: Close waits for the read lock it holds.
func (c *conn) closeWS(code websocket.StatusCode, reason string) {
	c.stopPings()
	c.ws.Close(code, reason)
}

// Pings a connection has answered: pingsAtOnce, then one every pingEvery.
// A client that keeps its connection alive pings every few seconds at
// most; a burst leaves room for one that measures its latency.
const (
	pingsAtOnce = 10
	pingEvery   = time.Second
)

// readMessage reads the next message. Only a text message within
// MaxMessageBytes is kept (data); a binary one, or one over the limit, is
// read and dropped as it arrives, counted in size, and data is nil. A text
// message over the limit is refused up to the library's read limit (4x),
// with the answer its request waits for (oversized reads the ids on the way
// past), and closes the connection beyond it; held whole until then, a
// client trickling such a frame (or 50 connections from one address)
// pinned 1 MiB each, four times what any message the relay accepts needs.
//
// The read is not given c.ctx: the library registers a context it is given
// (context.AfterFunc) for every frame it reads, three allocations and a
// registration per message, only to close the connection when the context
// is cancelled. The connection does that once instead: c.ctx's
// cancellation closes ws, which ends a read in progress as the library's
// registration would.
func (c *conn) readMessage() (typ websocket.MessageType, data []byte, size int64, oversized *nostr.OversizedMessage, err error) {
	if !c.closesOnCancel {
		c.closesOnCancel = true
		context.AfterFunc(c.ctx, func() { c.ws.CloseNow() })
	}
	if err := c.ctx.Err(); err != nil {
		return 0, nil, 0, nil, err
	}
	typ, r, err := c.ws.Reader(context.Background())
	if err != nil {
		return 0, nil, 0, nil, err
	}
	if typ != websocket.MessageText {
		rest, err := io.Copy(io.Discard, r)
		return typ, nil, rest, nil, err
	}
	data, err = readBuffers.read(r, c.srv.cfg.MaxMessageBytes+1)
	size = int64(len(data))
	if err != nil || size <= int64(c.srv.cfg.MaxMessageBytes) {
		return typ, data, size, nil, err
	}
	oversized = new(nostr.OversizedMessage)
	_, _ = oversized.Write(data)
	// The rest is read through the buffer that held the first part, then
	// it goes back: io.Copy would allocate 32 KiB more for every oversized
	// message.
	rest, err := io.CopyBuffer(oversized, r, data[:cap(data)])
	readBuffers.put(data)
	return typ, nil, size + rest, oversized, err
}

// handleAside handles one message on another goroutine (messageHandlers)
// and waits for it, so messages are still handled one at a time, in order.
// The reading goroutine lives as long as the connection and its stack is
// held all that time at the deepest size it ever grew to (the runtime
// shrinks stacks only slowly); handling a message (decoding, verifying, a
// database round trip) needs a deep stack, reading the next one a shallow
// stack. The handling goroutines are shared by all connections.
func (c *conn) handleAside(data []byte) {
	c.started.Add(1)
	c.handling.Store(true)
	defer c.handling.Store(false)
	done := make(chan struct{})
	c.srv.jobs().run(func() {
		defer close(done)
		defer c.containPanic()
		c.handle(data)
	})
	<-done
}

// containPanic ends the connection on a panic in its own code rather than
// the whole process, as net/http does for a handler: the connection runs on
// goroutines of its own, outside net/http's.
func (c *conn) containPanic() {
	if p := recover(); p != nil {
		c.log.Error("connection panicked; closing it", "panic", p, "stack", string(debug.Stack()))
		c.ws.CloseNow()
	}
}

func (c *conn) cleanup() {
	c.srv.hub.UnsubscribeAll(c.tenant.ID(), c)
	c.cancel()
	c.ws.CloseNow()
	// Nothing queued keeps holding reply budget, and nothing more is queued.
	for _, q := range c.out.close() {
		c.sent(q)
	}
	c.srv.forget(c)
}

// initWriteWatchdog creates the write watchdog, stopped, before the
// connection is tracked, since a shutdown may start a writer at once.
func (c *conn) initWriteWatchdog() {
	c.writeWatchdog = time.AfterFunc(time.Hour, func() {
		c.log.Debug("write timed out; closing", "timeout", c.srv.cfg.WriteTimeout)
		c.ws.CloseNow()
	})
	c.writeWatchdog.Stop()
}

// writeQueued writes everything queued, in order, then returns; the next
// message queued starts it again. On a failed write it gives back what the
// rest of its batch held and ends the connection.
func (c *conn) writeQueued() {
	defer c.containPanic()
	if !c.writeUnsent() {
		return
	}
	var batch []queued
	for {
		var done, draining bool
		batch, done, draining = c.out.take(batch)
		if done {
			if draining {
				c.closeWS(websocket.StatusGoingAway, "relay shutting down")
				c.cancel() // release a reader waiting for reply room
			}
			return
		}
		ok := c.writeBatch(batch)
		for _, q := range batch {
			c.sent(q)
		}
		if !ok {
			return
		}
	}
}

// writeUnsent writes the tail of a frame the socket took only part of
// (writeLiveNow) before anything queued after it, even when nothing is.
func (c *conn) writeUnsent() bool {
	if !c.sock.hasUnsent() {
		return true
	}
	c.writeWatchdog.Reset(c.srv.cfg.WriteTimeout)
	defer c.writeWatchdog.Stop()
	if err := c.sock.flushUnsent(); err != nil {
		c.log.Debug("write failed; closing", "err", err)
		c.ws.CloseNow()
		c.cancel()
		return false
	}
	return true
}

// envelopes lend the buffer a live event is wrapped in: by the writer, or
// framed whole by writeLiveNow.
var envelopes = sync.Pool{New: func() any { b := make([]byte, 0, 1<<10); return &b }}

// putEnvelope returns a buffer to the pool, unless one large event grew it:
// that room is left to the collector rather than held.
func putEnvelope(b *[]byte) {
	if cap(*b) <= corkFlushBytes {
		envelopes.Put(b)
	}
}

// writeBatch writes a batch as one socket write (several for a batch
// larger than corkFlushBytes): each message is framed into the corked
// socket, which sends them together at the end. Its messages count as
// sent only then, so the slow-client bound still counts every message
// that has not reached the socket. The write watchdog bounds the whole
// batch; a write takes no context, which would cost a registration with
// it per message.
func (c *conn) writeBatch(batch []queued) bool {
	c.writeWatchdog.Reset(c.srv.cfg.WriteTimeout)
	defer c.writeWatchdog.Stop()
	envelope := envelopes.Get().(*[]byte)
	defer putEnvelope(envelope)
	c.sock.cork()
	var err error
	for _, q := range batch {
		msg := q.msg
		if q.subID != "" {
			*envelope = nostr.AppendEventRaw((*envelope)[:0], q.subID, q.msg)
			msg = *envelope
		}
		if err = c.ws.Write(context.Background(), websocket.MessageText, msg); err != nil {
			break
		}
	}
	if uncorkErr := c.sock.uncork(); err == nil && uncorkErr != nil {
		// The library did not see this write fail: close the socket so the
		// reader ends too.
		err = uncorkErr
		c.ws.CloseNow()
	}
	if err != nil {
		c.log.Debug("write failed; closing", "err", err)
		c.cancel()
		return false
	}
	c.observeWriteDelay(batch)
	return true
}

// observeWriteDelay records, for each live delivery of a batch that just
// reached the socket, how long it waited since it was queued: the relay's
// own share of fan-out latency (the queue, the scheduler, the write),
// apart from the commit before it and the network after it.
func (c *conn) observeWriteDelay(batch []queued) {
	now := monoNow()
	for _, q := range batch {
		if !q.reply {
			c.observeLiveWrite(q, now)
		}
	}
}

// observeLiveWrite records how long live delivery q waited, queued, until
// now, when it reached the socket.
func (c *conn) observeLiveWrite(q queued, now int64) {
	c.srv.metrics.FanoutWriteDelay.Observe(float64(now-q.queuedAt) / float64(time.Second))
}

// sent accounts for one message having left the queue, written or not.
func (c *conn) sent(q queued) {
	if q.reply {
		c.replySent(q.msg)
	} else {
		c.out.written(len(q.msg))
	}
}

// ping checks the client is still there, from a timer rather than a
// goroutine of its own: a parked goroutine per connection costs its stack
// for the connection's whole life. A missed pong closes the connection,
// unless the client sent a message meanwhile or one was being handled at
// either end of the wait: a pong is read only by the read loop, which
// waits while a REQ streams a long history to a slow reader, and a handler
// that ends just before the wait does leaves the read loop no time to read
// the pong that waited behind it. A client gone during such a handler
// stops taking writes, and the write timeout closes it instead.
func (c *conn) ping() {
	if c.ctx.Err() != nil {
		return
	}
	started, wasHandling := c.started.Load(), c.handling.Load()
	ctx, cancel := context.WithTimeout(c.ctx, c.srv.cfg.PingInterval)
	err := c.ws.Ping(ctx)
	cancel()
	if err != nil && c.ctx.Err() == nil && (wasHandling || c.handling.Load() || c.started.Load() != started) {
		err = nil
	}
	if err != nil {
		c.log.Debug("ping failed; closing", "err", err)
		c.ws.CloseNow()
		return
	}
	c.pinger.Reset(c.srv.cfg.PingInterval)
}

// shutdown flushes what is queued and closes with 1001 (going away).
func (c *conn) shutdown() {
	if c.out.drain() {
		c.srv.jobs().run(c.writeQueued)
	}
}

func (c *conn) handle(data []byte) {
	msg, err := nostr.ParseClientMessage(data, c.srv.limits)
	if err != nil {
		c.replyParseError(err)
		return
	}
	switch m := msg.(type) {
	case *nostr.AuthMessage:
		c.onAuth(m.Event)
	case *nostr.EventMessage:
		c.onEvent(m.Event)
	case *nostr.ReqMessage:
		c.onReq(m.SubID, m.Filters)
	case *nostr.CountMessage:
		c.onCount(m.SubID, m.Filters)
	case *nostr.CloseMessage:
		if c.pubkey == "" {
			_ = c.send(nostr.EncodeNotice("auth-required: authenticate with AUTH first"))
			return
		}
		c.endSub(m.SubID)
	}
}

// replyParseError answers in the most specific form the protocol allows: OK
// for an event whose id could be read, CLOSED for a REQ/COUNT with a valid
// subscription id, NOTICE otherwise.
func (c *conn) replyParseError(err error) {
	var pe *nostr.ParseError
	if !errors.As(err, &pe) {
		_ = c.send(nostr.EncodeNotice("invalid: " + err.Error()))
		return
	}
	reason := "invalid: " + pe.Msg
	switch {
	case (pe.Verb == "EVENT" || pe.Verb == "AUTH") && pe.EventID != "":
		c.rejected("invalid")
		_ = c.send(nostr.EncodeOK(pe.EventID, false, reason))
	case (pe.Verb == "REQ" || pe.Verb == "COUNT") && pe.SubID != "":
		c.endSub(pe.SubID)
		_ = c.send(nostr.EncodeClosed(pe.SubID, reason))
	default:
		_ = c.send(nostr.EncodeNotice(reason))
	}
}

// endSub ends the open subscription subID, if there is one (an id with
// none takes no lock of the hub). A REQ replaces the subscription of its
// id whatever becomes of it: a refused one's CLOSED tells the client that
// id is closed, and left open it went on delivering. A refused COUNT's
// CLOSED says the same to a client that reused an open REQ's id (go-nostr
// and nostr-tools end the subscription of the id a CLOSED names), so it
// ends that REQ too, rather than keep delivering under a closed id.
func (c *conn) endSub(subID string) {
	if _, open := c.subs[subID]; open {
		c.srv.hub.Unsubscribe(c.tenant.ID(), c, subID)
		delete(c.subs, subID)
	}
}

func (c *conn) rejected(prefix string) {
	c.srv.metrics.EventsRejected.WithLabelValues(prefix).Inc()
}

func (c *conn) onAuth(ev *nostr.Event) {
	if err := c.srv.verifyAuth(ev, c.challenge, c.tenant, &c.authChecks); err != nil {
		_ = c.send(nostr.EncodeOK(ev.ID, false, err.Error()))
		return
	}
	// An auth tag that does not verify fails the AUTH, rather than
	// authenticating without an owner: the agent learns at once that its
	// attestation is wrong, and may AUTH again, with or without one.
	attestation, err := nipoa.Find(ev.Tags)
	if err == nil && attestation != nil {
		err = attestation.VerifyFor(ev.PubKey, ev.CreatedAt)
	}
	if err != nil {
		c.srv.metrics.OwnerAttestations.WithLabelValues(ownerInvalid).Inc()
		_ = c.send(nostr.EncodeOK(ev.ID, false, "invalid: "+err.Error()))
		return
	}
	owner := ""
	if attestation != nil {
		if owner, err = c.srv.recordOwner(c.ctx, c.tenant, ev.PubKey, attestation, true); err != nil {
			if communityBeingDeleted(err) {
				_ = c.send(nostr.EncodeOK(ev.ID, false, beingDeletedReason))
				return
			}
			if errors.Is(err, errReadSlotsBusy) {
				_ = c.send(nostr.EncodeOK(ev.ID, false, "error: the relay is busy; send the AUTH again shortly"))
				return
			}
			if c.ctx.Err() == nil {
				c.log.Error("record owner attestation", "agent", ev.PubKey, "err", err)
			}
			_ = c.send(nostr.EncodeOK(ev.ID, false, "error: could not record the owner attestation; try again"))
			return
		}
	}
	if c.pubkey != "" && c.pubkey != ev.PubKey {
		c.closeSubsOnNewReader()
	}
	c.pubkey = ev.PubKey
	c.authed.Store(true)
	// From the connection's own logger, not the last one: a client may
	// AUTH again and again, and each With would keep every earlier pubkey.
	c.log = c.srv.connLog(c.tenant, c.addr).With("pubkey", ev.PubKey)
	note := ""
	if attestation != nil && owner == "" {
		// Authenticated all the same: the key is proven; only the owner
		// claim is refused, and the agent is told why.
		note = ownerConflictNote
	}
	_ = c.send(nostr.EncodeOK(ev.ID, true, note))
}

// closeSubsOnNewReader ends every live subscription when the connection
// authenticates as another pubkey: each was authorized for, and is filtered
// by, the previous one, so it would keep delivering what only that pubkey
// may read (its private channels, its gift wraps) to a connection now
// reading as someone else. The client is told, and may subscribe again.
func (c *conn) closeSubsOnNewReader() {
	for id := range c.subs {
		c.srv.hub.Unsubscribe(c.tenant.ID(), c, id)
		delete(c.subs, id)
		_ = c.send(nostr.EncodeClosed(id, "restricted: authenticated as another pubkey; subscribe again"))
	}
}

func (c *conn) onEvent(ev *nostr.Event) {
	if c.pubkey == "" {
		c.rejected("auth-required")
		_ = c.send(nostr.EncodeOK(ev.ID, false, "auth-required: authenticate with AUTH before publishing"))
		return
	}
	if ok, retry := c.srv.PublishLimiter.Allow(c.tenant.ID(), c.pubkey, c.srv.now()); !ok {
		c.rejected("rate-limited")
		c.srv.metrics.RateLimited.Inc()
		_ = c.send(nostr.EncodeOK(ev.ID, false, rateLimitedReason(retry)))
		return
	}
	outcome, reply, err := c.srv.pipeline.SubmitReply(c.ctx, c.tenant, c.pubkey, ev)
	if err != nil {
		var rej *ingest.Rejection
		if errors.As(err, &rej) {
			c.rejected(rej.Prefix)
			_ = c.send(nostr.EncodeOK(ev.ID, false, rej.Error()))
			return
		}
		if c.ctx.Err() != nil {
			return
		}
		c.rejected("error")
		if !c.srv.outage.Failed(err, "ingest") {
			c.log.Error("ingest failed", "event", ev.ID, "kind", ev.Kind, "err", err)
		}
		_ = c.send(nostr.EncodeOK(ev.ID, false, "error: could not store the event; try again"))
		return
	}
	c.srv.metrics.EventsAccepted.WithLabelValues(outcomeLabel[outcome]).Inc()
	_ = c.send(nostr.EncodeOK(ev.ID, true, reply))
}

var outcomeLabel = map[ingest.Outcome]string{
	ingest.Stored: "stored", ingest.Duplicate: "duplicate", ingest.Superseded: "superseded", ingest.Relayed: "relayed",
}

// oneShot reports whether a REQ gets stored events and EOSE only, never a
// live subscription. A NIP-50 search ranks a finished result set. An
// agent_owner constraint is a database relationship that fan-out cannot
// check from the event alone, and an agent's owner may be recorded after the
// subscription opens; rather than a database lookup per published event on
// the fan-out path, the owner lookup is a lookup: ask again to refresh.
func oneShot(filters nostr.Filters) bool {
	for i := range filters {
		if filters[i].Search != "" || filters[i].AgentOwner != "" {
			return true
		}
	}
	return false
}

// liveAllow is a subscription's own read conditions for fan-out: p-gated
// kinds only when the caller is a party (p-tagged, or their author), and a channel event only to a
// subscription pinned (#h) to that channel. A channel's relay-signed lists
// (39000-39002) name their channel in a d tag, not an h tag, so for them a
// #d naming the channel pins too. Whether the caller may still read the
// channel is decided by the hub, once per published event
// (Subscription.Reader). Global subscriptions never receive channel events.
func (c *conn) liveAllow(filters nostr.Filters) func(*nostr.Event, *uuid.UUID) bool {
	pinned := channelPins(filters, "h")
	pinnedLists := channelPins(filters, "d")
	self := c.pubkey
	return func(ev *nostr.Event, channel *uuid.UUID) bool {
		if nostr.IsPGated(ev.Kind) && ev.PubKey != self && !access.AddressedTo(ev, self) {
			return false
		}
		if channel == nil {
			return true
		}
		if _, ok := pinned[*channel]; ok {
			return true
		}
		_, ok := pinnedLists[*channel]
		return ok && ingest.IsChannelList(ev.Kind)
	}
}

// channelPins is the set of channel ids the filters name in their #tag.
func channelPins(filters nostr.Filters, tag string) map[uuid.UUID]struct{} {
	pins := map[uuid.UUID]struct{}{}
	for i := range filters {
		for _, v := range filters[i].Tags[tag] {
			if id, err := uuid.Parse(v); err == nil {
				pins[id] = struct{}{}
			}
		}
	}
	return pins
}

func (c *conn) onReq(subID string, filters nostr.Filters) {
	if c.pubkey == "" {
		_ = c.send(nostr.EncodeClosed(subID, "auth-required: authenticate with AUTH before subscribing"))
		return
	}
	// NIP-50 search and agent_owner are one-shot: results, EOSE, and no
	// live subscription, so neither the subscription cap nor the
	// filter-value budget applies to them.
	live := !oneShot(filters)
	if _, open := c.subs[subID]; live && !open && len(c.subs) >= c.srv.cfg.MaxSubscriptions {
		_ = c.send(nostr.EncodeClosed(subID, fmt.Sprintf("rate-limited: at most %d open subscriptions per connection", c.srv.cfg.MaxSubscriptions)))
		return
	}
	weight := filterValues(filters)
	if held := c.heldFilterValues(subID); live && held+weight > c.srv.cfg.MaxFilterValues {
		c.endSub(subID) // replaced even though refused
		_ = c.send(nostr.EncodeClosed(subID, fmt.Sprintf(
			"rate-limited: this subscription's %d filter values would exceed the connection's budget of %d (%d held by open subscriptions); close some first",
			weight, c.srv.cfg.MaxFilterValues, held)))
		return
	}
	start := time.Now()
	ctx, cancel := context.WithTimeout(c.ctx, c.srv.cfg.QueryTimeout)
	defer cancel()
	// A REQ reusing an open id replaces that subscription, whatever
	// becomes of the new one (NIP-01).
	c.endSub(subID)
	scope, reason, err := c.srv.readScope(ctx, c.tenant, c.pubkey, filters)
	if reason != "" || err != nil {
		c.refuse(ctx, subID, reason, err)
		return
	}
	scope.Live = live
	var sub *fanout.Subscription
	var sent *historyIDs // what the history sent, for the held live events
	if live {
		// Register before reading history: an event committed while the query
		// runs is then delivered live instead of falling between the two. It
		// is held until the EOSE, and dropped if the history sent it.
		sub = &fanout.Subscription{Receiver: c, ID: subID, Filters: filters, Allow: c.liveAllow(filters), Reader: c.pubkey}
		sub.HoldLive(c.srv.cfg.SendQueue, c.srv.cfg.SendQueueBytes, c.closeSlow)
		c.srv.hub.Subscribe(c.tenant.ID(), sub)
		c.subs[subID] = weight
		sent = newHistoryIDs()
		if hook := c.srv.beforeHistory.Load(); hook != nil {
			(*hook)()
		}
	}

	// Trace inputs are built only when a tracer observes them: in
	// production the tenant-independent channel lookup never runs.
	st := trace.StateForRequest(c.tenant.ID(), c.tenant.Host(), c.pubkey)
	traced := trace.Active(c.srv.Tracer, &st)
	var rowChannels []*uuid.UUID
	// Replies are queued a corked write's worth at a time, the last batch
	// with the EOSE, so a small REQ's answer leaves in one write.
	var held replyBatch
	stored := presence.NewStoredCount(filters)
	// Each page's statement gets QueryTimeout (store.StatementTimeout); the
	// time this client takes to receive a page is its own, bounded by the
	// write watchdog, not charged to the next page.
	err = c.srv.store.QueryJSON(c.ctx, c.tenant.ID(), scope, filters, func(event []byte, channel *uuid.UUID) error {
		if traced {
			rowChannels = append(rowChannels, channel)
		}
		stored.Add(event)
		if sent != nil {
			sent.add(event)
		}
		if held.add(queued{msg: event, subID: subID}) {
			return c.sendAll(held.take())
		}
		return nil
	})
	if err == nil {
		// Presence goes out as stored rows do, a batch at a time through
		// the reply budget: gathered whole, ten filters of 500
		// announcements of 4 KiB waited in memory for a client that had
		// stopped reading.
		var plan *presence.Plan
		plan, err = c.srv.presencePlan(c.ctx, c.tenant, c.pubkey, filters, stored)
		if err == nil {
			for batch := plan.Next(c.ctx, presenceBatch); batch != nil && err == nil; batch = plan.Next(c.ctx, presenceBatch) {
				for _, event := range batch {
					if sent != nil {
						sent.add(event)
					}
					if held.add(queued{msg: event, subID: subID}) {
						if err = c.sendAll(held.take()); err != nil {
							break
						}
					}
				}
			}
		}
	}
	if err == nil && traced {
		traceCtx, cancelTrace := context.WithTimeout(c.ctx, c.srv.cfg.QueryTimeout)
		err = c.traceRead(traceCtx, st, filters, rowChannels)
		cancelTrace()
	}
	if err != nil {
		_ = c.sendAll(held.take()) // the rows read before the failure, then CLOSED
		c.srv.hub.Unsubscribe(c.tenant.ID(), c, subID)
		delete(c.subs, subID)
		c.refuse(ctx, subID, "", err)
		return
	}
	held.add(queued{msg: nostr.EncodeEOSE(subID)})
	_ = c.sendAll(held.take())
	if sub != nil {
		// The subscription keeps the ids a while (it drops late live copies
		// of the history's events), then they are recycled. A REQ that
		// fails before this leaves its buffer to the garbage collector.
		sub.ReleaseLive(sent.contains, sent.recycle)
	}
	c.srv.metrics.ReqDuration.WithLabelValues("REQ").Observe(time.Since(start).Seconds())
}

// sentIDBuffers recycles the buffers a REQ's history ids are kept in.
var sentIDBuffers = sync.Pool{New: func() any { b := make([]byte, 0, 64*64); return &b }}

// historyIDs are the ids a REQ's history sent, 64-byte hex ids end to
// end. Deliveries ask it while a subscription holds its live events and
// for a second after (fanout.ReleaseLive), from several goroutines at once.
type historyIDs struct {
	ids  *[]byte
	once sync.Once
	set  map[string]struct{}
}

func newHistoryIDs() *historyIDs { return &historyIDs{ids: sentIDBuffers.Get().(*[]byte)} }

// add notes the id of an event the history sends (read goroutine only,
// before ReleaseLive).
func (h *historyIDs) add(rawEvent []byte) { *h.ids = append(*h.ids, nostr.RawEventID(rawEvent)...) }

// recycle gives the buffer back once contains is asked no more.
func (h *historyIDs) recycle() {
	*h.ids = (*h.ids)[:0]
	sentIDBuffers.Put(h.ids)
}

// linearIDs is the most ids contains scans. A REQ's history may send
// 10,000 (ten filters of 500 stored events and as many announcements):
// 640 KB scanned for every delivery to it in that second; past linearIDs
// a set is built instead, once.
const linearIDs = 64

// contains reports whether the history sent rawEvent.
func (h *historyIDs) contains(rawEvent []byte) bool {
	id := nostr.RawEventID(rawEvent)
	if id == nil {
		return false
	}
	ids := *h.ids
	if len(ids) <= linearIDs*64 {
		for ; len(ids) >= 64; ids = ids[64:] {
			if string(ids[:64]) == string(id) {
				return true
			}
		}
		return false
	}
	h.once.Do(func() {
		h.set = make(map[string]struct{}, len(ids)/64)
		for ; len(ids) >= 64; ids = ids[64:] {
			h.set[string(ids[:64])] = struct{}{}
		}
	})
	_, ok := h.set[string(id)]
	return ok
}

func (c *conn) onCount(subID string, filters nostr.Filters) {
	if c.pubkey == "" {
		// No subscription is open before AUTH: nothing to end.
		_ = c.send(nostr.EncodeClosed(subID, "auth-required: authenticate with AUTH before counting"))
		return
	}
	start := time.Now()
	ctx, cancel := context.WithTimeout(c.ctx, c.srv.cfg.QueryTimeout)
	defer cancel()
	scope, reason, err := c.srv.readScope(ctx, c.tenant, c.pubkey, filters)
	if reason != "" || err != nil {
		c.refuse(ctx, subID, reason, err)
		return
	}
	n, approximate, err := c.srv.store.Count(ctx, c.tenant.ID(), scope, filters)
	if err != nil {
		c.refuse(ctx, subID, "", err)
		return
	}
	if !approximate {
		// A capped count stays MaxCount, as the answer promises.
		n += c.srv.presenceCount(ctx, c.tenant.ID(), filters)
	}
	_ = c.send(nostr.EncodeCount(subID, n, approximate))
	c.srv.metrics.ReqDuration.WithLabelValues("COUNT").Observe(time.Since(start).Seconds())
}

// refuse answers a REQ/COUNT with CLOSED: the given reason, or one derived
// from an internal error (logged; a timeout says so). The subscription of
// that id, if one is open, ends: the CLOSED tells the client so.
func (c *conn) refuse(ctx context.Context, subID, reason string, err error) {
	c.endSub(subID)
	if err != nil {
		if c.ctx.Err() != nil {
			return // the connection is going away
		}
		switch {
		case errors.Is(err, eventstore.ErrReadSlotsBusy):
			// Load, not a fault: a storm of these must not read as errors.
			reason = "error: the relay is busy reading; send the request again shortly"
			c.log.Warn("read found every read slot busy", "sub", subID)
		case errors.Is(ctx.Err(), context.DeadlineExceeded) || errors.Is(err, context.DeadlineExceeded):
			reason = "error: query timed out; narrow the filter"
			c.log.Error("read failed", "sub", subID, "err", err)
		default:
			reason = "error: query failed"
			if !c.srv.outage.Failed(err, "read") {
				c.log.Error("read failed", "sub", subID, "err", err)
			}
		}
	}
	_ = c.send(nostr.EncodeClosed(subID, reason))
}
