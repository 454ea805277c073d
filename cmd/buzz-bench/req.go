package main

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"
)

// reqLimit is the page size of every timed REQ.
const reqLimit = 100

// maxReqDials bounds reconnects when the REQ connection keeps failing.
const maxReqDials = 4

// seedTopics is how many t values seeded events spread over, so a #t
// filter matches one event in seedTopics.
const seedTopics = 8

// seedPublishers is how many connections publish seed events.
const seedPublishers = 16

// topUpTimeout bounds seeding, which runs before the timed part.
const topUpTimeout = 5 * time.Minute

// reqReport is the result of the req scenario.
type reqReport struct {
	SeedTarget   int          `json:"seed_target"`
	Existing     int64        `json:"existing_before"` // -1 when COUNT failed
	ToppedUp     int          `json:"topped_up"`
	TopUpSeconds float64      `json:"top_up_s"`
	Iterations   int          `json:"iterations"`
	Completed    int          `json:"completed"`
	ShortResults int          `json:"short_results"` // EOSE after fewer than 100 events
	Latency      latencyStats `json:"latency"`       // REQ sent to EOSE received
	Errors       tallyReport  `json:"errors"`
	Error        string       `json:"error,omitempty"`
}

func runReq(ctx context.Context, o options) *reqReport {
	rep := &reqReport{SeedTarget: o.reqSeed, Iterations: o.reqIterations, Existing: -1}
	var errs tally
	defer func() { rep.Errors = errs.report() }()
	if err := ensureSeed(ctx, o, rep, &errs); err != nil {
		rep.Error = err.Error()
		return rep
	}
	logf("req: %d sequential REQs of %d events", o.reqIterations, reqLimit)
	latencies := reqLoop(ctx, o, rep, &errs)
	rep.Completed = len(latencies)
	rep.Latency = summarize(latencies)
	if rep.Completed == 0 && rep.Iterations > 0 {
		rep.Error = "no REQ completed"
	}
	return rep
}

// ensureSeed counts the stored kind-1 events and publishes the shortfall.
func ensureSeed(ctx context.Context, o options, rep *reqReport, errs *tally) error {
	s, err := newSigner()
	if err != nil {
		return err
	}
	conn, err := dialAuthed(ctx, o.url, s)
	if err != nil {
		return err
	}
	n, err := conn.count(ctx, map[string]any{"kinds": []int{1}})
	conn.close()
	if err != nil {
		// Without NIP-45 the seed cannot be checked; REQ still reports short pages.
		errs.addErr("COUNT", err)
		return nil
	}
	rep.Existing = n
	need := o.reqSeed - int(n)
	if need <= 0 {
		return nil
	}
	logf("req: %d kind-1 events stored, publishing %d more", n, need)
	start := time.Now()
	rep.ToppedUp, err = topUp(ctx, o, need, errs)
	rep.TopUpSeconds = roundSeconds(time.Since(start))
	return err
}

// topUp publishes need events with closed-loop publishers, as fast as the
// relay takes them.
func topUp(ctx context.Context, o options, need int, errs *tally) (int, error) {
	ctx, cancel := context.WithTimeout(ctx, topUpTimeout)
	defer cancel()
	n := min(seedPublishers, need)
	perPub := (need + n - 1) / n
	specs, err := eventSpecs(o, n, perPub, perPub)
	if err != nil {
		return 0, err
	}
	for i := range specs {
		specs[i].topics = seedTopics
		share := need / n
		if i < need%n {
			share++
		}
		specs[i].prefill, specs[i].budget = share, share
	}
	pubs := startPublishers(ctx, o, specs, errs)
	if len(pubs) == 0 {
		return 0, errors.New("no seeding publisher could connect")
	}
	clock := newSendClock(n, perPub) // unused: nobody subscribes while seeding
	var rejected tally
	var wg sync.WaitGroup
	for _, p := range pubs {
		wg.Go(func() {
			defer p.conn.close()
			p.run(ctx, time.Time{}, clock, &rejected, errs)
		})
	}
	wg.Wait()
	accepted := 0
	for _, p := range pubs {
		accepted += p.accepted
	}
	if r := rejected.report(); r.Count > 0 {
		errs.add(fmt.Sprintf("seeding: %d events rejected, first: %q", r.Count, r.First))
	}
	return accepted, nil
}

// reqLoop runs the timed REQs one after another on one connection,
// reconnecting a bounded number of times if it breaks.
func reqLoop(ctx context.Context, o options, rep *reqReport, errs *tally) []time.Duration {
	latencies := make([]time.Duration, 0, o.reqIterations)
	filter := map[string]any{"kinds": []int{1}, "limit": reqLimit}
	var conn *relayConn
	defer func() {
		if conn != nil {
			conn.close()
		}
	}()
	dials := 0
	for i := 0; i < o.reqIterations && ctx.Err() == nil; i++ {
		if conn == nil {
			if dials == maxReqDials {
				errs.add(fmt.Sprintf("gave up after %d connection attempts", dials))
				break
			}
			dials++
			s, err := newSigner()
			if err == nil {
				conn, err = dialAuthed(ctx, o.url, s)
			}
			if err != nil {
				errs.addErr("connect", err)
				continue
			}
		}
		d, events, err := timedReq(ctx, conn, fmt.Sprintf("req-%d", i), filter)
		if err != nil {
			errs.addErr("REQ", err)
			if !errors.Is(err, errClosed) {
				conn.close() // a timed-out or failed exchange leaves the connection unusable
				conn = nil
			}
			continue
		}
		latencies = append(latencies, d)
		if events != reqLimit {
			rep.ShortResults++
		}
	}
	return latencies
}

// timedReq measures one REQ from send to EOSE, then closes it.
func timedReq(ctx context.Context, c *relayConn, subID string, filter any) (time.Duration, int, error) {
	ctx, cancel := context.WithTimeout(ctx, opTimeout)
	defer cancel()
	req := clientFrame("REQ", subID, filter) // encoded before the clock starts
	start := monoNow()
	if err := c.send(ctx, req); err != nil {
		return 0, 0, err
	}
	events, err := c.untilEOSE(ctx, subID)
	elapsed := time.Duration(monoNow() - start)
	if err != nil {
		return 0, events, err
	}
	// The REQ stays open as a live subscription until closed; the relay
	// sends nothing back for CLOSE.
	return elapsed, events, c.send(ctx, clientFrame("CLOSE", subID))
}
