package replica

import (
	"context"
	"errors"
	"log/slog"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/buzzrelay/buzz/internal/db"
	"github.com/buzzrelay/buzz/internal/pgsession"
	"github.com/buzzrelay/buzz/internal/pguuid"
)

// DefaultAcquireTimeout is the one budget a routed read spends getting a
// proved reader transaction (connection, BEGIN and the proof together)
// before it falls back to the writer.
const DefaultAcquireTimeout = 150 * time.Millisecond

// Route decisions and reasons: the labels of buzz_db_route_decision.
const (
	DecisionReplica = "replica"
	DecisionWriter  = "writer"

	ReasonDisabled        = "disabled"      // no reader, the predicate is off (budget 0), or the reader is not a standby
	ReasonUninitialized   = "uninitialized" // no probe token younger than Staleness, or the reader not yet known to be a standby
	ReasonStale           = "stale"         // the proved token is too old for this read
	ReasonLive            = "live"          // a REQ that carries on live and is not covered
	ReasonAcquireTimeout  = "reader_acquire_timeout"
	ReasonUnreachable     = "reader_unreachable" // the last reader check had no answer: no budget spent
	ReasonValidationError = "reader_validation_error"
	ReasonTokenBehind     = "reader_token_behind"
	ReasonReplicaError    = "replica_error" // the reader failed mid-read; the writer answered
	ReasonCovered         = "covered"
	ReasonFresh           = "fresh"
)

// Predicate is what a read needs proved before a reader may serve it.
type Predicate struct {
	covered bool
	upper   time.Time
	bounded bool
	after   time.Time // the proved token must have been written after it (LastRemoval)
}

// After also asks that the proved token was written after t (the
// router's clock): a reader holding it has replayed every write that
// committed before t, a removal of rows included.
func (p Predicate) After(t time.Time) Predicate {
	p.after = t
	return p
}

// Bounded asks that the proved token be at most the read-max-age old
// (fresh). Sound for any read; off while the budget is zero.
func Bounded() Predicate { return Predicate{bounded: true} }

// Covered asks that every channel row dated at or before upper be in the
// reader's snapshot. Sound only for statements that can return nothing
// but channel rows (the caller holds the proof of that).
func Covered(upper time.Time) Predicate { return Predicate{covered: true, upper: upper} }

// CoveredOrBounded tries Covered first, then Bounded.
func CoveredOrBounded(upper time.Time) Predicate {
	return Predicate{covered: true, upper: upper, bounded: true}
}

// Observer is told each routed read's one decision.
type Observer func(path, decision, reason string)

// Router hands out proved reader transactions. A nil *Router routes
// nothing and records nothing: every read goes to the writer.
type Router struct {
	reader         *pgxpool.Pool // nil: no reader configured
	ring           *Ring
	maxAge         time.Duration // the fresh budget; 0 turns Bounded off
	acquireTimeout time.Duration
	statement      time.Duration // 0: a reader statement is bounded by its caller only
	now            func() time.Time
	log            *slog.Logger
	observe        Observer
	requireStandby bool
	standby        atomic.Int32 // standbyUnknown, standbyYes, standbyNo, standbyDown
	removals       removals
}

// What the router was last told of the reader (SetStandby, SetUnreachable).
const (
	standbyUnknown int32 = iota
	standbyYes
	standbyNo
	standbyDown // SetUnreachable
)

// RouterOptions configure a Router.
type RouterOptions struct {
	MaxAge         time.Duration // 0: Bounded never routes
	AcquireTimeout time.Duration // 0: DefaultAcquireTimeout
	Now            func() time.Time
	Log            *slog.Logger
	Observe        Observer
	// StatementTimeout bounds each statement on a reader transaction from
	// the relay's side too (the reader sessions' statement_timeout): a
	// standby that froze mid-statement enforces nothing, and the read would
	// otherwise wait out the caller's whole budget before the writer
	// answers. 0: the caller's deadline only.
	StatementTimeout time.Duration
	// RequireStandby: route only once SetStandby said the reader is a
	// server in recovery, and not while it says it is not. A reader URL
	// naming the writer (a common slip) or a standby since promoted would
	// otherwise take reads off the writer's read slots onto a second pool
	// of writer connections, and a promoted standby, no longer replaying,
	// would serve its frozen rows until its tokens age out.
	RequireStandby bool
}

