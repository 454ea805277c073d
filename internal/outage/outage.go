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
// one line says so, with how long it was gone, how many client requests
// failed and, apart, how many background ticks did: the loops fail about
// five times a second with no client about, so one count of both said
// requests failed after an outage no client saw. A nil *Log reports
// nothing: every failure is left to its caller.
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
	requests int // client requests failed during the outage in progress
	ticks    int // background ticks failed meanwhile
}

// New returns the log of the database ping reaches, on log; now is the
// process's clock.
func New(log *slog.Logger, ping func(context.Context) error, now func() time.Time) *Log {
	return &Log{log: log, ping: ping, every: time.Second, now: now, done: make(chan struct{})}
}

// Stop ends the pings of an outage in progress (the server is shutting
// down, and its pool with it).
func (o *Log) Stop() { o.once.Do(func() { close(o.done) }) }

// Failed reports whether err, a client request's failure, is the
// database being unreachable, and then logs or counts it; any other error
// is left to the caller to log.
func (o *Log) Failed(err error, what string) bool {
	return o.failed(err, what, func() { o.requests++ })
}

// TickFailed is Failed for a background loop's tick (a scheduler's,
// a poll's, a periodic check's): counted apart from client requests.
func (o *Log) TickFailed(err error, what string) bool {
	return o.failed(err, what, func() { o.ticks++ })
}

func (o *Log) failed(err error, what string, count func()) bool {
	if o == nil || !dberr.IsUnreachable(err) {
		return false
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	if !o.down {
		o.down, o.since, o.requests, o.ticks = true, o.now(), 0, 0
		o.log.Error("database unreachable: requests fail until it answers again; not logged one by one",
			"first_failure", what, "err", err)
		go o.watch()
	}
	count()
	return true
}

// Failures is how many client requests and background ticks the outage
// in progress has failed (0 and 0 when the database is reachable).
func (o *Log) Failures() (requests, ticks int) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if !o.down {
		return 0, 0
	}
	return o.requests, o.ticks
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
		"failed_requests", o.requests, "failed_background_ticks", o.ticks)
	o.down = false
}
