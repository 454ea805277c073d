package main

import (
	"math"
	"slices"
	"sync"
	"time"
)

// epoch anchors monoNow; time.Since reads the monotonic clock, so latencies
// are immune to wall-clock steps.
var epoch = time.Now()

// monoNow returns nanoseconds since the process started, never 0 (0 marks
// "not sent yet" in sendClock).
func monoNow() int64 { return int64(time.Since(epoch)) + 1 }

// latencyStats summarizes a set of latency samples in milliseconds.
type latencyStats struct {
	Count int     `json:"count"`
	P50   float64 `json:"p50_ms"`
	P90   float64 `json:"p90_ms"`
	P99   float64 `json:"p99_ms"`
	Max   float64 `json:"max_ms"`
	Mean  float64 `json:"mean_ms"`
}

// summarize sorts samples in place and returns their percentiles.
func summarize(samples []time.Duration) latencyStats {
	if len(samples) == 0 {
		return latencyStats{}
	}
	slices.Sort(samples)
	var sum time.Duration
	for _, d := range samples {
		sum += d
	}
	return latencyStats{
		Count: len(samples),
		P50:   millis(percentile(samples, 50)),
		P90:   millis(percentile(samples, 90)),
		P99:   millis(percentile(samples, 99)),
		Max:   millis(samples[len(samples)-1]),
		Mean:  millis(sum / time.Duration(len(samples))),
	}
}

// percentile returns the nearest-rank p-th percentile (0 < p <= 100) of
// ascending samples: the smallest sample at or above p percent of them.
func percentile(sorted []time.Duration, p float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	rank := int(math.Ceil(p / 100 * float64(len(sorted))))
	rank = min(max(rank, 1), len(sorted))
	return sorted[rank-1]
}

// millis converts to milliseconds rounded to the microsecond.
func millis(d time.Duration) float64 {
	return math.Round(float64(d)/float64(time.Microsecond)) / 1000
}

// roundSeconds converts to seconds rounded to the millisecond.
func roundSeconds(d time.Duration) float64 { return math.Round(d.Seconds()*1000) / 1000 }

// perSecond is n per second of d, rounded to one decimal.
func perSecond(n int, d time.Duration) float64 {
	if d <= 0 {
		return 0
	}
	return math.Round(float64(n)/d.Seconds()*10) / 10
}

// tally counts failures of one kind and keeps the first few messages. It is
// safe for concurrent use.
type tally struct {
	mu      sync.Mutex
	count   int
	samples []string
}

const maxTallySamples = 5

func (t *tally) add(msg string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.count++
	if len(t.samples) < maxTallySamples && !slices.Contains(t.samples, msg) {
		t.samples = append(t.samples, msg)
	}
}

func (t *tally) addErr(what string, err error) { t.add(what + ": " + err.Error()) }

// tallyReport is a tally as it appears in the JSON report.
type tallyReport struct {
	Count int      `json:"count"`
	First []string `json:"first,omitempty"`
}

func (t *tally) report() tallyReport {
	t.mu.Lock()
	defer t.mu.Unlock()
	return tallyReport{Count: t.count, First: slices.Clone(t.samples)}
}