// NewRouter routes to reader (nil: no reader) by the tokens in ring.
func NewRouter(reader *pgxpool.Pool, ring *Ring, o RouterOptions) *Router {
	if o.AcquireTimeout <= 0 {
		o.AcquireTimeout = DefaultAcquireTimeout
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
	if o.Observe == nil {
		o.Observe = func(string, string, string) {}
	}
	return &Router{reader: reader, ring: ring, maxAge: o.MaxAge, acquireTimeout: o.AcquireTimeout, statement: o.StatementTimeout,
		now: o.Now, log: o.Log, observe: o.Observe, requireStandby: o.RequireStandby}
}

// SetUnreachable records that the reader did not answer a check (the
// relay's reader watcher): until SetStandby, a read that RequireStandby
// would route goes to the writer at once (writer/reader_unreachable)
// rather than spend an acquire budget on a standby known to be down.
func (r *Router) SetUnreachable() {
	if r != nil {
		r.standby.Store(standbyDown)
	}
}

// SetStandby records whether the reader is a server in recovery
// (pg_is_in_recovery()); see RouterOptions.RequireStandby.
func (r *Router) SetStandby(inRecovery bool) {
	if r == nil {
		return
	}
	if inRecovery {
		r.standby.Store(standbyYes)
	} else {
		r.standby.Store(standbyNo)
	}
}

// Enabled reports whether a reader is configured.
func (r *Router) Enabled() bool { return r != nil && r.reader != nil }

// Session is one routed read on proved reader transactions. Each
// statement of the read runs on a reader transaction whose first statement
// proved it; between two statements the session may be parked (Park):
// its transaction ends and its connection goes back to the pool while the
// caller sends what it read to a client that may be slow, and the next
// statement proves a new snapshot first (Holds).
type Session struct {
	router *Router
	conn   *pgxpool.Conn // nil while parked
	tx     pgx.Tx
	path   string
	pred   Predicate
	reason string
	Proved Entry
	done   bool
}

// Tx is the reader transaction.
func (s *Session) Tx() pgx.Tx { return s.tx }

// statementMargin lets the reader's own statement_timeout, equal to
// RouterOptions.StatementTimeout, end a slow statement first: the server
// cancels it cleanly and the connection stays usable, where the relay's
// bound, cancelling from this side, costs the connection. The relay's
// bound is for a reader that answers nothing at all.
const statementMargin = 250 * time.Millisecond

// StatementContext bounds one statement on Tx by RouterOptions.StatementTimeout
// (plus statementMargin).
func (s *Session) StatementContext(ctx context.Context) (context.Context, context.CancelFunc) {
	if s.router.statement <= 0 {
		return ctx, func() {}
	}
	return context.WithTimeout(ctx, s.router.statement+statementMargin)
}

// Served records replica/<reason> once the read was answered from the
// reader, and ends the session.
func (s *Session) Served() {
	if s.done {
		return
	}
	s.router.observe(s.path, DecisionReplica, s.reason)
	s.close()
}

// Failed records writer/replica_error: the reader failed mid-read and the
// caller answers from the writer instead. It ends the session.
func (s *Session) Failed(err error) {
	if s.done {
		return
	}
	s.router.log.Warn("routed read failed on the reader; the writer answers", "path", s.path, "err", err)
	s.router.observe(s.path, DecisionWriter, ReasonReplicaError)
	s.close()
}

// Park ends the reader transaction and returns its connection to the pool
// until the read's next statement (Holds proves a new snapshot then).
// Call it before handing rows to a client: a slow client draining a long
// read must not hold a reader connection, nor a standby snapshot that
// holds replay back, for as long as it takes.
func (s *Session) Park() {
	if !s.done {
		s.release()
	}
}

// Holds reports whether a proof answers the read's next statement now:
// a parked session first proves a new reader snapshot (within one
// AcquireTimeout), then the predicate is checked again against the proved
// entry. Covered proves insertions only, so without this a row deleted
// after the proof could be served long past Staleness (and a fresh read
// long past the fresh budget). Every proved snapshot holds the rows the
// predicate asks for, so a read whose pages come from several snapshots
// (or partly from the writer) misses none of them. When no proof holds the
// session records writer/<reason> and ends; the caller finishes the read
// on the writer.
func (s *Session) Holds(ctx context.Context) bool {
	if s.done {
		return false
	}
	if s.conn == nil {
		if ctx.Err() != nil {
			s.close() // the caller went away: nothing to record
			return false
		}
		next, reason := s.router.prove(ctx, s.path)
		if next == nil {
			s.router.observe(s.path, DecisionWriter, reason)
			s.close()
			return false
		}
		s.conn, s.tx, s.Proved = next.conn, next.tx, next.Proved
	}
	if _, ok := s.router.check(s.pred, s.Proved); ok {
		return true
	}
	s.router.observe(s.path, DecisionWriter, ReasonStale)
	s.close()
	return false
}

// Abandon ends the session without recording anything (the read itself
// failed for a reason of its own, such as the client going away).
func (s *Session) Abandon() { s.close() }

func (s *Session) close() {
	s.done = true
	s.release()
}

// release ends the reader transaction and returns its connection.
func (s *Session) release() {
	if s.conn == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	if err := s.tx.Rollback(ctx); err != nil {
		// A connection whose rollback failed must not go back to the pool.
		_ = s.conn.Conn().Close(ctx)
	}
	s.conn.Release()
	s.conn, s.tx = nil, nil
}

// Writer records writer/<reason> for a read the caller sends to the writer
// without asking (a read shape that is never routed).
func (r *Router) Writer(path, reason string) {
	if r != nil {
		r.observe(path, DecisionWriter, reason)
	}
}

// Begin returns a proved reader session for a read of path that needs
// pred, or nil after recording why the writer must answer. It spends at
// most one AcquireTimeout on the reader.
func (r *Router) Begin(ctx context.Context, path string, pred Predicate) *Session {
	if !r.Enabled() {
		r.Writer(path, ReasonDisabled)
		return nil
	}
	newest, ok := r.ring.Newest(r.now())
	if !ok {
		r.Writer(path, ReasonUninitialized)
		return nil
	}
	// What the reader is comes before what this read needs: a reader that
	// is no standby, or down, is the reason, not a proof too old.
	if reason, ok := r.standbyUsable(); !ok {
		r.Writer(path, reason)
		return nil
	}
	if reason, ok := r.check(pred, newest); !ok {
		r.Writer(path, reason)
		return nil
	}
	s, reason := r.prove(ctx, path)
	if s == nil {
		r.Writer(path, reason)
		return nil
	}
	// The proved entry may be older than the newest: check again.
	s.pred = pred
	if s.reason, ok = r.check(pred, s.Proved); !ok {
		s.close()
		r.Writer(path, s.reason)
		return nil
	}
	r.log.Debug("routed read proved", "path", path, "token", s.Proved.Token, "reason", s.reason)
	return s
}

// check evaluates pred against entry: the replica reason when it holds,
// else the writer reason.
func (r *Router) check(pred Predicate, e Entry) (string, bool) {
	reason, ok := r.checkAge(pred, e)
	if ok && !e.CommittedAt.After(pred.after) {
		return ReasonStale, false // written before a removal the read must not miss
	}
	return reason, ok
}

func (r *Router) checkAge(pred Predicate, e Entry) (string, bool) {
	// Covered proves insertions only: a deletion (an update) committed
	// after the proved token is missing from the reader. Bounding the
	// token's age bounds how long a deleted row can still be served.
	if pred.covered && !pred.upper.After(e.Wall) && r.now().Sub(e.CommittedAt) <= Staleness {
		return ReasonCovered, true
	}
	if pred.bounded {
		if r.maxAge <= 0 {
			if pred.covered {
				return ReasonStale, false
			}
			return ReasonDisabled, false
		}
		if r.now().Sub(e.CommittedAt) <= r.maxAge {
			return ReasonFresh, true
		}
	}
	return ReasonStale, false
}

// prove takes one reader connection, opens the read-only snapshot and
// reads the token it holds, all within one AcquireTimeout.
func (r *Router) prove(ctx context.Context, path string) (*Session, string) {
	if reason, ok := r.standbyUsable(); !ok {
		return nil, reason
	}
	budget, cancel := context.WithTimeout(ctx, r.acquireTimeout)
	defer cancel()
	conn, err := r.reader.Acquire(budget)
	if err != nil {
		// Timeouts and failed dials alike: the reader could not be had in time.
		return nil, ReasonAcquireTimeout
	}
	tx, err := conn.BeginTx(budget, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly})
	if err != nil {
		conn.Release()
		return nil, failureReason(budget, err)
	}
	s := &Session{router: r, conn: conn, tx: tx, path: path}
	row, err := db.New(tx).ReplicaHeartbeatProve(budget)
	if err != nil {
		reason := failureReason(budget, err)
		s.close()
		return nil, reason
	}
	if r.requireStandby && !row.InRecovery {
		// Promoted since the watcher last looked (up to a second ago): it
		// replays nothing now and may hold writes the writer never had.
		r.standby.Store(standbyNo)
		s.close()
		return nil, ReasonDisabled
	}
	entry, err := r.ring.Resolve(row.Token, row.Epoch)
	if err != nil {
		s.close()
		if errors.Is(err, ErrTokenBehind) {
			return nil, ReasonTokenBehind
		}
		return nil, ReasonValidationError
	}
	s.Proved = entry
	r.log.Debug("reader proved", "path", path, "token", row.Token, "backend", row.Backend)
	return s, ""
}

