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
// requests failed after an outage no client saw. A server that refuses
// the relay's login is no outage, but fails every request alike too: its
// lines are bounded (LoginRefusedEvery). A nil *Log reports nothing:
// every failure is left to its caller.
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

	// loginLoggedAt is when a refused login was last logged; loginUnlogged
	// counts the refusals since, not logged one by one.
	loginLoggedAt time.Time
	loginUnlogged int
}

// LoginRefusedEvery is the least time between two lines about the server
// refusing the relay's login: loud enough to be seen at once and kept
// seen while it lasts, but not one ERROR per request, which under load
// is the request rate.
const LoginRefusedEvery = time.Minute

// New returns the log of the database ping reaches, on log; now is the
// process's clock.
func New(log *slog.Logger, ping func(context.Context) error, now func() time.Time) *Log {
	return &Log{log: log, ping: ping, every: time.Second, now: now, done: make(chan struct{})}
}

// Stop ends the pings of an outage in progress (the server is shutting
// down, and its pool with it).
func (o *Log) Stop() { o.once.Do(func() { close(o.done) }) }

// Failed reports whether err, a client request's failure, was logged or
// counted here, the caller to log nothing more: the database being
// unreachable (an outage, logged once) or refusing the relay's login
// (logged at once, then at most once per LoginRefusedEvery while it goes
// on). Any other error is left to the caller to log.
func (o *Log) Failed(err error, what string) bool {
	return o.failed(err, what, func() { o.requests++ })
}

// TickFailed is Failed for a background loop's tick (a scheduler's,
// a poll's, a periodic check's): counted apart from client requests.
func (o *Log) TickFailed(err error, what string) bool {
	return o.failed(err, what, func() { o.ticks++ })
}

func (o *Log) failed(err error, what string, count func()) bool {
	if o == nil {
		return false
	}
	if dberr.IsLoginRefused(err) {
		o.loginRefused(err, what)
		return true
	}
	if !dberr.IsUnreachable(err) {
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

// loginRefused logs a refused login, or counts it when one was logged
// less than LoginRefusedEvery ago. It is a configuration error (the
// database URL's user or password, the server's pg_hba.conf), so no ping
// watches for its end: a line says it goes on, with how many refusals
// were not logged since the one before.
func (o *Log) loginRefused(err error, what string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	now := o.now()
	if !o.loginLoggedAt.IsZero() && now.Sub(o.loginLoggedAt) < LoginRefusedEvery {
		o.loginUnlogged++
		return
	}
	o.log.Error("database refused the relay's login: check the database URL's user and password and the server's pg_hba.conf; requests fail until then",
		"failure", what, "err", err, "not_logged_since_last_line", o.loginUnlogged)
	o.loginLoggedAt, o.loginUnlogged = now, 0
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
