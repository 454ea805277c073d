package main

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

const pgbenchOutput = `pgbench (15.18 (Debian 15.18-0+deb12u1))
transaction type: /tmp/tmp.R05QEWGAsK
number of clients: 16
latency average = 1.766 ms
initial connection time = 12.345 ms
tps = 9086.298163 (without initial connection time)
`

func TestPgbenchTPS(t *testing.T) {
	t.Parallel()
	tps, err := pgbenchTPS([]byte(pgbenchOutput))
	require.NoError(t, err)
	require.InDelta(t, 9086.298163, tps, 1e-9)
	_, err = pgbenchTPS([]byte("pgbench: error: connection refused\n"))
	require.Error(t, err)
}

// sampleReport is a report as a whole run leaves it.
func sampleReport() *report {
	rep := &report{}
	sc := &rep.Scenarios
	for _, p := range []struct {
		n     int
		rate  float64
		p99   float64
		error string
	}{{1, 600, 2.5, ""}, {16, 4600, 19.5, ""}, {64, 4800, 40, ""}} {
		sc.Publish = append(sc.Publish, &publishReport{Publishers: p.n, AcceptedPerSec: p.rate, OKLatency: latencyStats{P50: 1, P99: p.p99}, Error: p.error})
	}
	sc.AfterBurst = &afterBurstReport{Fresh: true, BurstEvents: 25000, BurstSeconds: 12.5, WindowSeconds: 5,
		Windows: []windowLatency{{StartSeconds: 0, Latency: latencyStats{Count: 9, P50: 3.9}}, {StartSeconds: 5, Latency: latencyStats{Count: 9, P50: 1.1}}}}
	sc.AfterBurst.Worst = worstWindow(sc.AfterBurst.Windows)
	sc.Shapes = &shapesReport{Shapes: []shapeResult{
		{Name: "kinds", Completed: 500, EventsMax: 100, Latency: latencyStats{P50: 1.3, P99: 3}},
		{Name: "author", Completed: 500, EventsMax: 100, Latency: latencyStats{P50: 1.5, P99: 3}},
		{Name: "id", Completed: 500, EventsMax: 1, Latency: latencyStats{P50: 0.29, P99: 1}},
		{Name: "tag", Skipped: "no t tag"},
		{Name: "search-common", Completed: 80, EventsMax: 10, Latency: latencyStats{P50: 30, P99: 51}},
		{Name: "search-rare", Completed: 500, EventsMax: 3, Latency: latencyStats{P50: 1, P99: 2}},
	}}
	sc.Fanout = &fanoutReport{SubscribersRequested: 1000, SubscribersConnected: 1000, Expected: 200000, Received: 200000,
		Latency:  latencyStats{P50: 5, P99: 18},
		CPU:      &cpuReport{RelayUSPerDelivery: 7.5, BenchUSPerDelivery: 9.1},
		RelayRSS: &rssReport{BaseKB: 44 * 1024, PeakKB: 84 * 1024, Connections: 1000, PerConnBytes: perConnBytes(44*1024, 84*1024, 1000)}}
	sc.Listener = &listenerReport{Mentions: 21, Delivered: 21, MedianMs: 0.9, P90Ms: 2.1, MaxMs: 9.017, FirstMs: 9.017, AfterIdleMs: 0.8246, IdleSeconds: 120}
	return rep
}

func statusOf(t *testing.T, rows []tableRow, measure string) string {
	t.Helper()
	for _, r := range rows {
		if r.measure == measure {
			return r.status
		}
	}
	t.Fatalf("no row %q in %v", measure, rows)
	return ""
}

