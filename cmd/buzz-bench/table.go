package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
)

// The table mode reads a JSON report of this command and pgbench's output,
// and prints one row per measure with its target and whether the run met it:
//
//	buzz-bench table -pgbench bin/bench-pgbench.txt bin/bench.json

// Targets. They live here, in the benchmark's output, never in tests.
const (
	targetPublishRatio   = 0.5  // of pgbench's single-row insert tps, 16 publishers
	targetPublishP99     = 20.0 // ms, OK latency at 16 publishers
	targetKindsP50       = 1.2  // ms
	targetKindsBurstP50  = 4.0  // ms, every window after a burst
	targetIDP50          = 0.3  // ms
	targetSearchP99      = 50.0 // ms, any term
	targetFanoutP99      = 20.0 // ms
	targetRSSPerConn     = 40 * 1024
	targetListenerMedian = 1.0 // ms
	targetListenerP90    = 2.0 // ms
	targetListenerMax    = 8.0 // ms, the first and the one after idle included
	pgbenchClients       = 16  // the publish level compared with pgbench
)

// tableRow is one line of the table.
type tableRow struct{ measure, result, target, status string }

const (
	statusPass = "PASS"
	statusMiss = "MISS"
	statusNone = "-"   // reported, no target
	statusNA   = "n/a" // not measured in this run
)

// atMost is the status of a measure whose target is an upper bound.
func atMost(v, limit float64) string {
	if v <= limit {
		return statusPass
	}
	return statusMiss
}

func atLeast(v, floor float64) string {
	if v >= floor {
		return statusPass
	}
	return statusMiss
}

func ms(v float64) string { return strconv.FormatFloat(v, 'f', 2, 64) + " ms" }

