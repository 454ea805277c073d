package main

import (
	"context"
	"sync"
	"sync/atomic"
	"time"
)

// liveSubID is the subscription id every live subscriber uses on its own
// connection.
const liveSubID = "live"

// liveSubscriber reads live events on one connection and records the
// delivery latency of this run's events.
type liveSubscriber struct {
	conn       *relayConn
	expect     int // deliveries expected, to size the log
	deliveries deliveryLog
	received   atomic.Int64 // len(deliveries.latencies), readable while the reader runs
}

// deliveryLog records the first delivery of each event to one subscriber.
// A second delivery of the same event is counted as a duplicate and gives
// no latency sample, so "all delivered" means every event arrived, not
// that the count of arrivals reached the count expected.
type deliveryLog struct {
	perStream int
	seen      []uint64 // one bit per (stream, seq)
	latencies []time.Duration
	// arrivals are the same deliveries' latencies to when the kernel put
	// them in the subscriber's socket, where the reader knows it (polled
	// subscribers): what the read adds after that is the load generator's.
	arrivals   []time.Duration
	duplicates int
}

func newDeliveryLog(streams, perStream, expect int) deliveryLog {
	return deliveryLog{
		perStream: perStream,
		seen:      make([]uint64, (streams*perStream+63)/64),
		latencies: make([]time.Duration, 0, expect),
	}
}

// unknownArrival is the arrival time of a delivery read without the
// socket's receive timestamp.
const unknownArrival = -1

// add records a delivery of (stream, seq), which the send clock knows,
// read after latency and, unless it is negative, in the socket after
// arrival; it reports whether it was the first.
func (l *deliveryLog) add(stream, seq int, latency, arrival time.Duration) bool {
	bit := stream*l.perStream + seq
	word, mask := bit/64, uint64(1)<<(bit%64)
	if l.seen[word]&mask != 0 {
		l.duplicates++
		return false
	}
	l.seen[word] |= mask
	l.latencies = append(l.latencies, latency)
	if arrival >= 0 {
		l.arrivals = append(l.arrivals, arrival)
	}
	return true
}

// dialSubscriber connects, authenticates with a fresh key and subscribes,
// waiting for EOSE.
func dialSubscriber(ctx context.Context, url string, filter any, expect int) (*liveSubscriber, error) {
	s, err := newSigner()
	if err != nil {
		return nil, err
	}
	conn, err := dialAuthed(ctx, url, s)
	if err != nil {
		return nil, err
	}
	if err := conn.subscribe(ctx, liveSubID, filter); err != nil {
		conn.close()
		return nil, err
	}
	return &liveSubscriber{conn: conn, expect: expect}, nil
}

// read records delivery latencies until its connection is closed (by
// finish, or when ctx ends). It is the connection's only reader. It reads
// without a context: a cancellable one costs the WebSocket library a
// registration with it per message, for a thousand readers at once on the
// load generator's side of the measure; closing the connection ends the
// read instead. Used where the subscribers cannot be polled together
// (TLS, or not Linux).
func (s *liveSubscriber) read(runID string, clock *sendClock, stopping *atomic.Bool, errs *tally) {
	for {
		msg, err := s.conn.next(context.Background())
		if err != nil {
			if !stopping.Load() {
				errs.addErr("subscriber read", err)
			}
			return
		}
		s.handle(msg, monoNow(), unknownArrival, runID, clock, errs)
	}
}

// handle records msg, read at now and in the socket since arrived
// (unknownArrival: not known), if it is a live event of this run.
func (s *liveSubscriber) handle(msg relayMsg, now, arrived int64, runID string, clock *sendClock, errs *tally) {
	if msg.Verb != verbEvent || string(msg.SubID) != liveSubID {
		return
	}
	_, body, err := eventFields(msg.Event)
	if err != nil {
		errs.addErr("subscriber decode", err)
		return
	}
	stream, seq, ok := parseMarker(body, runID)
	if !ok {
		return // another client's or another run's event
	}
	lat, ok := clock.since(stream, seq, now)
	if !ok {
		return
	}
	arrival := time.Duration(unknownArrival)
	if arrived != unknownArrival {
		// Not before the send: the wall clock the stamp is on may have
		// been stepped since.
		arrival = max(lat-time.Duration(now-arrived), 0)
	}
	if s.deliveries.add(stream, seq, lat, arrival) {
		s.received.Add(1)
	}
}

