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
// pipeline commits concurrent events together: a group takes whatever is
// waiting (never waiting for a group to fill), runs each event inside the
// group's transaction under its own savepoint, commits once, and only then
// hands every event its outcome. An event whose savepoint was rolled back
// gets its own refusal and nothing else; the others do not notice.
//
// A lone event is written on its submitter's own goroutine: an event that
// finds no group being written writes its group at once, with no hand-off to
// another goroutine and back. Events that arrive while a group is being
// written wait in a queue. A submitter that has written its group and finds
// events waiting starts a writer goroutine in its place, which writes group
// after group (everything waiting, up to max) for as long as events wait,
// without a wake-up between groups, and then ends.
//
// Another writer (up to `writers`) starts only once a whole group (max
// events) waits, and a writer that finds less than a whole group waiting
// while another is busy ends, leaving it to that one. A second group
// written beside a busy one would split the waiting events between two
// commits, and an event pays PostgreSQL's cost per statement and per commit
// more than it waits for the flush.

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
	// locksChannelRow: the event locks its channel's row (a membership or
	// metadata change, a workflow save), so it is a group of its own (see
	// takeLocked).
	locksChannelRow bool

	// Set by the writer before wake is closed (or, for the writer's own
	// event, before write returns).
	inserted int64
	err      error // the event's own refusal or failure
	// alone: the group could not settle the event (lock timeout, deadlock,
	// serialization failure, or the group failed as a whole); it must run
	// in its own transaction. Nothing of it committed.
	alone bool
	// line and turn: the change's place in its channel's line of changes
	// that run alone (turn nil: not in one; see changeLines).
	line changeLineKey
	turn chan struct{}

	// wake is closed when the waiting event's group is over.
	wake chan struct{}
	// queued is when the event began to wait for a writer (zero for an
	// event its submitter wrote at once).
	queued time.Time
	// arrived is when the pipeline took the event: a change that runs in
	// its channel's line waited from then to its turn.
	arrived time.Time
}

// reset forgets what an attempt that rolled back left on the Write, so a
// rolled-back attempt's relay-signed events and after-commit steps never run,
// after running its rollback steps.
func (j *groupJob) reset() {
	w := j.w
	w.rolledBack()
	w.Q, w.ChannelID, w.state, w.reply = nil, nil, nil, ""
	w.emitted, w.afterCommit, w.membershipChanged, w.readersVersions = nil, nil, false, nil
	j.inserted, j.err = 0, nil
}

// GroupStats describes one group a writer took, or one event written alone
// (a group of one), for metrics.
type GroupStats struct {
	// Events is how many events the group settled: stored, duplicate or
	// refused in its transaction. Events it handed on to run alone are not
	// counted (each is observed again, as a group of one), so a group that
	// failed as a whole settled none.
	Events int
	// Waited is how long the group's oldest event waited for a writer
	// (zero for an event its submitter wrote at once); for a change run
	// in its channel's line, from its arrival to its turn.
	Waited time.Duration
	// Took is the time from taking the group to its commit or failure.
	Took time.Duration
	// Failed: the group failed as a whole (nothing of it committed) and
	// each of its events runs in its own transaction.
	Failed bool
}

// groupWriter gathers concurrent events into groups and commits them.
type groupWriter struct {
	p           *Pipeline
	max         int
	writers     int
	queueCap    int
	lockTimeout time.Duration

	mu      sync.Mutex
	waiting []*groupJob // in arrival order; non-empty only while a writer is busy
	writing int         // groups being written now, at most writers
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
		// A group is taken from the queue, so it is never larger than the
		// queue; a whole group (which starts a second writer) is then a
		// full queue.
		p: p, max: min(opts.GroupMax, opts.GroupQueue), writers: opts.GroupWriters, queueCap: opts.GroupQueue,
		lockTimeout: opts.GroupLockTimeout,
	}
}

// submit writes j's group, or queues j and waits until the group holding
// it is over (committed or rolled back). It does not give up when the
// caller's context ends: the answer must say what happened to the event.
func (g *groupWriter) submit(j *groupJob) error {
	g.mu.Lock()
	if g.writing == 0 {
		// Nothing is being written, so nothing waits (a writer takes the
		// waiting events before it frees itself): j is a group of one,
		// written now.
		g.writing++
		g.mu.Unlock()
		// Deferred so that a panic out of write (a panicking OnGroup) still
		// frees this writer or hands what waits to another: otherwise the
		// events queued behind it would wait for a writer that never comes.
		defer func() {
			if next := g.next(); next != nil {
				go g.drain(next)
			}
		}()
		g.write([]*groupJob{j})
		return nil
	}
	if len(g.waiting) >= g.queueCap {
		g.mu.Unlock()
		return Reject("rate-limited", "the relay is storing as many events as it can; send it again shortly")
	}
	j.wake = make(chan struct{})
	j.queued = time.Now()
	g.waiting = append(g.waiting, j)
	var extra []*groupJob
	if len(g.waiting) >= g.max && g.writing < g.writers {
		// A whole group waits, more than a busy writer's next group
		// takes: it starts now instead of waiting a group longer.
		g.writing++
		extra = g.takeLocked()
	}
	g.mu.Unlock()
	if extra != nil {
		go g.drain(extra)
	}
	<-j.wake
	return nil
}