// buildTable lays out every measure of rep. pgbenchTPS is 0 when it was not
// measured.
func buildTable(rep *report, pgbenchTPS float64) []tableRow {
	var rows []tableRow
	add := func(measure, result, target, status string) {
		rows = append(rows, tableRow{measure, result, target, status})
	}
	if pgbenchTPS > 0 {
		add(fmt.Sprintf("pgbench single-row INSERT, %d clients", pgbenchClients), fmt.Sprintf("%.0f tps", pgbenchTPS), "reference", statusNone)
	} else {
		add("pgbench single-row INSERT", "not run", "reference", statusNA)
	}
	sc := rep.Scenarios
	for _, p := range sc.Publish {
		measure := fmt.Sprintf("publish, %d publishers", p.Publishers)
		if p.Error != "" {
			add(measure, "error: "+p.Error, "", statusNA)
			continue
		}
		result := fmt.Sprintf("%.0f ev/s, OK p50 %s p99 %s", p.AcceptedPerSec, ms(p.OKLatency.P50), ms(p.OKLatency.P99))
		if pgbenchTPS > 0 {
			result += fmt.Sprintf(", %.2f of pgbench", p.AcceptedPerSec/pgbenchTPS)
		}
		if g := p.Groups; g != nil && g.Error == "" && g.Groups > 0 {
			result += fmt.Sprintf(", %.1f events per commit", g.EventsPerGroup)
		}
		if p.SignedDuringRun > 0 {
			// The load generator's signing shares the cores with the relay.
			result += fmt.Sprintf(", %d signed while timed (raise -presign-rate)", p.SignedDuringRun)
		}
		if p.Publishers != pgbenchClients {
			add(measure, result, "reported", statusNone)
			continue
		}
		status := statusNA
		if pgbenchTPS > 0 {
			status = atLeast(p.AcceptedPerSec/pgbenchTPS, targetPublishRatio)
		}
		add(measure+": ratio to pgbench", result, fmt.Sprintf("≥ %.1f of pgbench", targetPublishRatio), status)
		add(measure+": OK p99", ms(p.OKLatency.P99), "≤ "+ms(targetPublishP99), atMost(p.OKLatency.P99, targetPublishP99))
	}
	if ab := sc.AfterBurst; ab != nil {
		measure := "REQ kinds after a burst, worst 5 s window p50"
		if ab.WindowSeconds != 5 {
			measure = fmt.Sprintf("REQ kinds after a burst, worst %g s window p50", ab.WindowSeconds)
		}
		switch {
		case ab.Worst == nil:
			add(measure, "error: "+ab.Error, "≤ "+ms(targetKindsBurstP50), statusNA)
		default:
			result := fmt.Sprintf("%s (window at %gs; %d events in %.1f s)", ms(ab.Worst.Latency.P50), ab.Worst.StartSeconds, ab.BurstEvents, ab.BurstSeconds)
			status := atMost(ab.Worst.Latency.P50, targetKindsBurstP50)
			if !ab.Fresh {
				result += ", store NOT fresh"
				status = statusNA
			}
			add(measure, result, "≤ "+ms(targetKindsBurstP50), status)
		}
	}
	if sh := sc.Shapes; sh != nil {
		if sh.Error != "" && len(sh.Shapes) == 0 {
			add("REQ shapes", "error: "+sh.Error, "", statusNA)
		}
		for _, s := range sh.Shapes {
			rows = append(rows, shapeRow(s))
		}
	}
	if r := sc.Req; r != nil {
		add("REQ kinds (req scenario) p50", ms(r.Latency.P50), "≤ "+ms(targetKindsP50), atMost(r.Latency.P50, targetKindsP50))
	}
	if f := sc.Fanout; f != nil {
		measure := fmt.Sprintf("fan-out 1→%d, delivery p99", f.SubscribersRequested)
		if f.Error != "" {
			add(measure, "error: "+f.Error, "", statusNA)
		} else {
			status := atMost(f.Latency.P99, targetFanoutP99)
			if f.Missing > 0 || f.Duplicates > 0 || f.SubscribersConnected < f.SubscribersRequested {
				status = statusMiss
			}
			add(measure, fmt.Sprintf("%s (p50 %s), %d of %d delivered to %d subscribers", ms(f.Latency.P99), ms(f.Latency.P50), f.Received, f.Expected, f.SubscribersConnected),
				"≤ "+ms(targetFanoutP99)+", all delivered", status)
			if a := f.ArrivalLatency; a != nil {
				add("fan-out, p99 at arrival in the socket (unread)", fmt.Sprintf("%s (p50 %s)", ms(a.P99), ms(a.P50)), "", statusNone)
			}
		}
		if c := f.CPU; c != nil && c.BenchUSPerDelivery > 0 {
			relay := "?"
			if c.RelayUSPerDelivery > 0 {
				relay = fmt.Sprintf("%.1f", c.RelayUSPerDelivery)
			}
			add("fan-out CPU per delivery, relay / buzz-bench", fmt.Sprintf("%s / %.1f µs", relay, c.BenchUSPerDelivery), "", statusNone)
		}
		if r := f.RelayRSS; r != nil {
			if r.Error != "" && r.Connections == 0 {
				add("relay RSS per subscribed connection", "error: "+r.Error, "≤ 40 KB", statusNA)
			} else {
				add("relay RSS per subscribed connection", fmt.Sprintf("%.1f KB (%d → %d MB for %d)", r.PerConnBytes/1024, r.BaseKB/1024, r.PeakKB/1024, r.Connections),
					"≤ 40 KB", atMost(r.PerConnBytes, targetRSSPerConn))
			}
		}
	}
	rows = append(rows, listenerRows(rep.Scenarios.Listener)...)
	return rows
}

// shapeRow is the row of one REQ shape; the kinds and id shapes have p50
// targets, the searches a p99 target, the rest are reported.
func shapeRow(s shapeResult) tableRow {
	measure := "REQ " + s.Name
	if s.Skipped != "" {
		return tableRow{measure, "skipped: " + s.Skipped, "", statusNA}
	}
	if s.Completed == 0 {
		return tableRow{measure, fmt.Sprintf("no REQ completed (%d errors)", s.Errors.Count), "", statusNA}
	}
	l := s.Latency
	result := fmt.Sprintf("p50 %s p99 %s max %s, %d events", ms(l.P50), ms(l.P99), ms(l.Max), s.EventsMax)
	switch s.Name {
	case "kinds":
		return tableRow{measure + " p50", result, "≤ " + ms(targetKindsP50), atMost(l.P50, targetKindsP50)}
	case "id":
		return tableRow{measure + " p50", result, "≤ " + ms(targetIDP50), atMost(l.P50, targetIDP50)}
	case "search-common", "search-rare":
		return tableRow{measure + " p99", result, "≤ " + ms(targetSearchP99), atMost(l.P99, targetSearchP99)}
	}
	return tableRow{measure, result, "reported", statusNone}
}

