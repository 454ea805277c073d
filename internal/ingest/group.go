package ingest

import (
	"context"
	"errors"
	"fmt"
	"runtime/debug"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/buzzrelay/buzz/internal/db"
	"github.com/buzzrelay/buzz/internal/eventstore"
)

// Group commit. PostgreSQL spends most of a single-row autocommit INSERT on
// the transaction around it (and the WAL flush at its commit), so the
// pipeline commits concurrent events together: writers take whatever is
// queued (never waiting for a group to fill), run each event inside the
// group's transaction under its own savepoint, commit once, and only then
// hand every event its outcome. An event whose savepoint was rolled back
// gets its own refusal and nothing else; the others do not notice.

// Defaults for the group writer (the relay's configuration sets them).
const (
	DefaultGroupMax         = 32
	DefaultGroupWriters     = 2
	DefaultGroupQueue       = 1024
	DefaultGroupLockTimeout = 250 * time.Millisecond
)

// groupJob is one event waiting for, or written by, a group.
type groupJob struct {
	ctx      context.Context
	w        *Write
	h        Handler
	sideRows []SideRows
	// fast: no Prepare, Apply or side rows, the INSERT is all of it.
	fast bool

	// Set by the writer before done is closed.
	inserted int64
	err      error // the event's own refusal or failure
	// alone: the group could not settle the event (lock timeout, deadlock,
	// serialization failure, or the group failed as a whole); it must run
	// in its own transaction. Nothing of it committed.
	alone bool
	done  chan struct{}
}

// reset forgets what an attempt that rolled back left on the Write, so a
// rolled-back attempt's relay-signed events and after-commit steps never run.
func (j *groupJob) reset() {
	w := j.w
	w.Q, w.ChannelID, w.state, w.reply = nil, nil, nil, ""
	w.emitted, w.afterCommit, w.membershipChanged = nil, nil, false
	j.inserted, j.err = 0, nil
}

// groupWriter gathers queued events into groups and commits them.
type groupWriter struct {
	p           *Pipeline
	queue       chan *groupJob
	max         int
	writers     int
	lockTimeout time.Duration
	start       sync.Once
}

func newGroupWriter(p *Pipeline, opts Options) *groupWriter {
	if opts.GroupMax == 1 {
		return nil // every event in its own transaction
	}
	if opts.GroupMax <= 0 {
		opts.GroupMax = DefaultGroupMax
	}
	if opts.GroupWriters <= 0 {
		opts.GroupWriters = DefaultGroupWriters
	}
	if opts.GroupQueue <= 0 {
		opts.GroupQueue = DefaultGroupQueue
	}
	if opts.GroupLockTimeout <= 0 {
		opts.GroupLockTimeout = DefaultGroupLockTimeout
	}
	return &groupWriter{
		p: p, queue: make(chan *groupJob, opts.GroupQueue),
		max: opts.GroupMax, writers: opts.GroupWriters, lockTimeout: opts.GroupLockTimeout,
	}
}

// submit queues j and waits until the group holding it is over (committed
// or rolled back). It does not give up when the caller's context ends: the
// answer must say what happened to the event.
func (g *groupWriter) submit(j *groupJob) error {
	g.start.Do(func() {
		for range g.writers {
			go g.run()
		}
	})
	j.done = make(chan struct{})
	select {
	case g.queue <- j:
	default:
		return Reject("rate-limited", "the relay is storing as many events as it can; send it again shortly")
	}
	<-j.done
	return nil
}

// run takes whatever is queued, up to max events, as one group: a lone
// event is written at once, and while one group commits the next gathers.
// Writers live as long as the process (they hold no connection while idle).
func (g *groupWriter) run() {
	group := make([]*groupJob, 0, g.max)
	for {
		group = append(group[:0], <-g.queue)
	gather:
		for len(group) < g.max {
			select {
			case j := <-g.queue:
				group = append(group, j)
			default:
				break gather
			}
		}
		g.commit(group)
		for _, j := range group {
			close(j.done)
		}
	}
}

// commit writes group in one transaction. If the group fails as a whole
// (BEGIN, a savepoint command or COMMIT fails: a lost connection, say),
// nothing of it committed and every event runs alone instead.
//
// A lost connection during COMMIT leaves it unknown whether the group
// committed; running alone then answers an event that did commit as a
// duplicate (it is stored), never as stored twice nor as lost.
func (g *groupWriter) commit(group []*groupJob) {
	ctx := context.Background()
	commit := g.commitGroup
	if allPlain(group) {
		commit = g.commitPlain
	}
	if err := commit(ctx, group); err != nil {
		for _, j := range group {
			j.reset()
			j.alone = true
		}
	}
}

func allPlain(group []*groupJob) bool {
	for _, j := range group {
		if !j.fast {
			return false
		}
	}
	return true
}

// commitPlain writes a group of plain events (the INSERT is all of each,
// the common case: notes without channel or mentions) in one round trip: a
// pipeline of inserts with one Sync, which PostgreSQL runs as one implicit
// transaction. If any insert fails, none of them committed, and the caller
// runs each event alone, so only the failing one is refused.
func (g *groupWriter) commitPlain(ctx context.Context, group []*groupJob) error {
	var b pgx.Batch
	b.Queue("SELECT set_config('lock_timeout', $1, true)", g.lockTimeoutSetting())
	queued := queueInserts(&b, group)
	if len(queued) == 0 {
		return nil
	}
	results := g.p.pool.SendBatch(ctx, &b)
	_, err := results.Exec()
	for _, j := range queued {
		if err != nil {
			break
		}
		var tag pgconn.CommandTag
		tag, err = results.Exec()
		j.inserted = tag.RowsAffected()
	}
	if closeErr := results.Close(); err == nil {
		err = closeErr
	}
	return err
}

