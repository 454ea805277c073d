package replica

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/buzzrelay/buzz/internal/db"
	"github.com/buzzrelay/buzz/internal/dberr"
)

// DefaultProbeInterval is how often the probe writes a token.
const DefaultProbeInterval = 500 * time.Millisecond

// DefaultFloor is the created_at floor the writer sessions are armed with.
// It exceeds how far in the future ingest accepts an event (15 minutes)
// by a minute of slack.
const DefaultFloor = 960 * time.Second

// ClockMargin is subtracted from every wall for clock differences between
// the relay, the writer and the clients' created_at.
const ClockMargin = 5 * time.Second

// FloorSetting is the session setting the created_at floor trigger reads.
const FloorSetting = "buzz.created_at_floor"

// ErrMaskedActivity: the probe's role cannot see every other session's
// transaction start, so it cannot bound what is still in flight. Grant it
// pg_monitor (or pg_read_all_stats).
var ErrMaskedActivity = errors.New("the probe cannot see other sessions' transactions (grant its role pg_read_all_stats or pg_monitor)")

// NameProbeOpenTransactions names the probe's activity scan.
const NameProbeOpenTransactions = "ReplicaProbeOpenTransactions"

// openTransactionsSQL reads the oldest start of any open transaction of
// any other backend in this database (prepared ones included), who holds
// it (for the operator: a transaction left open holds every covered read
// newer than its start on the writer), and how many backends hide theirs.
// Only this database's sessions can write its events, so a busy neighbour
// on the same cluster holds nothing back. Every other backend type counts:
// being conservative only delays the wall. A row the role may not see has no
// backend_type; a backend that tracks no activity (track_activities off)
// shows state 'disabled' and no xact_start. Any other backend without
// xact_start holds no transaction: it is starting up, idle, or busy between
// transactions (its state turns active before its next transaction begins,
// and its start is cleared only after its last commit became visible), and
// a transaction it begins later commits after the probe's sample, where
// the floor guard checks it. An autovacuum worker's transaction is the one
// backend type left out: it stores no events, and a slow vacuum of a large
// events table can stay open for hours, holding every covered read newer
// than its start on the writer.
const openTransactionsSQL = "-- name: " + NameProbeOpenTransactions + `
WITH open AS (
  SELECT xact_start AS started,
         format('pid %s (%s, %s)', pid, coalesce(nullif(application_name, ''), backend_type), usename) AS holder
    FROM pg_stat_activity
   WHERE datname = current_database() AND pid <> pg_backend_pid() AND xact_start IS NOT NULL
     AND backend_type IS DISTINCT FROM 'autovacuum worker'
  UNION ALL
  SELECT prepared, format('prepared transaction %L', gid)
    FROM pg_prepared_xacts WHERE database = current_database()
), oldest AS (
  SELECT started, holder FROM open ORDER BY started LIMIT 1
)
SELECT (SELECT started FROM oldest) AS oldest,
       (SELECT holder FROM oldest) AS holder,
       (SELECT count(*) FROM pg_stat_activity
         WHERE datname = current_database() AND pid <> pg_backend_pid()
           AND (backend_type IS NULL OR state = 'disabled')) AS masked`

// Probe writes heartbeat tokens on the writer and records them in a Ring.
// Run one per relay process, and only when a reader is configured.
type Probe struct {
	pool     *pgxpool.Pool
	ring     *Ring
	floor    time.Duration
	interval time.Duration
	now      func() time.Time
	log      *slog.Logger
	started  bool // a tick has started this process's epoch
	// OnError, when set, is told of each failed tick (after the ring closed),
	// every one of them: the log says less (see FailureReminder).
	OnError func(error)
	// FailureReminder is how often a probe that keeps failing says so again
	// in the log, with how many ticks failed (default DefaultFailureReminder).
	// The first failure and the recovery are always logged; a line per
	// failed tick (twice a second while the writer is down) would bury
	// everything else.
	FailureReminder time.Duration
	failingSince    time.Time // zero while the ticks succeed
	failed          int       // ticks failed since failingSince
	remindedAt      time.Time // the last failure line
	remindedFailed  int       // failed when it was written
	// HoldWarning is how long an open transaction may hold the wall back
	// before the probe names it in the log (default Staleness: longer than
	// any proof lives, so covered reads of its last span go to the writer
	// with nothing else saying why).
	HoldWarning time.Duration
	warned      string // the holder last named, until it lets go
	// TickTimeout bounds each tick (default DefaultTickTimeout). A tick
	// waits on the heartbeat row's lock, which any session may hold (an
	// operator's SELECT ... FOR UPDATE left open, another process's probe on
	// a writer that stalled): unbounded, it waited as long as the lock was
	// held, no failure counted or logged, routing running on its older
	// tokens until they aged out. The writer itself ends that wait (the
	// tick's lock_timeout), so the connection is kept; the relay's own
	// deadline, tickMargin later, covers a writer that does not answer.
	TickTimeout time.Duration
}

