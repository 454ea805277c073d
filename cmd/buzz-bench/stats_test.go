package main

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestPercentile(t *testing.T) {
	ms := func(vals ...int) []time.Duration {
		out := make([]time.Duration, len(vals))
		for i, v := range vals {
			out[i] = time.Duration(v) * time.Millisecond
		}
		return out
	}
	hundred := make([]time.Duration, 100)
	for i := range hundred {
		hundred[i] = time.Duration(i+1) * time.Millisecond
	}
	cases := []struct {
		name   string
		sorted []time.Duration
		p      float64
		want   time.Duration
	}{
		{"empty", nil, 50, 0},
		{"single", ms(7), 99, 7 * time.Millisecond},
		{"median of odd", ms(1, 2, 3), 50, 2 * time.Millisecond},
		{"median of even is the lower", ms(1, 2, 3, 4), 50, 2 * time.Millisecond},
		{"p99 of 100", hundred, 99, 99 * time.Millisecond},
		{"p90 of 100", hundred, 90, 90 * time.Millisecond},
		{"p100 is the max", hundred, 100, 100 * time.Millisecond},
		{"tiny p is the min", hundred, 0.1, 1 * time.Millisecond},
		{"p99 of 10 is the max", ms(1, 2, 3, 4, 5, 6, 7, 8, 9, 10), 99, 10 * time.Millisecond},
	}
	for _, c := range cases {
		if got := percentile(c.sorted, c.p); got != c.want {
			t.Errorf("%s: percentile(p=%v) = %v, want %v", c.name, c.p, got, c.want)
		}
	}
}

func TestSummarizeSortsAndRounds(t *testing.T) {
	samples := []time.Duration{3 * time.Millisecond, 1500 * time.Microsecond, 1234567 * time.Nanosecond}
	got := summarize(samples)
	want := latencyStats{Count: 3, P50: 1.5, P90: 3, P99: 3, Max: 3, Mean: 1.912}
	if got != want {
		t.Errorf("summarize = %+v, want %+v", got, want)
	}
	if summarize(nil) != (latencyStats{}) {
		t.Error("summarize(nil) should be zero")
	}
}

func TestTallyKeepsFirstDistinctSamples(t *testing.T) {
	var tl tally
	for i := range 10 {
		tl.add("same")
		tl.add(string(rune('a' + i)))
	}
	r := tl.report()
	if r.Count != 20 || len(r.First) != maxTallySamples || r.First[0] != "same" || r.First[1] != "a" {
		t.Errorf("report = %+v", r)
	}
}

func TestDeliveryLogCountsEachEventOnce(t *testing.T) {
	t.Parallel()
	l := newDeliveryLog(2, 100, 4)
	require.True(t, l.add(0, 5, time.Millisecond, 0))
	require.True(t, l.add(1, 5, 2*time.Millisecond, time.Millisecond), "the same seq on another stream is another event")
	require.True(t, l.add(1, 99, 3*time.Millisecond, unknownArrival))
	require.False(t, l.add(0, 5, 4*time.Millisecond, 0), "a second delivery of an event")
	require.Equal(t, 1, l.duplicates)
	require.Equal(t, []time.Duration{time.Millisecond, 2 * time.Millisecond, 3 * time.Millisecond}, l.latencies)
	require.Equal(t, []time.Duration{0, time.Millisecond}, l.arrivals, "arrivals where known, of first deliveries only")
}