// subscriberGroup reads its subscribers' live events.
type subscriberGroup struct {
	subs []*liveSubscriber
	wg   sync.WaitGroup
	// stopping is set before the readers' connections are closed, so the
	// errors that ends their reads are not tallied.
	stopping atomic.Bool
	// unwatch ends the watch on the scenario's context.
	unwatch func() bool
	pollers []*poller
}

// connectSubscribers opens n subscribers, at most concurrency at a time so
// the relay and the machine are not flooded with handshakes. Failures are
// tallied; the group holds the ones that subscribed.
func connectSubscribers(ctx context.Context, url string, n, concurrency int, filter any, expect int, errs *tally) *subscriberGroup {
	subs := make([]*liveSubscriber, n)
	next := make(chan int)
	var wg sync.WaitGroup
	for range min(concurrency, n) {
		wg.Go(func() {
			for i := range next {
				sub, err := dialSubscriber(ctx, url, filter, expect)
				if err != nil {
					errs.addErr("subscriber connect", err)
					continue
				}
				subs[i] = sub
			}
		})
	}
	for i := 0; i < n && ctx.Err() == nil; i++ {
		next <- i
	}
	close(next)
	wg.Wait()
	g := &subscriberGroup{}
	for _, s := range subs {
		if s != nil {
			g.subs = append(g.subs, s)
		}
	}
	return g
}

// start launches the readers; they run until finish or ctx ends. Over
// plain WebSocket on Linux a few pollers read every subscriber (see
// startPollers); otherwise each subscriber has a reader goroutine.
func (g *subscriberGroup) start(ctx context.Context, runID string, clock *sendClock, errs *tally) {
	for _, s := range g.subs {
		s.deliveries = newDeliveryLog(len(clock.at), clock.perStream(), s.expect)
	}
	g.unwatch = context.AfterFunc(ctx, g.closeAll)
	if g.startPollers(runID, clock, errs) {
		return
	}
	for _, s := range g.subs {
		g.wg.Go(func() { s.read(runID, clock, &g.stopping, errs) })
	}
}

// closeAll ends every reader: goroutine readers by closing their
// connections, pollers by the stopping flag they check.
func (g *subscriberGroup) closeAll() {
	g.stopping.Store(true)
	for _, s := range g.subs {
		s.conn.close()
	}
}

// duplicates is how many deliveries repeated an event the subscriber
// already had; valid once finish returned.
func (g *subscriberGroup) duplicates() int {
	n := 0
	for _, s := range g.subs {
		n += s.deliveries.duplicates
	}
	return n
}

func (g *subscriberGroup) received() int {
	n := 0
	for _, s := range g.subs {
		n += int(s.received.Load())
	}
	return n
}

// finish waits up to grace for expected deliveries, calls each of before
// (while every connection is still open), stops the readers, closes the
// connections and returns every latency sample.
func (g *subscriberGroup) finish(ctx context.Context, expected int, grace time.Duration, before ...func()) []time.Duration {
	for until := time.Now().Add(grace); g.received() < expected && time.Now().Before(until) && ctx.Err() == nil; {
		time.Sleep(10 * time.Millisecond)
	}
	for _, f := range before {
		f()
	}
	if g.unwatch != nil {
		g.unwatch()
	}
	g.closeAll() // ends each reader's pending read
	g.wg.Wait()
	for _, p := range g.pollers {
		p.close()
	}
	all := make([]time.Duration, 0, g.received())
	for _, s := range g.subs {
		all = append(all, s.deliveries.latencies...)
	}
	return all
}

// arrivals returns every delivery's latency to its arrival in the
// subscriber's socket, or nil unless every delivery has one; valid once
// finish returned.
func (g *subscriberGroup) arrivals() []time.Duration {
	var all []time.Duration
	for _, s := range g.subs {
		if len(s.deliveries.arrivals) != len(s.deliveries.latencies) {
			return nil
		}
		all = append(all, s.deliveries.arrivals...)
	}
	return all
}