// standbyUsable reports whether the reader may be asked at all, by what
// the watcher last said of it (RouterOptions.RequireStandby), and if not,
// the writer reason.
func (r *Router) standbyUsable() (string, bool) {
	if r.requireStandby {
		switch r.standby.Load() {
		case standbyUnknown:
			return ReasonUninitialized, false // not yet known to be a standby
		case standbyNo:
			return ReasonDisabled, false
		case standbyDown:
			return ReasonUnreachable, false
		}
	}
	return "", true
}

// failureReason names a failed BEGIN or proof statement: the reader
// answered with an error (no heartbeat table, say) is a validation error;
// no answer at all, out of time or over a connection that broke (a standby
// restarted or killed under the pool's idle connections), is a reader that
// could not be had, like a failed dial. So is an error that ended the
// session (FATAL: a standby shut down or restarted cleanly tells each
// idle connection "terminating connection due to administrator command",
// which the next statement reads).
func failureReason(budget context.Context, err error) string {
	var answered *pgconn.PgError
	if budget.Err() != nil || !errors.As(err, &answered) || endsSession(answered) {
		return ReasonAcquireTimeout
	}
	return ReasonValidationError
}

// endsSession reports whether the server ended the connection with err.
func endsSession(err *pgconn.PgError) bool {
	severity := err.SeverityUnlocalized
	if severity == "" {
		severity = err.Severity
	}
	return severity == "FATAL" || severity == "PANIC"
}

