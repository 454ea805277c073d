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
	conn      *relayConn
	latencies []time.Duration
	received  atomic.Int64 // len(latencies), readable while the reader runs
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
	return &liveSubscriber{conn: conn, latencies: make([]time.Duration, 0, expect)}, nil
}

// read records delivery latencies until ctx ends. It is the connection's
// only reader.
func (s *liveSubscriber) read(ctx context.Context, runID string, clock *sendClock, errs *tally) {
	for {
		msg, err := s.conn.next(ctx)
		if err != nil {
			if ctx.Err() == nil {
				errs.addErr("subscriber read", err)
			}
			return
		}
		if msg.Verb != verbEvent || string(msg.SubID) != liveSubID {
			continue
		}
		now := monoNow()
		_, body, err := eventFields(msg.Event)
		if err != nil {
			errs.addErr("subscriber decode", err)
			continue
		}
		stream, seq, ok := parseMarker(body, runID)
		if !ok {
			continue // another client's or another run's event
		}
		if lat, ok := clock.since(stream, seq, now); ok {
			s.latencies = append(s.latencies, lat)
			s.received.Add(1)
		}
	}
}

// subscriberGroup runs one reader goroutine per subscriber.
type subscriberGroup struct {
	subs []*liveSubscriber
	wg   sync.WaitGroup
	stop context.CancelFunc
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

// start launches the readers; they run until finish or ctx ends.
func (g *subscriberGroup) start(ctx context.Context, runID string, clock *sendClock, errs *tally) {
	ctx, g.stop = context.WithCancel(ctx)
	for _, s := range g.subs {
		g.wg.Go(func() { s.read(ctx, runID, clock, errs) })
	}
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
	if g.stop != nil {
		g.stop() // ends each reader's pending read, which closes its connection
	}
	g.wg.Wait()
	all := make([]time.Duration, 0, g.received())
	for _, s := range g.subs {
		all = append(all, s.latencies...)
		s.conn.close()
	}
	return all
}
