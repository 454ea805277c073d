// Package outage reports a database outage once rather than once per
// failed request or tick: the relay's requests, its background loops and
// the workflow worker share one log per process.
package outage

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/buzzrelay/buzz/internal/dberr"
)

// Log reports a database outage once rather than once per request: while
// PostgreSQL is unreachable every publish, read and background tick fails
// the same way, and a line for each buried the one that said what happened
// (a 10-second restart under a light load wrote 400 "ingest failed" lines
// per process, and the workflow loops and the statistics check about five
// lines a second). The first failure of the outage is logged with its
// cause; the rest are counted, and once the database answers a ping again
// one line says so, with how long it was gone and how many requests
// failed. A nil *Log reports nothing: every failure is left to its caller.
type Log struct {
	log   *slog.Logger
	ping  func(context.Context) error
	every time.Duration // how often a ping checks whether it is back
	now   func() time.Time
	done  chan struct{} // closed by stop: no more pings
	once  sync.Once

	mu       sync.Mutex
	down     bool
	since    time.Time
	failures int
}

// New returns the log of the database ping reaches, on log; now is the
// process's clock.
func New(log *slog.Logger, ping func(context.Context) error, now func() time.Time) *Log {
	return &Log{log: log, ping: ping, every: time.Second, now: now, done: make(chan struct{})}
}

// Stop ends the pings of an outage in progress (the server is shutting
// down, and its pool with it).
func (o *Log) Stop() { o.once.Do(func() { close(o.done) }) }

// Failed reports whether err is the database being unreachable, and then
// logs or counts it; any other error is left to the caller to log.
func (o *Log) Failed(err error, what string) bool {
	if o == nil || !dberr.IsUnreachable(err) {
		return false
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.down {
		o.failures++
		return true
	}
	o.down, o.since, o.failures = true, o.now(), 1
	o.log.Error("database unreachable: requests fail until it answers again; not logged one by one",
		"first_failure", what, "err", err)
	go o.watch()
	return true
}

// Failures is how many failures the outage in progress has had (0 when
// the database is reachable).
func (o *Log) Failures() int {
	o.mu.Lock()
	defer o.mu.Unlock()
	if !o.down {
		return 0
	}
	return o.failures
}

// watch pings until the database answers, then ends the outage.
func (o *Log) watch() {
	for {
		select {
		case <-o.done:
			return
		case <-time.After(o.every):
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		err := o.ping(ctx)
		cancel()
		if err == nil {
			break
		}
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	o.log.Info("database reachable again", "down_for", o.now().Sub(o.since).Round(time.Millisecond).String(),
		"failed_requests", o.failures)
	o.down = false
}
