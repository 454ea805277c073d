package main

import (
	"context"
	"time"

	"github.com/buzzrelay/buzz/internal/nostr"
)

// fanoutSpacing paces the fan-out publisher: deliveries of one event should
// finish before the next, so the latency measures fan-out, not a backlog.
const fanoutSpacing = 20 * time.Millisecond

// fanoutReport is the result of the fanout scenario.
type fanoutReport struct {
	SubscribersRequested int          `json:"subscribers_requested"`
	SubscribersConnected int          `json:"subscribers_connected"`
	ConnectSeconds       float64      `json:"connect_s"`
	EventsRequested      int          `json:"events_requested"`
	EventsAccepted       int          `json:"events_accepted"`
	Expected             int          `json:"deliveries_expected"`
	Received             int          `json:"deliveries_received"`
	Missing              int          `json:"missing"`
	Duplicates           int          `json:"duplicates"`       // deliveries of an event the subscriber already had
	Latency              latencyStats `json:"delivery_latency"` // publisher send to subscriber receive
	// ArrivalLatency is publisher send to the delivery's arrival in the
	// subscriber's socket (the kernel's receive timestamp), where every
	// subscriber was polled: Latency less the load generator's wait to
	// read it among a thousand sockets.
	ArrivalLatency   *latencyStats `json:"socket_arrival_latency,omitempty"`
	PublishOKLatency latencyStats  `json:"publish_ok_latency"`
	RelayRSS         *rssReport    `json:"relay_rss,omitempty"` // with -relay-pid
	// CPU is measured from the first publish to the last delivery.
	CPU      *cpuReport  `json:"cpu_per_delivery,omitempty"`
	Rejected tallyReport `json:"rejected"`
	Errors   tallyReport `json:"errors"`
	Error    string      `json:"error,omitempty"`
}

func runFanout(ctx context.Context, o options) *fanoutReport {
	rep := &fanoutReport{SubscribersRequested: o.fanoutSubscribers, EventsRequested: o.fanoutEvents}
	var rejected, errs tally
	defer func() { rep.Rejected, rep.Errors = rejected.report(), errs.report() }()

	topic := "fanout-" + o.runID
	pub, err := fanoutPublisher(ctx, o, topic)
	if err != nil {
		rep.Error = "publisher: " + err.Error()
		return rep
	}
	defer pub.conn.close()

	var rss rssReport
	sampler := startRSS(ctx, o.relayPID, &rss)
	if o.relayPID != 0 {
		rep.RelayRSS = &rss
	}
	logf("fanout: connecting %d subscribers", o.fanoutSubscribers)
	start := time.Now()
	filter := map[string]any{"kinds": []int{1}, "#t": []string{topic}, "limit": 0}
	subs := connectSubscribers(ctx, o.url, o.fanoutSubscribers, connectConcurrency, filter, o.fanoutEvents, &errs)
	rep.ConnectSeconds = roundSeconds(time.Since(start))
	rep.SubscribersConnected = len(subs.subs)
	if len(subs.subs) == 0 {
		rep.Error = "no subscriber could connect"
		return rep
	}
	clock := newSendClock(1, o.fanoutEvents)
	subs.start(ctx, o.runID, clock, &errs)

	logf("fanout: publishing %d events to %d subscribers", o.fanoutEvents, len(subs.subs))
	cpu := startCPU(o.relayPID)
	pub.paced(ctx, clock, &rejected, &errs)
	rep.EventsAccepted = pub.accepted
	rep.PublishOKLatency = summarize(pub.latencies)

	rep.Expected = rep.EventsAccepted * len(subs.subs)
	var cpuRep cpuReport
	deliveries := subs.finish(ctx, rep.Expected, deliveryGrace, func() {
		cpuRep = cpu.finish(subs.received())
		sampler.finish(&rss, len(subs.subs))
	})
	rep.CPU = &cpuRep
	rep.Received = len(deliveries)
	rep.Duplicates = subs.duplicates()
	rep.Missing = max(rep.Expected-rep.Received, 0)
	rep.Latency = summarize(deliveries)
	if arrivals := subs.arrivals(); len(arrivals) > 0 {
		a := summarize(arrivals)
		rep.ArrivalLatency = &a
	}
	return rep
}

// fanoutPublisher signs every fan-out event up front and connects.
func fanoutPublisher(ctx context.Context, o options, topic string) (*publisher, error) {
	s, err := newSigner()
	if err != nil {
		return nil, err
	}
	src, err := newEventSource(eventSpec{
		signer: s, runID: o.runID, contentBytes: o.contentBytes,
		tags:    nostr.Tags{{"t", topic}},
		prefill: o.fanoutEvents, budget: o.fanoutEvents,
	})
	if err != nil {
		return nil, err
	}
	conn, err := dialAuthed(ctx, o.url, s)
	if err != nil {
		return nil, err
	}
	return &publisher{conn: conn, src: src, latencies: make([]time.Duration, 0, o.fanoutEvents)}, nil
}

// paced publishes the whole supply, one event per fanoutSpacing tick, each
// after the previous OK.
func (p *publisher) paced(ctx context.Context, clock *sendClock, rejected, errs *tally) {
	tick := time.NewTicker(fanoutSpacing)
	defer tick.Stop()
	for p.publishNext(ctx, clock, rejected, errs) {
		select {
		case <-tick.C:
		case <-ctx.Done():
			return
		}
	}
}