func TestBuildTableJudgesEveryTarget(t *testing.T) {
	t.Parallel()
	rows := buildTable(sampleReport(), 9000)
	want := map[string]string{
		"pgbench single-row INSERT, 16 clients":         statusNone,
		"publish, 1 publishers":                         statusNone,
		"publish, 16 publishers: ratio to pgbench":      statusPass, // 4600 / 9000 = 0.51
		"publish, 16 publishers: OK p99":                statusPass,
		"publish, 64 publishers":                        statusNone,
		"REQ kinds after a burst, worst 5 s window p50": statusPass, // 3.9 ms
		"REQ kinds p50":                                 statusMiss, // 1.3 ms
		"REQ author":                                    statusNone,
		"REQ id p50":                                    statusPass,
		"REQ tag":                                       statusNA,
		"REQ search-common p99":                         statusMiss,
		"REQ search-rare p99":                           statusPass,
		"fan-out 1→1000, delivery p99":                  statusPass,
		"fan-out CPU per delivery, relay / buzz-bench":  statusNone,
		"relay RSS per subscribed connection":           statusMiss, // 41 KB
		"mention → listener (OK → POST) median":         statusPass,
		"mention → listener (OK → POST) p90":            statusMiss, // 2.1 ms
		"mention → listener (OK → POST) max":            statusMiss, // 9.017 ms
	}
	require.Len(t, rows, len(want))
	for measure, status := range want {
		require.Equal(t, status, statusOf(t, rows, measure), measure)
	}
}

// A duplicate delivery fails the fan-out row even when every event
// arrived: "all delivered" means once each.
// Mutation killed: duplicates not looked at by the table.
func TestBuildTableMissesOnDuplicateDeliveries(t *testing.T) {
	t.Parallel()
	rep := sampleReport()
	rep.Scenarios.Fanout.Duplicates = 1
	rows := buildTable(rep, 9000)
	require.Equal(t, statusMiss, statusOf(t, rows, "fan-out 1→1000, delivery p99"))
}

func TestBuildTableWithoutReferences(t *testing.T) {
	t.Parallel()
	rep := sampleReport()
	rep.Scenarios.AfterBurst.Fresh = false
	rep.Scenarios.Fanout.Received-- // one delivery lost fails the row however fast the rest
	rows := buildTable(rep, 0)
	require.Equal(t, statusNA, statusOf(t, rows, "pgbench single-row INSERT"))
	require.Equal(t, statusNA, statusOf(t, rows, "publish, 16 publishers: ratio to pgbench"))
	require.Equal(t, statusNA, statusOf(t, rows, "REQ kinds after a burst, worst 5 s window p50"), "a store that had rows says nothing about fresh statistics")
	rep.Scenarios.Listener = nil
	require.Equal(t, statusNA, statusOf(t, buildTable(rep, 0), "mention → listener (OK → POST)"))
	rep.Scenarios.Listener = &listenerReport{Error: "no keep-alive HEAD from the relay within a minute"}
	require.Equal(t, statusNA, statusOf(t, buildTable(rep, 0), "mention → listener (OK → POST)"))
	rep.Scenarios.Fanout.Missing = 1
	require.Equal(t, statusMiss, statusOf(t, buildTable(rep, 0), "fan-out 1→1000, delivery p99"))
}

func TestFormatTableAligns(t *testing.T) {
	t.Parallel()
	out := formatTable([]tableRow{{"a → b", "1 ms", "≤ 2 ms", statusPass}, {"longer measure", "10 ms", "-", statusMiss}})
	lines := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
	require.Len(t, lines, 4)
	require.True(t, strings.HasPrefix(lines[0], "measure        | result | target | status"), lines[0])
	// Columns line up in runes, whatever the bytes of → and ≤.
	require.Equal(t, strings.Index(lines[3], "|"), len("longer measure "))
	require.Equal(t, len([]rune(lines[2][:strings.Index(lines[2], "|")])), len([]rune("longer measure ")))
}

// Mutation killed: okToPost printing ms(v) for a negative delay ("-0.24 ms").
func TestListenerRowsSayWhenThePOSTCameFirst(t *testing.T) {
	t.Parallel()
	rows := listenerRows(&listenerReport{Delivered: 21, MedianMs: 0.6, P90Ms: 0.8, MaxMs: 1, FirstMs: 0.7, AfterIdleMs: -0.24, IdleSeconds: 120})
	require.Equal(t, "1.00 ms (first 0.70 ms, after 120 s idle POST 0.24 ms before the OK)", rows[2].result)
}