// drain writes group, then every group that has gathered meanwhile, for as
// long as events wait, and wakes each group's events after its commit.
func (g *groupWriter) drain(group []*groupJob) {
	for ; group != nil; group = g.next() {
		g.write(group)
		for _, j := range group {
			close(j.wake)
		}
	}
}

// write commits group, then announces its membership changes. The
// announcement runs outside writeGroup's recover: a panic there must not
// send events that did commit to run again alone.
//
// A change (a group of its own) that the group could not settle joins its
// channel's line of changes that run alone; one whose channel has changes
// in that line already joins it without trying its group: it would wait
// for the same row, and pass the changes that arrived before it if the row
// came free during its short wait.
func (g *groupWriter) write(group []*groupJob) {
	change := group[0]
	if change.locksChannelRow && g.p.changeLines.join(change, true) {
		change.alone = true
		g.p.changeHandedOn()
		return
	}
	if g.writeGroup(group) {
		g.p.announceMembershipChanges(group)
	}
	if change.locksChannelRow && change.alone {
		g.p.changeLines.join(change, false)
		g.p.changeHandedOn()
	}
}

// writeGroup commits group and reports whether it did. If writing panics,
// every event of the group runs alone instead (nothing of it is known to
// have committed), where the panic recurs on its own submitter's goroutine.
func (g *groupWriter) writeGroup(group []*groupJob) (committed bool) {
	start := time.Now()
	var stats GroupStats
	if first := group[0]; !first.queued.IsZero() {
		stats.Waited = start.Sub(first.queued) // the group is in arrival order
	}
	defer func() {
		if r := recover(); r != nil {
			for _, j := range group {
				j.reset()
				j.alone = true
			}
			stats.Failed = true
		}
		stats.Took = time.Since(start)
		for _, j := range group {
			if !j.alone {
				stats.Events++
			}
		}
		if g.p.OnGroup != nil {
			g.p.OnGroup(stats)
		}
	}()
	stats.Failed = !g.commit(group)
	return !stats.Failed
}

// next takes everything waiting (up to max) as the next group for the
// calling writer, or frees the writer (nil) when nothing waits, or when less
// than a whole group waits and another writer is busy: that one takes it
// next, as one group rather than two.
func (g *groupWriter) next() []*groupJob {
	g.mu.Lock()
	defer g.mu.Unlock()
	if len(g.waiting) == 0 || g.writing > 1 && len(g.waiting) < g.max {
		g.writing--
		return nil
	}
	return g.takeLocked()
}

// takeLocked takes the oldest waiting events, up to max, as a group. g.mu
// is held. An event that changes its channel's membership or metadata is a
// group of its own: a group holds the channel's write lock shared for the
// messages it checked, and two groups each holding it and then asking it
// exclusive for a change would wait on each other until the lock timeout.
// The events after a change wait for the next group, so arrival order is
// kept while the change is written in its group; one handed on to run
// alone (its lock wait outlasted channelRowLockTimeout) commits beside the
// groups after it, in whatever order the locks allow.
func (g *groupWriter) takeLocked() []*groupJob {
	n := 1
	if !g.waiting[0].locksChannelRow {
		for n < min(len(g.waiting), g.max) && !g.waiting[n].locksChannelRow {
			n++
		}
	}
	group := make([]*groupJob, n)
	copy(group, g.waiting)
	rest := copy(g.waiting, g.waiting[n:])
	clear(g.waiting[rest:])
	g.waiting = g.waiting[:rest]
	return group
}

// waitingEvents is how many events wait for a writer.
func (g *groupWriter) waitingEvents() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return len(g.waiting)
}

