package main

import (
	"context"
	"sync"
	"time"
)

// publishReport is the result of the publish scenario.
type publishReport struct {
	Publishers      int               `json:"publishers"`
	ContentBytes    int               `json:"content_bytes"`
	Presigned       int               `json:"presigned"`
	SetupSeconds    float64           `json:"setup_s"` // presigning and connecting
	SignedDuringRun int64             `json:"signed_during_run"`
	SupplyWaits     int64             `json:"supply_waits"`
	Seconds         float64           `json:"elapsed_s"`
	Accepted        int               `json:"accepted"`
	AcceptedPerSec  float64           `json:"accepted_per_s"`
	OKLatency       latencyStats      `json:"ok_latency"`
	Rejected        tallyReport       `json:"rejected"`
	Errors          tallyReport       `json:"errors"`
	Subscribers     *subscriberReport `json:"subscribers,omitempty"`
	Groups          *groupReport      `json:"groups,omitempty"` // with -metrics-url
	Error           string            `json:"error,omitempty"`
}

// subscriberReport describes live subscribers counting delivery latency.
type subscriberReport struct {
	Requested int `json:"requested"`
	Connected int `json:"connected"`
	Expected  int `json:"deliveries_expected"`
	Received  int `json:"deliveries_received"`
	// Duplicates are deliveries of an event the subscriber already had.
	Duplicates int          `json:"duplicates"`
	Latency    latencyStats `json:"delivery_latency"`
}

// deliveryGrace is how long subscribers may lag behind the last OK.
const deliveryGrace = 5 * time.Second

// connectConcurrency bounds simultaneous subscriber handshakes.
const connectConcurrency = 50

// publishPlan sizes the publish scenario.
type publishPlan struct {
	publishers int
	prefill    int // per publisher
	budget     int // per publisher
}

// maxPublisherRate bounds what one closed-loop publisher can send: each
// event waits for the previous OK, which takes at least half a millisecond.
const maxPublisherRate = 2000

// planPublish sizes each publisher's supply: enough for presignRate events/s
// over the whole duration (but no more than one publisher can send), and at
// most four times that if the relay is faster.
func planPublish(o options) publishPlan {
	perPub := int(float64(min(o.presignRate/o.publishers, maxPublisherRate))*o.duration.Seconds()) + 1
	return publishPlan{publishers: o.publishers, prefill: perPub, budget: 4 * perPub}
}

// publisher is one closed-loop publishing connection.
type publisher struct {
	conn      *relayConn
	src       *eventSource
	stream    int
	latencies []time.Duration
	accepted  int
}

// run publishes until the supply ends or, if deadline is set, until it
// passes: a closed loop, each event sent after the previous OK.
func (p *publisher) run(ctx context.Context, deadline time.Time, clock *sendClock, rejected, errs *tally) {
	for (deadline.IsZero() || time.Now().Before(deadline)) && p.publishNext(ctx, clock, rejected, errs) {
	}
}

// publishNext sends the next event and waits for its OK. It reports false
// when the supply is exhausted or the connection failed.
func (p *publisher) publishNext(ctx context.Context, clock *sendClock, rejected, errs *tally) bool {
	ev, ok := p.src.take(ctx)
	if !ok {
		return false
	}
	sent := clock.mark(p.stream, ev.seq)
	accepted, reason, err := p.conn.publish(ctx, ev)
	switch {
	case err != nil:
		if ctx.Err() == nil {
			errs.addErr("publish", err)
		}
		return false // a failed exchange leaves the connection unusable
	case !accepted:
		rejected.add(reason)
	default:
		p.accepted++
		p.latencies = append(p.latencies, time.Duration(monoNow()-sent))
	}
	return true
}

// startPublishers signs every publisher's prefill in parallel, then dials and
// authenticates them. Failures are tallied; the result holds only usable
// publishers.
func startPublishers(ctx context.Context, o options, specs []eventSpec, errs *tally) []*publisher {
	pubs := make([]*publisher, len(specs))
	var wg sync.WaitGroup
	for i := range specs {
		wg.Go(func() {
			src, err := newEventSource(specs[i])
			if err != nil {
				errs.addErr("sign", err)
				return
			}
			conn, err := dialAuthed(ctx, o.url, specs[i].signer)
			if err != nil {
				errs.addErr("connect", err)
				return
			}
			pubs[i] = &publisher{conn: conn, src: src, stream: specs[i].stream, latencies: make([]time.Duration, 0, specs[i].budget)}
		})
	}
	wg.Wait()
	var ok []*publisher
	for _, p := range pubs {
		if p != nil {
			ok = append(ok, p)
		}
	}
	return ok
}

