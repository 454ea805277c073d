package outbox

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"os"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/buzzrelay/buzz/internal/nostr"
)

// benchSpacing is the pause between mentions: uniform in [d, 1.6 d], d =
// BUZZ_OUTBOX_BENCH_SPACING (default 2.5 s, so the idle worker sits at its
// 2 s poll ceiling, the worst case for latency). A shorter d gives a quick run.
func benchSpacing(b *testing.B) func() time.Duration {
	d := 2500 * time.Millisecond
	if v := os.Getenv("BUZZ_OUTBOX_BENCH_SPACING"); v != "" {
		var err error
		if d, err = time.ParseDuration(v); err != nil {
			b.Fatalf("BUZZ_OUTBOX_BENCH_SPACING: %v", err)
		}
	}
	return func() time.Duration { return d + time.Duration(rand.Int64N(int64(d)*6/10+1)) }
}

// latencyPath is one worker with its own listener, on a shared database.
type latencyPath struct {
	listener *testListener
	worker   *Worker
	offer    bool // hand off (fast path) or leave the row to the poll
	arrived  chan struct{}
	target   string
}

func newLatencyPath(b *testing.B, f *fixture, offer bool) *latencyPath {
	p := &latencyPath{offer: offer, arrived: make(chan struct{}, 1), target: newPubkey(b)}
	p.listener = newListener(b, func(http.ResponseWriter, *http.Request) { p.arrived <- struct{}{} })
	routes := routesOf(p.listener)
	d, _, _ := f.deliverer(routes, 5*time.Second, testCAs(p.listener))
	p.worker = NewWorker(f.pool, routes, d)
	f.register(p.listener.pubHex, p.target)
	return p
}

// mention saves one mention and returns the time from "committed (and, on
// the fast path, offered)" to "the listener received the POST".
func (p *latencyPath) mention(b *testing.B, f *fixture) time.Duration {
	w := p.worker
	if !p.offer {
		w = nil
	}
	n := len(p.listener.requests())
	_, _, committed := f.saveTimed(message(b, 9, p.target), w, true)
	select {
	case <-p.arrived:
	case <-time.After(10 * time.Second):
		b.Fatal("no delivery within 10 s")
	}
	return p.listener.requests()[n].At.Sub(committed)
}

type latencyStats struct{ median, p90, max time.Duration }

