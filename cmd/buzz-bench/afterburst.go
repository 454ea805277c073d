package main

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// afterBurstReport is the result of the after-burst scenario: a burst of
// publishes into a fresh store, then the kinds shape timed window by
// window, so a moment when the planner still works from the empty table's
// statistics shows up as a slow window.
type afterBurstReport struct {
	Existing      int64           `json:"existing_before"` // -1 when COUNT failed
	Fresh         bool            `json:"fresh"`           // no kind-1 event was stored before the burst
	BurstEvents   int             `json:"burst_events"`
	BurstSeconds  float64         `json:"burst_s"`
	WindowSeconds float64         `json:"window_s"`
	Windows       []windowLatency `json:"windows"`
	Worst         *windowLatency  `json:"worst_p50_window,omitempty"`
	Errors        tallyReport     `json:"errors"`
	Error         string          `json:"error,omitempty"`
}

// windowLatency is the REQ latency within one window after the burst.
type windowLatency struct {
	StartSeconds float64      `json:"start_s"` // after the burst ended
	Latency      latencyStats `json:"latency"`
}

// worstWindow returns the window with the highest p50 among those with
// samples, or nil.
func worstWindow(ws []windowLatency) *windowLatency {
	var worst *windowLatency
	for i := range ws {
		if ws[i].Latency.Count > 0 && (worst == nil || ws[i].Latency.P50 > worst.Latency.P50) {
			worst = &ws[i]
		}
	}
	return worst
}

// windowOf returns the index of the window elapsed falls in.
func windowOf(elapsed, window time.Duration) int { return int(elapsed / window) }

func runAfterBurst(ctx context.Context, o options) *afterBurstReport {
	rep := &afterBurstReport{Existing: -1, WindowSeconds: o.afterBurstWindow.Seconds()}
	var errs tally
	defer func() { rep.Errors = errs.report() }()
	s, err := newSigner()
	if err != nil {
		rep.Error = err.Error()
		return rep
	}
	conn, err := dialAuthed(ctx, o.url, s)
	if err != nil {
		rep.Error = err.Error()
		return rep
	}
	defer func() {
		if conn != nil {
			conn.close()
		}
	}()
	if n, err := conn.count(ctx, map[string]any{"kinds": []int{1}}); err != nil {
		errs.addErr("COUNT", err)
	} else {
		rep.Existing, rep.Fresh = n, n == 0
	}
	if !rep.Fresh {
		logf("after-burst: the store is not fresh (%d kind-1 events): the windows do not show a fresh table's statistics", rep.Existing)
	}
	logf("after-burst: publishing %d events", o.afterBurstEvents)
	start := time.Now()
	rep.BurstEvents, err = topUp(ctx, o, o.afterBurstEvents, &errs)
	rep.BurstSeconds = roundSeconds(time.Since(start))
	if err != nil {
		rep.Error = "burst: " + err.Error()
		return rep
	}

	logf("after-burst: timing kinds:[1] limit %d for %s in %s windows", reqLimit, o.afterBurstFor, o.afterBurstWindow)
	filter := map[string]any{"kinds": []int{1}, "limit": reqLimit}
	windows := make([][]time.Duration, windowOf(o.afterBurstFor-1, o.afterBurstWindow)+1)
	tick := time.NewTicker(o.afterBurstPace)
	defer tick.Stop()
	begin := time.Now()
	for i := 0; ctx.Err() == nil; i++ {
		elapsed := time.Since(begin)
		if elapsed >= o.afterBurstFor {
			break
		}
		d, _, err := timedReq(ctx, conn, fmt.Sprintf("burst-%d", i), filter)
		switch {
		case err == nil:
			w := windowOf(elapsed, o.afterBurstWindow)
			windows[w] = append(windows[w], d)
		case errors.Is(err, errClosed):
			errs.addErr("REQ", err)
		default:
			errs.addErr("REQ", err)
			conn.close()
			if conn = redial(ctx, o, &errs); conn == nil {
				rep.Error = "the REQ connection failed"
				return rep
			}
		}
		select {
		case <-tick.C:
		case <-ctx.Done():
		}
	}
	for i, w := range windows {
		rep.Windows = append(rep.Windows, windowLatency{
			StartSeconds: roundSeconds(time.Duration(i) * o.afterBurstWindow),
			Latency:      summarize(w),
		})
	}
	rep.Worst = worstWindow(rep.Windows)
	if rep.Worst == nil {
		rep.Error = "no REQ completed"
	}
	return rep
}
