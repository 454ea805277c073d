// Package clock is the relay's one time source. The server builds one Clock
// and hands it to every service (ingest, the access cache, the outbox
// worker, deliverer and reapers); none of them calls time.Now for a decision
// of its own, so a test that stubs the clock drives every deadline, lease
// and cutoff.
//
// Queries take the time as a nullable now parameter
// (coalesce(sqlc.narg('now')::timestamptz, now())). On the wall clock the
// parameter is NULL and PostgreSQL's own now() decides, so every relay pod
// agrees on one clock (the database's) whatever its own skew; a stubbed
// clock passes its time, and the database follows the test. A NIP-40
// expiration test is the exception: a read's binds the relay's own time,
// since a standby, whose clock is not the writer's, may answer it, and so
// does a write's that names an event (a reaction's target, a reply's
// parent), so that it finds what a read serves (docs/storage.md).
package clock

import "time"

// Clock tells the time. The zero value is the wall clock.
type Clock struct {
	stub func() time.Time
}

// Wall is the real clock.
func Wall() Clock { return Clock{} }

// Stub returns a clock that reads now: tests move time by changing what now
// returns.
func Stub(now func() time.Time) Clock { return Clock{stub: now} }

// Now is the current time.
func (c Clock) Now() time.Time {
	if c.stub != nil {
		return c.stub()
	}
	return time.Now()
}

// SQL is the now parameter for a query: NULL on the wall clock (the
// database's now() decides), the stubbed time otherwise.
func (c Clock) SQL() *time.Time {
	if c.stub == nil {
		return nil
	}
	t := c.stub()
	return &t
}