func statsOf(ds []time.Duration) latencyStats {
	s := slices.Clone(ds)
	slices.Sort(s)
	rank := func(p float64) time.Duration { return s[int(float64(len(s))*p+0.999999)-1] }
	return latencyStats{median: rank(0.5), p90: rank(0.9), max: s[len(s)-1]}
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// BenchmarkHandoffLatency: 20 mentions, fast path and poll only side by
// side (separate databases, run concurrently), from commit to the listener
// receiving the POST. Takes about a minute; for a quick run:
//
//	BUZZ_OUTBOX_BENCH_SPACING=100ms go test ./internal/outbox -run '^$' -bench HandoffLatency -benchtime 1x
func BenchmarkHandoffLatency(b *testing.B) {
	spacing := benchSpacing(b)
	for range b.N {
		f := newFixture(b)
		// Two relay pods on one database, each routing its own listener:
		// one hands off, the other only polls. Their mentions alternate, so
		// each worker idles between its own mentions.
		fast, poll := newLatencyPath(b, f, true), newLatencyPath(b, f, false)
		ctx, cancel := context.WithCancel(context.Background())
		go fast.worker.Run(ctx)
		go poll.worker.Run(ctx)
		var fastDs, pollDs []time.Duration
		for i := range 21 { // the first pair warms up the TLS connections
			next := time.Now().Add(spacing())
			fd := fast.mention(b, f)
			time.Sleep(time.Until(next) * 4 / 10)
			pd := poll.mention(b, f)
			if i > 0 {
				fastDs, pollDs = append(fastDs, fd), append(pollDs, pd)
			}
			time.Sleep(time.Until(next))
		}
		cancel()
		for _, r := range []struct {
			name string
			ds   []time.Duration
		}{{"fast", fastDs}, {"poll", pollDs}} {
			s := statsOf(r.ds)
			b.ReportMetric(ms(s.median), r.name+"_median_ms")
			b.ReportMetric(ms(s.p90), r.name+"_p90_ms")
			b.ReportMetric(ms(s.max), r.name+"_max_ms")
			b.Logf("%s path: median %.2f ms, p90 %.2f ms, max %.2f ms (n=%d)", r.name, ms(s.median), ms(s.p90), ms(s.max), len(r.ds))
		}
	}
	b.ReportMetric(0, "ns/op")
}

// BenchmarkWarmListenerDelivery: the fast path with the keep-alive on, as a
// relay runs it, against a listener that closes connections idle for 60 s
// (a common server default): 20 mentions 2.5-4 s apart counting the very
// first, then one more after BUZZ_OUTBOX_BENCH_IDLE (default 2 min) of
// silence. Without the keep-alive the first and the late mention would
// each pay a TCP and TLS handshake.
func BenchmarkWarmListenerDelivery(b *testing.B) {
	spacing := benchSpacing(b)
	idle := 2 * time.Minute
	if v := os.Getenv("BUZZ_OUTBOX_BENCH_IDLE"); v != "" {
		var err error
		if idle, err = time.ParseDuration(v); err != nil {
			b.Fatalf("BUZZ_OUTBOX_BENCH_IDLE: %v", err)
		}
	}
	for range b.N {
		f := newFixture(b)
		posted := make(chan time.Time, 1)
		l := newListener(b, func(_ http.ResponseWriter, r *http.Request) {
			if r.Method == http.MethodPost {
				posted <- time.Now()
			}
		})
		l.srv.Config.IdleTimeout = time.Minute
		routes := routesOf(l)
		m, err := NewMetrics(prometheus.NewRegistry())
		if err != nil {
			b.Fatal(err)
		}
		relayKey, _ := newKey(b)
		d := NewDeliverer(f.pool, Config{Listeners: routes, Timeout: 5 * time.Second, KeepWarm: DefaultKeepWarm},
			relayKey, m, WithRootCAs(testCAs(l)), WithLogger(slog.New(slog.DiscardHandler)))
		w := NewWorker(f.pool, routes, d)
		target := newPubkey(b)
		f.register(l.pubHex, target)
		ctx, cancel := context.WithCancel(context.Background())
		go w.Run(ctx)
		go d.KeepWarm(ctx)
		time.Sleep(time.Second) // the relay has been up a moment before the first mention
		mention := func() time.Duration {
			_, _, committed := f.saveTimed(message(b, 9, target), w, true)
			select {
			case at := <-posted:
				return at.Sub(committed)
			case <-time.After(10 * time.Second):
				b.Fatal("no delivery within 10 s")
				return 0
			}
		}
		var ds []time.Duration
		for range 20 {
			next := time.Now().Add(spacing())
			ds = append(ds, mention())
			time.Sleep(time.Until(next))
		}
		time.Sleep(idle)
		late := mention()
		cancel()
		s := statsOf(append(ds, late))
		b.ReportMetric(ms(s.median), "median_ms")
		b.ReportMetric(ms(s.p90), "p90_ms")
		b.ReportMetric(ms(s.max), "max_ms")
		b.ReportMetric(ms(ds[0]), "first_ms")
		b.ReportMetric(ms(late), "after_idle_ms")
		b.Logf("warm fast path: median %.2f ms, p90 %.2f ms, max %.2f ms, first %.2f ms, after %s idle %.2f ms (n=%d)",
			ms(s.median), ms(s.p90), ms(s.max), ms(ds[0]), idle, ms(late), len(ds)+1)
	}
	b.ReportMetric(0, "ns/op")
}

// BenchmarkBurstDrain: 1,000 mentions saved back to back (each offered)
// to a listener that answers in 50 ms. At 10 in flight the floor is 5 s.
func BenchmarkBurstDrain(b *testing.B) {
	for range b.N {
		f := newFixture(b)
		var inFlight, peak atomic.Int32
		l := newListener(b, func(w http.ResponseWriter, r *http.Request) {
			n := inFlight.Add(1)
			for p := peak.Load(); n > p && !peak.CompareAndSwap(p, n); p = peak.Load() {
			}
			time.Sleep(50 * time.Millisecond)
			inFlight.Add(-1)
		})
		routes := routesOf(l)
		d, m, _ := f.deliverer(routes, 5*time.Second, testCAs(l))
		w := NewWorker(f.pool, routes, d)
		ctx, cancel := context.WithCancel(context.Background())
		go w.Run(ctx)
		target := newPubkey(b)
		f.register(l.pubHex, target)

		start := time.Now()
		for range 1000 {
			f.save(message(b, 9, target), w, true)
		}
		saved := time.Since(start)
		f.waitForEmptyOutbox(time.Minute)
		drained := time.Since(start)
		cancel()
		if got := outcomes(m)[outcomeAccepted]; got != 1000 || peak.Load() > maxInFlight {
			b.Fatalf("accepted %v, peak in flight %d", got, peak.Load())
		}
		b.ReportMetric(drained.Seconds(), "drain_s")
		b.ReportMetric(float64(peak.Load()), "peak_in_flight")
		b.Logf("1,000 mentions: saved in %.2f s, all delivered after %.2f s, peak in flight %d", saved.Seconds(), drained.Seconds(), peak.Load())
	}
	b.ReportMetric(0, "ns/op")
}

// BenchmarkMentionBehindAnotherCommunitysFlood: one key floods 1,000
// mentions in community A to a listener that answers in 50 ms (queued at
// once, as a burst of saves on another pod would leave them), then
// community B saves one mention to the same listener: handed off at commit
// by the saving pod (handoff), or queued for the poll (saved on a pod that
// does not deliver, or whose hand-off was full). Reported: how long B's
// mention waits for its POST (b_wait_s).
func BenchmarkMentionBehindAnotherCommunitysFlood(b *testing.B) {
	for _, path := range []string{"handoff", "poll"} {
		b.Run(path, func(b *testing.B) {
			for range b.N {
				b.ReportMetric(mentionBehindFlood(b, path == "handoff").Seconds(), "b_wait_s")
			}
			b.ReportMetric(0, "ns/op")
		})
	}
}

func mentionBehindFlood(b *testing.B, handoff bool) time.Duration {
	f := newFixture(b)
	other, err := f.q.CommunityCreate(context.Background(), "other.example")
	require.NoError(b, err)
	fb := &fixture{t: b, pool: f.pool, q: f.q, community: other.ID}
	l := newListener(b, func(w http.ResponseWriter, r *http.Request) { time.Sleep(50 * time.Millisecond) })
	routes := routesOf(l)
	d, _, _ := f.deliverer(routes, 5*time.Second, testCAs(l))
	w := NewWorker(f.pool, routes, d)
	target := newPubkey(b)
	f.register(l.pubHex, target)
	flood, _ := newKey(b)
	for i := range 1000 {
		ev := &nostr.Event{Kind: 9, CreatedAt: time.Now().Unix(), Content: "flood " + strconv.Itoa(i), Tags: nostr.Tags{{"p", target}}}
		require.NoError(b, ev.Sign(flood))
		f.saveIn(ev, nil)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go w.Run(ctx)
	ev := message(b, 9, target)
	var saved time.Time
	if handoff {
		_, _, saved = fb.saveTimed(ev, w, true)
	} else {
		fb.saveIn(ev, nil)
		saved = time.Now()
	}
	for {
		for _, r := range l.requests() {
			if bytes.Contains(r.Body, []byte(ev.ID)) {
				return r.At.Sub(saved)
			}
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// BenchmarkUnclaimedRowsUnderBurst: bursts of mentions to one listener
// that answers in 20 ms, each burst 12 publishers saving 8 mentions each at
// once, the bursts BUZZ_OUTBOX_BENCH_SPACING apart (default 2.5-4 s, so
// the worker's poll has backed off to its 2 s ceiling in between). The
// rows an event could not claim at insert (the hand-off was full) wait for
// the poll; reported is their delay from commit to POST (unclaimed_*), and
// the claimed rows' for comparison. Takes about 40 s.
func BenchmarkUnclaimedRowsUnderBurst(b *testing.B) {
	spacing := benchSpacing(b)
	const bursts, publishers, perPublisher = 10, 12, 8
	for range b.N {
		f := newFixture(b)
		l := newListener(b, func(http.ResponseWriter, *http.Request) { time.Sleep(20 * time.Millisecond) })
		routes := routesOf(l)
		d, _, _ := f.deliverer(routes, 5*time.Second, testCAs(l))
		w := NewWorker(f.pool, routes, d)
		polls := countPolls(w)
		ctx, cancel := context.WithCancel(context.Background())
		go w.Run(ctx)
		target := newPubkey(b)
		f.register(l.pubHex, target)

		type saved struct {
			id        string
			claimed   bool
			committed time.Time
		}
		var all []saved
		for range bursts {
			next := time.Now().Add(spacing())
			var wg sync.WaitGroup
			var smu sync.Mutex
			for range publishers {
				wg.Go(func() {
					for range perPublisher {
						ev := message(b, 9, target)
						kept, _, committed := f.saveTimed(ev, w, true)
						smu.Lock()
						all = append(all, saved{id: ev.ID, claimed: len(kept) > 0, committed: committed})
						smu.Unlock()
					}
				})
			}
			wg.Wait()
			f.waitForEmptyOutbox(time.Minute)
			time.Sleep(time.Until(next))
		}
		cancel()
		b.ReportMetric(float64(polls.n.Load()), "polls")
		b.ReportMetric(float64(polls.empty.Load()), "empty_polls")
		b.Logf("%d rows, %d polls (%d claimed nothing)", len(all), polls.n.Load(), polls.empty.Load())
		var claimedDs, unclaimedDs []time.Duration
		posted := map[string]time.Time{} // by event id
		for _, r := range l.requests() {
			var got struct {
				EventID string `json:"event_id"`
			}
			require.NoError(b, json.Unmarshal(r.Body, &got))
			posted[got.EventID] = r.At
		}
		for _, s := range all {
			at, ok := posted[s.id]
			if !ok {
				b.Fatalf("event %s never posted", s.id)
			}
			if s.claimed {
				claimedDs = append(claimedDs, at.Sub(s.committed))
			} else {
				unclaimedDs = append(unclaimedDs, at.Sub(s.committed))
			}
		}
		for _, r := range []struct {
			name string
			ds   []time.Duration
		}{{"claimed", claimedDs}, {"unclaimed", unclaimedDs}, {"all", append(slices.Clone(claimedDs), unclaimedDs...)}} {
			if len(r.ds) == 0 {
				b.Logf("%s: none", r.name)
				continue
			}
			s := statsOf(r.ds)
			p99 := slices.Sorted(slices.Values(r.ds))[(len(r.ds)*99+99)/100-1]
			b.ReportMetric(ms(s.median), r.name+"_p50_ms")
			b.ReportMetric(ms(p99), r.name+"_p99_ms")
			b.ReportMetric(ms(s.max), r.name+"_max_ms")
			b.Logf("%s rows: p50 %.1f ms, p99 %.1f ms, max %.1f ms (n=%d)", r.name, ms(s.median), ms(p99), ms(s.max), len(r.ds))
		}
	}
	b.ReportMetric(0, "ns/op")
}