// listenerRows are the mention -> listener rows: OK to POST received,
// through the relay.
func listenerRows(l *listenerReport) []tableRow {
	const measure = "mention → listener (OK → POST)"
	switch {
	case l == nil:
		return []tableRow{{measure, "not run", "", statusNA}}
	case l.Error != "":
		return []tableRow{{measure, "error: " + l.Error, "", statusNA}}
	}
	return []tableRow{
		{measure + " median", fmt.Sprintf("%s (%d mentions)", okToPost(l.MedianMs), l.Delivered), "≤ " + ms(targetListenerMedian), atMost(l.MedianMs, targetListenerMedian)},
		{measure + " p90", okToPost(l.P90Ms), "≤ " + ms(targetListenerP90), atMost(l.P90Ms, targetListenerP90)},
		{measure + " max", fmt.Sprintf("%s (first %s, after %.0f s idle %s)", okToPost(l.MaxMs), okToPost(l.FirstMs), l.IdleSeconds, okToPost(l.AfterIdleMs)),
			"≤ " + ms(targetListenerMax), atMost(l.MaxMs, targetListenerMax)},
	}
}

// okToPost renders one OK -> POST delay. The relay writes the OK and hands
// the POST off at the same moment, after the commit, so the listener can
// hear of a mention before its publisher has read the OK: a negative delay,
// said in words rather than as a negative time.
func okToPost(v float64) string {
	if v < 0 {
		return "POST " + ms(-v) + " before the OK"
	}
	return ms(v)
}

// formatTable renders rows as an aligned text table.
func formatTable(rows []tableRow) string {
	header := tableRow{"measure", "result", "target", "status"}
	all := append([]tableRow{header}, rows...)
	var w [4]int
	for _, r := range all {
		for i, cell := range r.cells() {
			w[i] = max(w[i], len([]rune(cell)))
		}
	}
	var b strings.Builder
	line := func(r tableRow) {
		for i, cell := range r.cells() {
			if i > 0 {
				b.WriteString(" | ")
			}
			b.WriteString(cell)
			if i < 3 {
				b.WriteString(strings.Repeat(" ", w[i]-len([]rune(cell))))
			}
		}
		b.WriteString("\n")
	}
	line(header)
	b.WriteString(strings.Repeat("-", w[0]+w[1]+w[2]+w[3]+9) + "\n")
	for _, r := range rows {
		line(r)
	}
	return b.String()
}

func (r tableRow) cells() [4]string { return [4]string{r.measure, r.result, r.target, r.status} }

// pgbenchTPS reads the tps line of pgbench's output.
func pgbenchTPS(out []byte) (float64, error) {
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		rest, ok := strings.CutPrefix(strings.TrimSpace(sc.Text()), "tps = ")
		if !ok {
			continue
		}
		field, _, _ := strings.Cut(rest, " ")
		return strconv.ParseFloat(field, 64)
	}
	return 0, errors.New("pgbench printed no tps line")
}

// runTable is the table mode: it prints the table to stdout. A missing or
// unreadable pgbench file makes its rows "not run" rather than failing, so a
// partial run still shows what it measured.
func runTable(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("buzz-bench table", flag.ContinueOnError)
	fs.SetOutput(stderr)
	pgbenchFile := fs.String("pgbench", "", "pgbench's output")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() != 1 {
		return errors.New("usage: buzz-bench table [-pgbench FILE] REPORT.json")
	}
	raw, err := os.ReadFile(fs.Arg(0))
	if err != nil {
		return err
	}
	var rep report
	if err := json.Unmarshal(raw, &rep); err != nil {
		return fmt.Errorf("%s: %w", fs.Arg(0), err)
	}
	var tps float64
	if *pgbenchFile != "" {
		if tps, err = readWith(*pgbenchFile, pgbenchTPS); err != nil {
			fmt.Fprintln(stderr, "buzz-bench table: pgbench:", err)
		}
	}
	_, err = io.WriteString(stdout, formatTable(buildTable(&rep, tps)))
	return err
}

func readWith[T any](path string, parse func([]byte) (T, error)) (T, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		var zero T
		return zero, err
	}
	return parse(b)
}
