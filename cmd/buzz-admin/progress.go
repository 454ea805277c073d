package main

import (
	"encoding/json"
	"fmt"
	"io"
	"sync"
	"time"

	"github.com/buzzrelay/buzz/internal/deletion"
)

// progressDisplay shows a running deletion: one line redrawn in place on a
// terminal, JSON lines otherwise (so a log collector or a script reads the
// same facts).
type progressDisplay struct {
	out       io.Writer
	jsonLines bool
	mu        sync.Mutex
	stepStart time.Time
	step      string
	lastDraw  time.Time
	drawn     bool
	now       func() time.Time
}

func newProgressDisplay(out io.Writer) *progressDisplay {
	return &progressDisplay{out: out, jsonLines: !isTerminal(out), now: time.Now}
}

// progressLine is one JSON line.
type progressLine struct {
	Progress deletion.Progress `json:"progress"`
	Rate     float64           `json:"rate_per_second"`
	ETASecs  *float64          `json:"eta_seconds"`
}

// drawInterval bounds how often the display redraws within one step.
const drawInterval = 250 * time.Millisecond

func (d *progressDisplay) update(p deletion.Progress) {
	d.mu.Lock()
	defer d.mu.Unlock()
	now := d.now()
	key := p.RequestID.String() + p.Stage + p.Step
	changed := key != d.step
	if changed {
		d.step, d.stepStart = key, now
	}
	if !changed && now.Sub(d.lastDraw) < drawInterval {
		return
	}
	d.lastDraw = now
	done, total, unit := p.ObjectsDeleted, p.ObjectsTotal, "objects"
	if p.RowsDeleted > 0 || p.RowsTotal > 0 {
		done, total, unit = p.RowsDeleted, p.RowsTotal, "rows"
	}
	elapsed := now.Sub(d.stepStart).Seconds()
	var rate float64
	if elapsed > 0 {
		rate = float64(done) / elapsed
	}
	var eta *float64
	if rate > 0 && total > done {
		v := float64(total-done) / rate
		eta = &v
	}
	if d.jsonLines {
		_ = json.NewEncoder(d.out).Encode(progressLine{Progress: p, Rate: rate, ETASecs: eta})
		return
	}
	line := fmt.Sprintf("%s  %-18s %-24s", p.RequestID.String()[:8], p.Stage, p.Step)
	if p.Chunks > 0 {
		line += fmt.Sprintf("  chunk %d of %d", p.Chunk, p.Chunks)
	}
	line += fmt.Sprintf("  objects %d  rows %d  %.0f %s/s", p.ObjectsDeleted, p.RowsDeleted, rate, unit)
	if eta != nil {
		line += fmt.Sprintf("  ETA %s", (time.Duration(*eta) * time.Second).Round(time.Second))
	}
	fmt.Fprintf(d.out, "\r\033[K%s", line)
	d.drawn = true
}

// finish ends the in-place line so the result prints below it.
func (d *progressDisplay) finish() {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.drawn && !d.jsonLines {
		fmt.Fprintln(d.out)
	}
}