// commit writes group in one transaction. If the group fails as a whole
// (BEGIN, a savepoint command or COMMIT fails: a lost connection, say),
// nothing of it committed and every event runs alone instead.
//
// A lost connection during COMMIT leaves it unknown whether the group
// committed; running alone then answers an event that did commit as a
// duplicate (it is stored), never as stored twice nor as lost.
//
// It reports whether the group settled its events (false: they run alone).
func (g *groupWriter) commit(group []*groupJob) bool {
	// Bounded: a group stuck on a stalled server would hold up every event
	// queued behind it. Past the bound the group fails whole (its
	// connection is closed) and its events run alone.
	ctx, cancel := context.WithTimeout(context.Background(), g.p.writeTimeout)
	defer cancel()
	var err error
	if allPlain(group) {
		err = g.commitPlain(ctx, group)
		if statementFailed(err) && !retryAlone(err) {
			// One event's refusal failed the group's one statement: write
			// the group again in a transaction with savepoints, where only
			// that event is refused, rather than every event alone.
			for _, j := range group {
				j.reset()
			}
			err = g.commitGroup(ctx, group)
		}
	} else {
		err = g.commitGroup(ctx, group)
	}
	if err != nil {
		for _, j := range group {
			j.reset()
			j.alone = true
		}
		return false
	}
	return true
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
// the common case: notes without channel or mentions) in one round trip and
// one statement: the lock timeout and one multi-row INSERT, pipelined with
// one Sync, which PostgreSQL runs as one implicit transaction. If the
// insert fails, none of the group committed: the caller writes the group
// again under savepoints (see inserts) when an event was refused, else runs
// each event alone (a lock wait, deadlock or serialization failure would
// only recur), so only the failing one is refused.
func (g *groupWriter) commitPlain(ctx context.Context, group []*groupJob) error {
	var b pgx.Batch
	b.Queue("SELECT set_config('lock_timeout', $1, true)", g.lockTimeoutSetting(group))
	rows, queued := insertBatch(group)
	if len(queued) == 0 {
		return nil
	}
	rows.Queue(&b)
	results := g.p.pool.SendBatch(ctx, &b)
	_, err := results.Exec()
	if err == nil {
		err = readStored(results, rows, queued)
	}
	if closeErr := results.Close(); err == nil {
		err = closeErr
	}
	return err
}

// insertBatch puts the row of every plain event in jobs that passes its
// checks into one multi-row insert (the others get their refusal in err)
// and returns the jobs it holds, in row order.
func insertBatch(jobs []*groupJob) (*eventstore.InsertBatch, []*groupJob) {
	rows := eventstore.NewInsertBatch(len(jobs))
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
		rows.Add(params)
		queued = append(queued, j)
	}
	return rows, queued
}

// readStored reads the multi-row insert's result into its jobs.
func readStored(results pgx.BatchResults, rows *eventstore.InsertBatch, queued []*groupJob) error {
	stored, err := rows.ReadStored(results)
	if err != nil {
		return err
	}
	for i, j := range queued {
		j.inserted = 0
		if stored[i] {
			j.inserted = 1
		}
	}
	return nil
}

// channelRowLockTimeout bounds how long a group of one event that locks its
// channel's row waits for a lock before the event runs alone. A short wait
// is messages in flight; a long one is a large channel's list fold or
// another change holding the row, and the writer must not stall behind it:
// the events queued after the change wait for this writer.
const channelRowLockTimeout = 20 * time.Millisecond

func (g *groupWriter) lockTimeoutSetting(group []*groupJob) string {
	timeout := g.lockTimeout
	if group[0].locksChannelRow {
		timeout = min(timeout, channelRowLockTimeout)
	}
	return fmt.Sprintf("%dms", timeout.Milliseconds())
}

func (g *groupWriter) commitGroup(ctx context.Context, group []*groupJob) error {
	tx, err := g.p.pool.Begin(ctx)
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback(ctx) }()
	// A group must not stall behind one event's lock wait (a row another
	// process holds): that event gives up its savepoint and runs alone.
	if _, err := tx.Exec(ctx, "SELECT set_config('lock_timeout', $1, true)", g.lockTimeoutSetting(group)); err != nil {
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
// round trip and one statement under one savepoint. If it fails, the
// savepoint is rolled back and each runs under its own, so that only the
// failing one is refused.
func (g *groupWriter) inserts(ctx context.Context, tx pgx.Tx, run []*groupJob) error {
	rows, queued := insertBatch(run)
	if len(queued) == 0 {
		return nil
	}
	var b pgx.Batch
	b.Queue("SAVEPOINT buzz_run")
	rows.Queue(&b)
	b.Queue("RELEASE SAVEPOINT buzz_run")
	results := tx.SendBatch(ctx, &b)
	_, err := results.Exec()
	if err != nil {
		_ = results.Close()
		return err
	}
	failed := readStored(results, rows, queued)
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
	// The client's values without its cancellation (a client gone must
	// not abort its group), under the group's deadline.
	bodyCtx := context.WithoutCancel(j.ctx)
	if deadline, ok := ctx.Deadline(); ok {
		var cancel context.CancelFunc
		bodyCtx, cancel = context.WithDeadline(bodyCtx, deadline)
		defer cancel()
	}
	inserted, err := g.writeBody(bodyCtx, db.New(tx), j)
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
// group, a serialization failure, a deletion's target committed meanwhile
// in another channel.
func retryAlone(err error) bool {
	if errors.Is(err, errDeletionTargetMoved) {
		return true
	}
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