// DefaultTickTimeout bounds a probe tick: a tick takes milliseconds, and one
// that takes this long fails, closing routing until a tick succeeds.
const DefaultTickTimeout = 5 * time.Second

// tickMargin lets the writer end a tick's lock wait itself (lock_timeout)
// before the relay's deadline does: cut off by the deadline, the
// connection is closed, and every tick while the row stays locked dialed
// the writer again.
const tickMargin = time.Second

// NewProbe returns a probe writing through pool (the writer). floor is
// the created_at floor the writer sessions are armed with.
func NewProbe(pool *pgxpool.Pool, ring *Ring, floor, interval time.Duration, now func() time.Time, log *slog.Logger) *Probe {
	if interval <= 0 {
		interval = DefaultProbeInterval
	}
	return &Probe{pool: pool, ring: ring, floor: floor, interval: interval, now: now, log: log,
		HoldWarning: Staleness, FailureReminder: DefaultFailureReminder, TickTimeout: DefaultTickTimeout}
}

// DefaultFailureReminder is how often a failing probe logs a reminder.
const DefaultFailureReminder = time.Minute

// Run ticks until ctx ends. A tick that fails closes the ring: reads go to
// the writer until a later tick succeeds.
func (p *Probe) Run(ctx context.Context) {
	t := time.NewTicker(p.interval)
	defer t.Stop()
	for {
		_, _ = p.Tick(ctx) // Tick logs and reports its failures
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// Tick writes one token and records it. In one transaction, each statement
// awaited before the next (their order is the proof): the writer's clock S,
// then the open transactions, then the token. Not safe for concurrent use.
//
// The first successful tick of a process starts a new epoch: the process
// cannot know which timeline the writer was on before it started (a
// restore while no probe ran would otherwise go unnoticed, and a standby
// frozen on the old timeline, its token ahead, would prove reads).
//
// A failed tick is told to OnError; the log gets the first failure, a
// reminder at most every FailureReminder, and the recovery. A tick cut off
// by ctx (the process stopping) is neither; one that outlasts TickTimeout
// fails.
func (p *Probe) Tick(ctx context.Context) (Entry, error) {
	bounded, cancel := context.WithTimeout(ctx, p.TickTimeout+tickMargin)
	e, err := p.tickAndRecord(bounded)
	timedOut := bounded.Err() != nil
	cancel()
	if err != nil && ctx.Err() == nil {
		switch {
		case dberr.IsLockTimeout(err):
			err = fmt.Errorf("the replica_heartbeat row was locked by another session for over %s: %w", p.TickTimeout, err)
		case timedOut:
			err = fmt.Errorf("the tick took over %s (the writer not answering, or no writer connection free): %w", p.TickTimeout+tickMargin, err)
		}
	}
	if err != nil {
		if ctx.Err() == nil {
			p.noteFailure(err)
		}
		return e, err
	}
	p.noteSuccess()
	return e, nil
}

func (p *Probe) tickAndRecord(ctx context.Context) (Entry, error) {
	e, err := p.tick(ctx)
	if err != nil {
		p.ring.Clear()
		return Entry{}, err
	}
	if p.started && p.ring.Record(e) {
		return e, nil
	}
	rotated, err := db.New(p.pool).ReplicaHeartbeatRotateEpoch(ctx)
	if err != nil {
		return Entry{}, fmt.Errorf("rotate the replica epoch: %w", err)
	}
	e.Token, e.Epoch = rotated.Token, rotated.Epoch
	p.ring.Adopt(e)
	if p.started {
		// The token went backwards within the epoch: the writer's data is
		// not the timeline the readers were proved against.
		p.log.Warn("replica heartbeat token went backwards; rotated the epoch", "epoch", e.Epoch, "token", e.Token)
	} else {
		p.started = true
		p.log.Info("replica heartbeat probe started a new epoch", "epoch", e.Epoch, "token", e.Token)
	}
	return e, nil
}

func (p *Probe) tick(ctx context.Context) (Entry, error) {
	var e Entry
	var held time.Duration
	var holder *string
	err := pgx.BeginFunc(ctx, p.pool, func(tx pgx.Tx) error {
		var sampled time.Time
		lockTimeout := strconv.FormatInt(p.TickTimeout.Milliseconds(), 10)
		if err := tx.QueryRow(ctx, "-- name: ReplicaProbeClock\nSELECT clock_timestamp(), set_config('lock_timeout', $1, true)", lockTimeout).Scan(&sampled, nil); err != nil {
			return err
		}
		var oldest *time.Time
		var masked int64
		if err := tx.QueryRow(ctx, openTransactionsSQL).Scan(&oldest, &holder, &masked); err != nil {
			return err
		}
		if masked > 0 {
			return fmt.Errorf("%w: %d sessions", ErrMaskedActivity, masked)
		}
		bound := sampled
		if oldest != nil && oldest.Before(bound) {
			bound = *oldest
			held = sampled.Sub(bound)
		}
		e.Wall = bound.Add(-p.floor - ClockMargin)
		e.CommittedAt = p.now()
		row, err := db.New(tx).ReplicaHeartbeatAdvance(ctx)
		if err != nil {
			return err
		}
		e.Token, e.Epoch = row.Token, row.Epoch
		return nil
	})
	if errors.Is(err, pgx.ErrNoRows) {
		return Entry{}, errors.New("replica_heartbeat has no row 1 (run the migrations)")
	}
	if err == nil {
		p.noteHolder(held, holder)
	}
	return e, err
}

// noteFailure logs the first failed tick, then a reminder with the count
// at most every FailureReminder.
func (p *Probe) noteFailure(err error) {
	if p.OnError != nil {
		p.OnError(err)
	}
	now := p.now()
	p.failed++
	if p.failingSince.IsZero() {
		p.failingSince, p.remindedAt, p.remindedFailed = now, now, p.failed
		p.log.Warn("replica heartbeat probe failed; reads go to the writer until it succeeds", "err", err)
		return
	}
	if now.Sub(p.remindedAt) < p.FailureReminder {
		return
	}
	p.log.Warn("replica heartbeat probe still failing; reads go to the writer", "err", err,
		"failing_for", now.Sub(p.failingSince).Round(time.Second),
		"failed_ticks", p.failed, "failed_since_last_log", p.failed-p.remindedFailed)
	p.remindedAt, p.remindedFailed = now, p.failed
}

// noteSuccess logs the recovery of a failing probe.
func (p *Probe) noteSuccess() {
	if p.failingSince.IsZero() {
		return
	}
	p.log.Info("replica heartbeat probe recovered; reads may route to the reader again",
		"failed_for", p.now().Sub(p.failingSince).Round(time.Millisecond), "failed_ticks", p.failed)
	p.failingSince, p.failed = time.Time{}, 0
}

// noteHolder names, once, the open transaction that holds the wall back
// longer than HoldWarning, and says when it let go.
func (p *Probe) noteHolder(held time.Duration, holder *string) {
	name := ""
	if holder != nil && held > p.HoldWarning {
		name = *holder
	}
	switch {
	case name == p.warned:
	case name != "":
		p.log.Warn("an open transaction on the writer holds the replica wall back; covered reads newer than its start go to the writer until it ends",
			"holder", name, "open_for", held.Round(time.Second))
	default:
		p.log.Info("the transaction holding the replica wall back has ended", "holder", p.warned)
	}
	p.warned = name
}