// queueInserts queues the INSERT of every plain event in jobs that passes
// its checks (the others get their refusal in err) and returns the queued
// ones, in batch order.
func queueInserts(b *pgx.Batch, jobs []*groupJob) []*groupJob {
	queued := make([]*groupJob, 0, len(jobs))
	for _, j := range jobs {
		if j.err = checkChannelTags(j.w); j.err != nil {
			continue
		}
		params, err := eventstore.InsertParams(j.w.Tenant.ID(), j.w.Event, j.w.ChannelID)
		if err != nil {
			j.err = err
			continue
		}
		db.QueueEventInsert(b, params)
		queued = append(queued, j)
	}
	return queued
}

func (g *groupWriter) lockTimeoutSetting() string {
	return fmt.Sprintf("%dms", g.lockTimeout.Milliseconds())
}

func (g *groupWriter) commitGroup(ctx context.Context, group []*groupJob) error {
	tx, err := g.p.pool.Begin(ctx)
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback(ctx) }()
	// A group must not stall behind one event's lock wait (a row another
	// process holds): that event gives up its savepoint and runs alone.
	if _, err := tx.Exec(ctx, "SELECT set_config('lock_timeout', $1, true)", g.lockTimeoutSetting()); err != nil {
		return err
	}
	for i := 0; i < len(group); {
		if !group[i].fast {
			if err := g.one(ctx, tx, group[i]); err != nil {
				return err
			}
			i++
			continue
		}
		end := i + 1
		for end < len(group) && group[end].fast {
			end++
		}
		if err := g.inserts(ctx, tx, group[i:end]); err != nil {
			return err
		}
		i = end
	}
	return tx.Commit(ctx)
}

// inserts writes a run of plain events (the INSERT is all of each) in one
// round trip under one savepoint. If any fails, the savepoint is rolled back
// and each runs under its own, so that only the failing one is refused.
func (g *groupWriter) inserts(ctx context.Context, tx pgx.Tx, run []*groupJob) error {
	var b pgx.Batch
	b.Queue("SAVEPOINT buzz_run")
	queued := queueInserts(&b, run)
	b.Queue("RELEASE SAVEPOINT buzz_run")
	results := tx.SendBatch(ctx, &b)
	_, err := results.Exec()
	if err != nil {
		_ = results.Close()
		return err
	}
	var failed error
	for _, j := range queued {
		tag, err := results.Exec()
		if err != nil {
			failed = err
			break
		}
		j.inserted = tag.RowsAffected()
	}
	if failed == nil {
		_, failed = results.Exec() // RELEASE
	}
	if err := results.Close(); failed == nil && err != nil {
		failed = err
	}
	if failed == nil {
		return nil
	}
	if !statementFailed(failed) {
		return failed
	}
	if _, err := tx.Exec(ctx, "ROLLBACK TO SAVEPOINT buzz_run"); err != nil {
		return err
	}
	for _, j := range queued {
		j.inserted = 0
		if err := g.one(ctx, tx, j); err != nil {
			return err
		}
	}
	return nil
}

// one writes a single event of the group under its own savepoint. The
// event's own refusal rolls back the savepoint, and with it every row and
// lock the event took; a lock timeout, deadlock or serialization failure
// marks it to run alone after the group. Only a failure of the savepoint
// commands themselves (the group is lost) is returned.
func (g *groupWriter) one(ctx context.Context, tx pgx.Tx, j *groupJob) error {
	if _, err := tx.Exec(ctx, "SAVEPOINT buzz_event"); err != nil {
		return err
	}
	inserted, err := g.writeBody(context.WithoutCancel(j.ctx), db.New(tx), j)
	if err == nil {
		j.inserted = inserted
		_, err := tx.Exec(ctx, "RELEASE SAVEPOINT buzz_event")
		return err
	}
	// The refusal (or failure) is the event's own as long as the
	// transaction survives it; if even the rollback fails, the group is lost.
	if _, rbErr := tx.Exec(ctx, "ROLLBACK TO SAVEPOINT buzz_event"); rbErr != nil {
		return rbErr
	}
	j.reset()
	if retryAlone(err) {
		j.alone = true
	} else {
		j.err = err
	}
	return nil
}

// writeBody runs the event's handlers and side rows. A panic in one becomes
// that event's failure: on a connection's own goroutine net/http contained
// it, and a writer goroutine must not take the process (and every other
// event of the group) down with it.
func (g *groupWriter) writeBody(ctx context.Context, q *db.Queries, j *groupJob) (inserted int64, err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("ingest: kind %d handler panicked: %v\n%s", j.w.Event.Kind, r, debug.Stack())
		}
	}()
	return g.p.writeBody(ctx, q, j)
}

// statementFailed reports whether err is the server refusing a statement
// (the transaction lives on once the savepoint is rolled back), rather
// than a lost connection or a client-side failure.
func statementFailed(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr)
}

// retryAlone reports the failures that say nothing about the event itself,
// only about its company: a lock wait cut short, a deadlock with another
// group, a serialization failure.
func retryAlone(err error) bool {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) {
		return false
	}
	switch pgErr.Code {
	case "55P03", "40P01", "40001":
		return true
	}
	return false
}