// ArmFloor makes every connection of a writer pool check the created_at
// floor (the setting the floor trigger reads).
func ArmFloor(cfg *pgxpool.Config, floor time.Duration) {
	cfg.ConnConfig.RuntimeParams[FloorSetting] = strconv.FormatInt(int64(floor/time.Second), 10)
}

// ReaderPoolConfig configures a pool on the reader: lazy (nothing dials
// until a routed read asks), each statement bounded by statementTimeout
// and a transaction left idle ended after idleInTransaction, so neither a
// blackholed reader nor an abandoned snapshot holds a connection for long.
func ReaderPoolConfig(url string, maxConns int32, statementTimeout, idleInTransaction time.Duration) (*pgxpool.Config, error) {
	cfg, err := pguuid.ParsePoolConfig(url)
	if err != nil {
		return nil, err
	}
	pgsession.Name(&cfg.ConnConfig.Config, pgsession.Reader)
	cfg.MaxConns = maxConns
	cfg.MinConns = 0
	cfg.ConnConfig.RuntimeParams["statement_timeout"] = strconv.FormatInt(statementTimeout.Milliseconds(), 10)
	cfg.ConnConfig.RuntimeParams["idle_in_transaction_session_timeout"] = strconv.FormatInt(idleInTransaction.Milliseconds(), 10)
	return cfg, nil
}
