package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"sync/atomic"
	"time"
)

// rssReport is the relay's resident memory around the fanout scenario,
// read from /proc: the relay must run on this machine.
type rssReport struct {
	PID          int     `json:"pid"`
	BaseKB       int64   `json:"base_kb"` // before any subscriber connected
	PeakKB       int64   `json:"peak_kb"` // highest while they were connected
	Connections  int     `json:"connections"`
	PerConnBytes float64 `json:"per_conn_bytes"`
	Error        string  `json:"error,omitempty"`
}

// rssSampleEvery is how often the peak is sampled.
const rssSampleEvery = 100 * time.Millisecond

// vmRSS returns the VmRSS line of a /proc/<pid>/status document, in kB.
func vmRSS(status []byte) (int64, error) {
	sc := bufio.NewScanner(bytes.NewReader(status))
	for sc.Scan() {
		rest, ok := bytes.CutPrefix(sc.Bytes(), []byte("VmRSS:"))
		if !ok {
			continue
		}
		n, ok := bytes.CutSuffix(bytes.TrimSpace(rest), []byte(" kB"))
		if !ok {
			return 0, fmt.Errorf("VmRSS %q is not in kB", rest)
		}
		return strconv.ParseInt(string(bytes.TrimSpace(n)), 10, 64)
	}
	return 0, errors.New("no VmRSS line")
}

func readRSS(pid int) (int64, error) {
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	return vmRSS(status)
}

// rssSampler records a process's peak resident memory until stopped.
type rssSampler struct {
	pid  int
	peak atomic.Int64
	err  atomic.Value // string: the first failed read
	done chan struct{}
	stop context.CancelFunc
}

// startRSS reads the base now and samples the peak in the background; it
// returns nil when pid is 0 (not asked for).
func startRSS(ctx context.Context, pid int, rep *rssReport) *rssSampler {
	if pid == 0 {
		return nil
	}
	rep.PID = pid
	base, err := readRSS(pid)
	if err != nil {
		rep.Error = err.Error()
		return nil
	}
	rep.BaseKB = base
	ctx, stop := context.WithCancel(ctx)
	s := &rssSampler{pid: pid, done: make(chan struct{}), stop: stop}
	s.peak.Store(base)
	go func() {
		defer close(s.done)
		tick := time.NewTicker(rssSampleEvery)
		defer tick.Stop()
		for {
			if kb, err := readRSS(pid); err != nil {
				s.err.CompareAndSwap(nil, err.Error())
			} else if kb > s.peak.Load() {
				s.peak.Store(kb)
			}
			select {
			case <-tick.C:
			case <-ctx.Done():
				return
			}
		}
	}()
	return s
}

// finish stops sampling and fills the peak and the per-connection growth.
func (s *rssSampler) finish(rep *rssReport, connections int) {
	if s == nil {
		return
	}
	s.stop()
	<-s.done
	rep.PeakKB, rep.Connections = s.peak.Load(), connections
	rep.PerConnBytes = perConnBytes(rep.BaseKB, rep.PeakKB, connections)
	if msg, ok := s.err.Load().(string); ok && rep.Error == "" {
		rep.Error = msg
	}
}

// perConnBytes is the growth from base to peak per connection, in bytes.
func perConnBytes(baseKB, peakKB int64, connections int) float64 {
	if connections <= 0 {
		return 0
	}
	return float64((peakKB-baseKB)*1024) / float64(connections)
}