// eventSpecs builds one spec per publisher, each with its own key.
func eventSpecs(o options, n, prefill, budget int) ([]eventSpec, error) {
	specs := make([]eventSpec, n)
	for i := range specs {
		s, err := newSigner()
		if err != nil {
			return nil, err
		}
		specs[i] = eventSpec{signer: s, runID: o.runID, stream: i, contentBytes: o.contentBytes, prefill: prefill, budget: budget}
	}
	return specs, nil
}

func runPublish(ctx context.Context, o options) *publishReport {
	plan := planPublish(o)
	rep := &publishReport{Publishers: plan.publishers, ContentBytes: o.contentBytes, Presigned: plan.prefill * plan.publishers}
	var rejected, errs tally
	defer func() { rep.Rejected, rep.Errors = rejected.report(), errs.report() }()

	// Live subscribers ask for events since now; every event below is
	// created after this instant.
	since := time.Now().Unix()
	specs, err := eventSpecs(o, plan.publishers, plan.prefill, plan.budget)
	if err != nil {
		rep.Error = err.Error()
		return rep
	}
	logf("publish: signing %d events and connecting %d publishers", rep.Presigned, plan.publishers)
	signStart := time.Now()
	pubs := startPublishers(ctx, o, specs, &errs)
	rep.SetupSeconds = roundSeconds(time.Since(signStart))
	defer func() {
		for _, p := range pubs {
			p.conn.close()
		}
	}()
	if len(pubs) == 0 {
		rep.Error = "no publisher could connect"
		return rep
	}

	clock := newSendClock(plan.publishers, plan.budget)
	filter := map[string]any{"kinds": []int{1}, "since": since, "limit": 0}
	subs := connectSubscribers(ctx, o.url, o.subscribers, connectConcurrency, filter, rep.Presigned, &errs)
	subs.start(ctx, o.runID, clock, &errs)

	var groupsBefore groupCounters
	var groupsErr error
	if o.metricsURL != "" {
		groupsBefore, groupsErr = scrapeGroups(ctx, o.metricsURL)
	}
	logf("publish: %d publishers for %s", len(pubs), o.duration)
	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	start := time.Now()
	deadline := start.Add(o.duration)
	var wg sync.WaitGroup
	for _, p := range pubs {
		p.src.start(runCtx)
		wg.Go(func() { p.run(runCtx, deadline, clock, &rejected, &errs) })
	}
	wg.Wait()
	elapsed := time.Since(start)
	cancel() // stops the refill goroutines
	if o.metricsURL != "" {
		var groupsAfter groupCounters
		if groupsErr == nil {
			groupsAfter, groupsErr = scrapeGroups(ctx, o.metricsURL)
		}
		if groupsErr != nil {
			rep.Groups = &groupReport{Error: groupsErr.Error()}
		} else {
			rep.Groups = groupsBetween(groupsBefore, groupsAfter)
		}
	}

	rep.OKLatency = summarize(collectPublishers(pubs, rep))
	rep.Seconds = roundSeconds(elapsed)
	rep.AcceptedPerSec = perSecond(rep.Accepted, elapsed)

	expected := rep.Accepted * len(subs.subs)
	deliveries := subs.finish(ctx, expected, deliveryGrace)
	if o.subscribers > 0 {
		rep.Subscribers = &subscriberReport{
			Requested: o.subscribers, Connected: len(subs.subs), Expected: expected,
			Received: len(deliveries), Duplicates: subs.duplicates(), Latency: summarize(deliveries),
		}
	}
	return rep
}

// collectPublishers adds the publishers' counters to rep and returns all
// their OK latencies.
func collectPublishers(pubs []*publisher, rep *publishReport) []time.Duration {
	var all []time.Duration
	for _, p := range pubs {
		rep.Accepted += p.accepted
		rep.SignedDuringRun += p.src.late.Load()
		rep.SupplyWaits += p.src.waits.Load()
		all = append(all, p.latencies...)
	}
	return all
}