func TestRunTableEndToEnd(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	raw, err := json.Marshal(sampleReport())
	require.NoError(t, err)
	reportFile, pgFile := filepath.Join(dir, "r.json"), filepath.Join(dir, "pg.txt")
	require.NoError(t, os.WriteFile(reportFile, raw, 0o600))
	require.NoError(t, os.WriteFile(pgFile, []byte(pgbenchOutput), 0o600))
	var stdout, stderr bytes.Buffer
	require.NoError(t, runTable([]string{"-pgbench", pgFile, reportFile}, &stdout, &stderr))
	require.Contains(t, stdout.String(), "9086 tps")
	require.Contains(t, stdout.String(), "0.51 of pgbench")
	require.Contains(t, stdout.String(), "9.02 ms (first 9.02 ms, after 120 s idle 0.82 ms)")
	require.Empty(t, stderr.String())

	// A missing pgbench file: its rows say so, the table still prints.
	stdout.Reset()
	require.NoError(t, runTable([]string{"-pgbench", filepath.Join(dir, "absent"), reportFile}, &stdout, &stderr))
	require.Contains(t, stdout.String(), "mention → listener")
	require.Contains(t, stderr.String(), "pgbench:")
	require.Error(t, runTable(nil, &stdout, &stderr))
}

func TestVMRSS(t *testing.T) {
	t.Parallel()
	kb, err := vmRSS([]byte("Name:\tbuzz-relay\nVmPeak:\t  999 kB\nVmRSS:\t   45124 kB\nThreads:\t9\n"))
	require.NoError(t, err)
	require.Equal(t, int64(45124), kb)
	_, err = vmRSS([]byte("Name:\tx\n"))
	require.Error(t, err)
	own, err := readRSS(os.Getpid())
	require.NoError(t, err)
	require.Positive(t, own)
	require.InDelta(t, 40*1024*1024/1000.0, perConnBytes(44*1024, 84*1024, 1000), 1e-9, "40 MB over 1,000 connections")
	require.Zero(t, perConnBytes(1, 2, 0))
}

func TestParseLevels(t *testing.T) {
	t.Parallel()
	levels, err := parseLevels("1, 16,64")
	require.NoError(t, err)
	require.Equal(t, []int{1, 16, 64}, levels)
	for _, bad := range []string{"", "0", "1,,2", "x", "-4"} {
		_, err := parseLevels(bad)
		require.Error(t, err, bad)
	}
	o, err := parseFlags([]string{"-publishers", "1,16,64"})
	require.NoError(t, err)
	require.Equal(t, []int{1, 16, 64}, o.publisherLevels)
}

func TestPlanPublishCapsOnePublisher(t *testing.T) {
	t.Parallel()
	o := options{presignRate: 4000, duration: 10 * time.Second}
	o.publishers = 16
	require.Equal(t, publishPlan{publishers: 16, prefill: 2501, budget: 10004}, planPublish(o))
	// A lone closed-loop publisher cannot send 4,000 events/s: signing
	// 40,000 events for it only delayed the run.
	o.publishers = 1
	require.Equal(t, publishPlan{publishers: 1, prefill: 20001, budget: 80004}, planPublish(o))
}

// A publish row whose load generator had to sign while the clock ran says
// so: those signatures took the relay's cores, and the row's numbers are
// not the relay's alone.
// Mutation killed: the late-signing count left out of the row.
func TestPublishRowSaysWhatWasSignedWhileTimed(t *testing.T) {
	t.Parallel()
	rep := sampleReport()
	rep.Scenarios.Publish[1].SignedDuringRun = 1234
	rows := buildTable(rep, 9000)
	for _, r := range rows {
		if r.measure == "publish, 16 publishers: ratio to pgbench" {
			require.Contains(t, r.result, "1234 signed while timed")
			return
		}
	}
	t.Fatal("no 16-publisher row")
}

// With -metrics-url, a publish row says how many events the relay committed
// per transaction: the number that explains its ratio to pgbench. A scrape
// that failed says nothing rather than a wrong number.
// Mutation killed: the group report left out of the row.
func TestPublishRowSaysEventsPerCommit(t *testing.T) {
	t.Parallel()
	rep := sampleReport()
	rep.Scenarios.Publish[1].Groups = &groupReport{Groups: 100, EventsPerGroup: 4.25}
	rep.Scenarios.Publish[2].Groups = &groupReport{Error: "connection refused"}
	results := map[string]string{}
	for _, r := range buildTable(rep, 9000) {
		results[r.measure] = r.result
	}
	require.Contains(t, results["publish, 16 publishers: ratio to pgbench"], ", 4.2 events per commit")
	require.Contains(t, results, "publish, 64 publishers")
	require.NotContains(t, results["publish, 64 publishers"], "per commit")
}
