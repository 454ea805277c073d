package workflow

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/buzzrelay/buzz/internal/clock"
	"github.com/buzzrelay/buzz/internal/db"
	"github.com/buzzrelay/buzz/internal/dberr"
	"github.com/buzzrelay/buzz/internal/ingest"
	"github.com/buzzrelay/buzz/internal/nostr"
	"github.com/buzzrelay/buzz/internal/outage"
	"github.com/buzzrelay/buzz/internal/workflow/mention"
	"github.com/buzzrelay/buzz/internal/workflow/safehttp"
	"github.com/buzzrelay/buzz/internal/workflow/template"
)

// ErrorCode is the stable, machine-readable reason a run failed or was
// cancelled (workflow_runs.error_code). The diagnostic text is separate
// (error_message) and never part of the code.
type ErrorCode string

// Every error code a run can end with. The workflow_runs_error_code_known
// CHECK in the database lists the same set.
const (
	CodeInvalidYAML               ErrorCode = "invalid_yaml"
	CodeInvalidDefinition         ErrorCode = "invalid_definition"
	CodeConditionEvaluationFailed ErrorCode = "condition_evaluation_failed"
	CodeTemplateResolutionFailed  ErrorCode = "template_resolution_failed"
	CodeStepTimeout               ErrorCode = "step_timeout"
	CodeWebhookFailed             ErrorCode = "webhook_failed"
	CodeCapacityExceeded          ErrorCode = "capacity_exceeded"
	CodeDatabaseError             ErrorCode = "database_error"
	CodeOwnerUnauthorized         ErrorCode = "owner_unauthorized"
	CodeActionNotImplemented      ErrorCode = "action_not_implemented"
	CodeApprovalDenied            ErrorCode = "approval_denied"
	CodeApprovalExpired           ErrorCode = "approval_expired"
	CodeWorkflowDisabled          ErrorCode = "workflow_disabled"
	CodeStepAbandoned             ErrorCode = "step_abandoned"
	CodeLegacyUnclassified        ErrorCode = "legacy_unclassified"
)

// AllErrorCodes lists every code, for tests and documentation.
var AllErrorCodes = []ErrorCode{
	CodeInvalidYAML, CodeInvalidDefinition, CodeConditionEvaluationFailed, CodeTemplateResolutionFailed,
	CodeStepTimeout, CodeWebhookFailed, CodeCapacityExceeded, CodeDatabaseError, CodeOwnerUnauthorized,
	CodeActionNotImplemented, CodeApprovalDenied, CodeApprovalExpired, CodeWorkflowDisabled, CodeStepAbandoned, CodeLegacyUnclassified,
}

// runFailure ends a run with a code and a diagnostic.
type runFailure struct {
	code    ErrorCode
	message string
	// cause is the database error behind a database_error, kept so that
	// the step transaction's retry can tell a lost connection or a lost
	// serialization race (dberr.IsTransient) from a lasting failure.
	cause error
}

func (f *runFailure) Error() string { return string(f.code) + ": " + f.message }

func (f *runFailure) Unwrap() error { return f.cause }

// after is f keeping an earlier failure of the same step in its
// diagnostic: the failure that ended the run (its code) came after the one
// that was being recorded (a step that failed, or a call's outcome) and
// could not be, and that one is usually what an operator looks for.
func (f *runFailure) after(earlier string) *runFailure {
	if earlier == "" {
		return f
	}
	out := *f
	out.message = f.message + "; before that: " + earlier
	return &out
}

// MaxErrorMessageBytes bounds a run's recorded diagnostic (error_message
// and its trace entry's error): a failure keeps the one before it, and a
// message may carry a server's or a template's text.
const MaxErrorMessageBytes = 4096

// boundedMessage is msg cut to MaxErrorMessageBytes on a character
// boundary, marked with an ellipsis when cut.
func boundedMessage(msg string) string {
	if len(msg) <= MaxErrorMessageBytes {
		return msg
	}
	end := MaxErrorMessageBytes - len("…")
	for end > 0 && !utf8.RuneStart(msg[end]) {
		end--
	}
	return msg[:end] + "…"
}

func fail(code ErrorCode, format string, args ...any) *runFailure {
	return &runFailure{code: code, message: fmt.Sprintf(format, args...)}
}

// dbFail is a database_error caused by err (its message only is recorded).
func dbFail(err error, format string, args ...any) *runFailure {
	f := fail(CodeDatabaseError, format, args...)
	f.cause = err
	return f
}

// DoorbellMarker is the value of the buzz:workflow tag on every message a
// workflow step sends: it marks a relay-signed doorbell that carries only
// pointers to signed artifacts, and keeps it from triggering workflows.
const DoorbellMarker = "doorbell-v1"

// Claimed is a run this worker holds under ClaimID until its lease ends.
type Claimed struct {
	ClaimID uuid.UUID
	Run     db.WorkflowRunClaimDueRow
}

// Engine claims runs and executes their steps.
type Engine struct {
	pool      *pgxpool.Pool
	pipeline  *ingest.Pipeline
	clock     clock.Clock
	lease     time.Duration
	condition ConditionFunc
	log       *slog.Logger
	outage    *outage.Log
	webhooks  *safehttp.Client
	metrics   *Metrics
	// stepTimeout bounds a step without its own timeout_secs.
	stepTimeout time.Duration

	// definitions keeps the definitions parsed from pinned events.
	definitions *definitionCache

	// beforeCommit, when set by tests, runs inside a step's transaction
	// just before it commits.
	beforeCommit func(run uuid.UUID, step int)
}

// EngineOptions are the engine's settings.
type EngineOptions struct {
	// Lease is how long a claim holds a run before another worker may
	// resume it; every finished step renews it.
	Lease     time.Duration
	Clock     clock.Clock
	Condition ConditionFunc
	Log       *slog.Logger
	// Webhooks sends call_webhook requests (nil: the production policy).
	Webhooks *safehttp.Client
	// Metrics records ended runs; may be nil.
	Metrics *Metrics
	// StepTimeout is the deadline of a step whose definition sets no
	// timeout_secs (0: DefaultStepTimeout).
	StepTimeout time.Duration
	// Outage logs a worker poll failed by an unreachable database once
	// per outage, not once per poll (nil: every failure is logged).
	Outage *outage.Log
}

// DefaultLease bounds how long a killed worker's run waits to be resumed.
const DefaultLease = 30 * time.Second

// NewEngine returns an engine that emits relay-signed events through p.
func NewEngine(pool *pgxpool.Pool, p *ingest.Pipeline, opts EngineOptions) *Engine {
	if opts.Lease <= 0 {
		opts.Lease = DefaultLease
	}
	if opts.Condition == nil {
		opts.Condition = EvalCondition
	}
	if opts.Log == nil {
		opts.Log = slog.Default()
	}
	if opts.Webhooks == nil {
		opts.Webhooks = safehttp.New(safehttp.Options{})
	}
	if opts.StepTimeout <= 0 {
		opts.StepTimeout = DefaultStepTimeout
	}
	// A default may not exceed what a definition may ask for.
	opts.StepTimeout = min(opts.StepTimeout, MaxStepTimeoutSecs*time.Second)
	return &Engine{
		pool: pool, pipeline: p, clock: opts.Clock, lease: opts.Lease, condition: opts.Condition, log: opts.Log, outage: opts.Outage,
		webhooks: opts.Webhooks, metrics: opts.Metrics, stepTimeout: opts.StepTimeout,
		definitions: newDefinitionCache(),
	}
}

// ClaimDue claims up to limit due runs (new, delayed and now due, or
// abandoned by a worker whose lease expired).
func (e *Engine) ClaimDue(ctx context.Context, limit int) ([]Claimed, error) {
	return e.claimDue(ctx, limit, claimShares{})
}

// claimShares bounds how many runs one claim may give each community: at
// most share in flight, counting the held ones. share 0: no bound.
type claimShares struct {
	share int
	held  map[uuid.UUID]int
}

// params are the claim statements' community bounds for a claim of up to
// limit runs: the communities already at their share, those holding some
// with the room they have left, and the share itself.
func (s claimShares) params(limit int) (full, busy []uuid.UUID, room []int32, share int32) {
	if s.share <= 0 {
		return nil, nil, nil, int32(limit)
	}
	for c, n := range s.held {
		switch {
		case n >= s.share:
			full = append(full, c)
		case n > 0:
			busy, room = append(busy, c), append(room, int32(s.share-n))
		}
	}
	return full, busy, room, int32(s.share)
}

func (e *Engine) claimDue(ctx context.Context, limit int, shares claimShares) ([]Claimed, error) {
	ctx, cancel := e.claimContext(ctx)
	defer cancel()
	claimID := uuid.New()
	full, busy, room, share := shares.params(limit)
	rows, err := db.New(e.pool).WorkflowRunClaimDue(ctx, db.WorkflowRunClaimDueParams{
		ClaimID: claimID, Now: e.clock.SQL(), LeaseMs: e.lease.Milliseconds(), MaxRows: int32(limit),
		FullCommunities: full, BusyCommunities: busy, BusyRoom: room, CommunityShare: share,
	})
	out := make([]Claimed, len(rows))
	for i, r := range rows {
		out[i] = Claimed{ClaimID: claimID, Run: r}
	}
	return out, err
}

// claimContext bounds a claim by the lease it takes. The worker's loop waits
// for its claims, and a statement on a stalled server (a stopped backend,
// a connection dropped without a word) never returns: unbounded, one such
// claim stopped this process's worker for good. A claim slower than its
// lease would hold nothing usable anyway.
func (e *Engine) claimContext(ctx context.Context) (context.Context, context.CancelFunc) {
	if e.lease <= 0 {
		return context.WithCancel(ctx)
	}
	return context.WithTimeout(ctx, e.lease)
}

// ClaimByID claims those of community's runs ids that are still due.
func (e *Engine) ClaimByID(ctx context.Context, community uuid.UUID, ids []uuid.UUID) ([]Claimed, error) {
	refs := make([]runRef, len(ids))
	for i, id := range ids {
		refs[i] = runRef{community, id}
	}
	return e.claimByID(ctx, refs, claimShares{})
}

func (e *Engine) claimByID(ctx context.Context, refs []runRef, shares claimShares) ([]Claimed, error) {
	ctx, cancel := e.claimContext(ctx)
	defer cancel()
	claimID := uuid.New()
	full, busy, room, share := shares.params(len(refs))
	communities, ids := make([]uuid.UUID, len(refs)), make([]uuid.UUID, len(refs))
	for i, r := range refs {
		communities[i], ids[i] = r.community, r.id
	}
	rows, err := db.New(e.pool).WorkflowRunClaimByID(ctx, db.WorkflowRunClaimByIDParams{
		ClaimID: claimID, Now: e.clock.SQL(), LeaseMs: e.lease.Milliseconds(), Communities: communities, Ids: ids, MaxRows: int32(len(refs)),
		FullCommunities: full, BusyCommunities: busy, BusyRoom: room, CommunityShare: share,
	})
	out := make([]Claimed, len(rows))
	for i, r := range rows {
		out[i] = Claimed{ClaimID: claimID, Run: db.WorkflowRunClaimDueRow(r)}
	}
	return out, err
}

// errLostClaim means a fenced transition changed nothing: another worker
// holds the run now (or it ended). The step's transaction rolls back.
var errLostClaim = errors.New("workflow run claim lost")

// stepResult is what one step transaction decided.
type stepResult int

const (
	stepNext   stepResult = iota // step done, run the next one
	stepParked                   // delayed: the run waits unclaimed
	stepEnded                    // completed, failed or cancelled
	stepCall                     // marked started: make the call, then record it
)

// traceEntry is one element of workflow_runs.execution_trace.
type traceEntry struct {
	StepID string         `json:"step_id"`
	Index  int            `json:"index"`
	Status string         `json:"status"` // completed, skipped, delayed, failed
	Output map[string]any `json:"output,omitempty"`
	Error  string         `json:"error,omitempty"`
}

// pendingCall is a call_webhook step marked started and not yet sent.
type pendingCall struct {
	req   safehttp.Request
	entry traceEntry
	last  bool
}

// Execute runs a claimed run's steps, one transaction per step, until it
// ends, parks for a delay, or the claim is lost. It reports whether this
// worker still held the claim at the end.
func (e *Engine) Execute(ctx context.Context, c Claimed) bool {
	return e.execute(ctx, nil, c)
}

// execute is Execute that starts no further step once stop is closed (the
// worker is shutting down): the step in flight finishes and is recorded,
// and the run is handed back (release) for another worker to resume at its
// next step.
func (e *Engine) execute(ctx context.Context, stop <-chan struct{}, c Claimed) bool {
	step := int(c.Run.CurrentStep)
	if c.Run.ExpiredLeases >= MaxExpiredLeases {
		// Every worker that took this step stopped (or outlasted its lease)
		// before recording it: running it again would most likely stop this
		// one too, and the next, one lease apart, for ever.
		f := fail(CodeStepAbandoned, "step %d: its worker stopped or outlasted its lease %d times before recording it; the run is not resumed again", step, c.Run.ExpiredLeases)
		e.log.Error("workflow run abandoned", "run", c.Run.ID, "step", step, "expired_leases", c.Run.ExpiredLeases)
		return e.finish(ctx, db.New(e.pool), c, step, f, traceEntry{Index: step, Status: "failed", Error: f.message}) == nil
	}
	var trace []traceEntry
	if err := json.Unmarshal(c.Run.ExecutionTrace, &trace); err != nil {
		trace = nil
	}
	for {
		var (
			result   stepResult
			emitted  *ingest.Write
			newTrace traceEntry
			call     *pendingCall
		)
		deadline := startStep(ctx)
		stopKeeping := e.keepLease(deadline.ctx, c, step)
		err := e.stepTransaction(deadline, c, step, func(tx pgx.Tx) error {
			var err error
			emitted.Discard() // a failed attempt's, rolled back
			emitted = e.pipeline.RelayWrite(c.Run.CommunityID, db.New(tx))
			result, newTrace, call, err = e.runStep(deadline, emitted, c, step, trace)
			if err != nil {
				return err
			}
			if e.beforeCommit != nil {
				e.beforeCommit(c.Run.ID, step)
			}
			return nil
		})
		stopKeeping()
		if err != nil {
			emitted.Discard() // rolled back
		}
		switch {
		case errors.Is(err, errLostClaim):
			deadline.stop()
			return false
		case err != nil:
			// The step's transaction rolled back: end the run in a fresh
			// one, with step_timeout if the step's deadline cut it short,
			// else database_error (or the step's own failure).
			deadline.stop()
			if ctx.Err() != nil {
				return true // shutting down: the lease lets another worker resume
			}
			f := fail(CodeDatabaseError, "step %d could not be recorded", step)
			var rf *runFailure
			switch {
			case deadline.expired() && errors.As(err, &rf):
				f = deadline.failure().after(rf.message)
			case deadline.expired():
				f = deadline.failure()
			case errors.As(err, &rf):
				f = rf
			}
			if newTrace.Status == "failed" && rf == nil {
				// The step failed and was being recorded when its
				// transaction failed: that failure is why it ended.
				f = f.after(newTrace.Error)
			}
			e.log.Error("workflow step failed", "run", c.Run.ID, "step", step, "code", f.code, "err", err)
			return e.finish(ctx, db.New(e.pool), c, step, f, traceEntry{StepID: deadline.stepID, Index: step, Status: "failed", Error: f.message}) == nil
		}
		emitted.PublishEmitted()
		if result == stepCall {
			trace = append(trace, traceEntry{StepID: call.entry.StepID, Index: step, Status: "started"})
			result, newTrace, err = e.finishCall(ctx, deadline, c, step, call)
		}
		deadline.stop()
		if err != nil {
			if errors.Is(err, errLostClaim) {
				return false
			}
			if ctx.Err() != nil {
				return true // shutting down: the run resumes as "outcome unknown"
			}
			// The call was made but its outcome could not be recorded: end
			// the run now rather than leave it running until its lease
			// expires and it is misreported as a stopped worker's.
			f := fail(CodeDatabaseError, "step %s: the call was made but its outcome could not be recorded", call.entry.StepID).after(callOutcome(newTrace))
			e.log.Error("workflow step failed", "run", c.Run.ID, "step", step, "code", f.code, "err", err)
			return e.finish(ctx, db.New(e.pool), c, step, f, failed(call.entry, f)) == nil
		}
		if result != stepNext {
			return true
		}
		trace = append(trace, newTrace)
		step++
		select {
		case <-stop:
			return e.release(ctx, c, step)
		default:
		}
	}
}

// MaxExpiredLeases is how many times a run's lease may expire at one step
// (its worker crashed, was killed, or the step outlasted the lease) before
// the claim that would resume it ends it with step_abandoned: the step was
// tried that many times and never recorded.
const MaxExpiredLeases = 3

// stepAttempts is how many times a step's transaction is run when it
// fails for a transient reason (dberr.IsTransient).
const stepAttempts = 3

// stepRetryPause is the pause before a step transaction's second attempt;
// it doubles for each later one.
const stepRetryPause = 100 * time.Millisecond

// stepTransaction runs one step's transaction, again (up to stepAttempts
// in all, within the step's deadline) when it failed for a transient
// reason: a failover, a restarted pooler or a terminated session would
// otherwise end every run in flight as database_error. Running it again is
// safe: its writes rolled back with it, it makes no call outside the
// database (call_webhook's request runs after it), and every transition
// it records is fenced on the claim and the step, so an attempt whose
// commit happened unseen makes the next one find the step already done
// (errLostClaim; the run resumes after the lease) instead of doing it
// twice.
//
// A COMMIT whose answer was lost is first asked about: when the
// transaction did commit, the attempt succeeded, and the step goes on as if
// the answer had come (its doorbell published to live subscribers and its
// outbox rows handed off, the next step run at once). Run again instead, it
// found its own commit (errLostClaim), published nothing (the doorbell
// reached live subscribers of no process and listeners only by the poll),
// and the run waited out its lease.
func (e *Engine) stepTransaction(deadline *stepDeadline, c Claimed, step int, fn func(pgx.Tx) error) error {
	pause := stepRetryPause
	for attempt := 1; ; attempt++ {
		var xid string // the attempt's transaction, once its work is done
		err := pgx.BeginFunc(deadline.ctx, e.pool, func(tx pgx.Tx) error {
			if err := fn(tx); err != nil {
				return err
			}
			return tx.QueryRow(deadline.ctx, "-- name: WorkflowStepTransactionID\nSELECT pg_current_xact_id()::text").Scan(&xid)
		})
		if err != nil && xid != "" && e.committedUnseen(deadline.ctx, xid) {
			e.log.Warn("workflow step committed, its answer lost", "run", c.Run.ID, "step", step, "err", err)
			return nil
		}
		if err == nil || attempt == stepAttempts || !dberr.IsTransient(err) || deadline.ctx.Err() != nil {
			return err
		}
		e.log.Warn("workflow step transaction failed; trying it again", "run", c.Run.ID, "step", step, "attempt", attempt, "err", err)
		select {
		case <-deadline.ctx.Done():
			return err
		case <-time.After(pause):
		}
		pause *= 2
	}
}

// commitCheckTimeout bounds asking whether a transaction whose COMMIT
// answer was lost committed.
const commitCheckTimeout = 5 * time.Second

// committedUnseen reports whether transaction xid, whose COMMIT failed
// from the client's side, committed all the same (pg_xact_status, asked on
// another connection). A transaction still in progress (the server has not
// yet seen the connection go) is asked about again for a while; any doubt
// answers false, and the step is run again, fenced.
func (e *Engine) committedUnseen(ctx context.Context, xid string) bool {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), commitCheckTimeout)
	defer cancel()
	for {
		var status *string
		err := e.pool.QueryRow(ctx, "-- name: WorkflowStepTransactionStatus\nSELECT pg_xact_status($1::xid8)", xid).Scan(&status)
		switch {
		case err != nil || status == nil:
			return false
		case *status != "in progress":
			return *status == "committed"
		}
		select {
		case <-ctx.Done():
			return false
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// keepLease renews the claim's lease every third of it while step is at
// work, until ctx (the step's deadline) ends or the returned stop is
// called. The lease is what tells a stopped worker from a live one; a step
// may work for up to its timeout (300 s by default, against a 30 s lease),
// and without renewal another worker resumed the run beside it at each
// lease, ran the step again, and took the live worker's claim, so neither
// recorded the step_timeout that should end it.
func (e *Engine) keepLease(ctx context.Context, c Claimed, step int) (stop func()) {
	every := e.lease / 3
	if every <= 0 {
		return func() {}
	}
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		tick := time.NewTicker(every)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			renewCtx, renewCancel := context.WithTimeout(ctx, every)
			n, err := db.New(e.pool).WorkflowRunKeepLease(renewCtx, db.WorkflowRunKeepLeaseParams{
				Now: e.clock.SQL(), LeaseMs: e.lease.Milliseconds(),
				CommunityID: c.Run.CommunityID, ID: c.Run.ID, ClaimID: c.ClaimID, Step: int32(step),
			})
			renewCancel()
			if err == nil && n == 0 {
				return // the claim is lost, or the step recorded
			}
		}
	}()
	return func() { cancel(); <-done }
}

// releaseTimeout bounds handing a run back on shutdown; if it fails, the
// run waits for its lease to expire instead.
const releaseTimeout = 2 * time.Second

// release hands a claimed run back between steps, due at once, so a
// stopping worker does not leave it to wait out its lease. It reports
// whether this worker still held the claim.
func (e *Engine) release(ctx context.Context, c Claimed, step int) bool {
	ctx, cancel := context.WithTimeout(ctx, releaseTimeout)
	defer cancel()
	n, err := db.New(e.pool).WorkflowRunRelease(ctx, db.WorkflowRunReleaseParams{
		CommunityID: c.Run.CommunityID, ID: c.Run.ID, ClaimID: c.ClaimID, Step: int32(step), Now: e.clock.SQL(),
	})
	if err != nil {
		e.log.Warn("workflow run not handed back on shutdown; it resumes after its lease", "run", c.Run.ID, "err", err)
		return true
	}
	return n == 1
}

// runStep executes step index of the run inside one transaction and makes
// the matching fenced transition, so a step's effects and the record that
// it happened commit together or not at all.
func (e *Engine) runStep(deadline *stepDeadline, w *ingest.Write, c Claimed, index int, trace []traceEntry) (stepResult, traceEntry, *pendingCall, error) {
	ctx := deadline.ctx
	q := w.Q
	def, tc, f := e.loadPinned(ctx, q, c)
	if f != nil && f.code == CodeDatabaseError {
		return stepEnded, traceEntry{}, nil, f // rolls back; Execute records it afresh
	}
	if f != nil {
		failedEntry := traceEntry{Index: index, Status: "failed", Error: f.message}
		return stepEnded, failedEntry, nil, e.finish(ctx, q, c, index, f, failedEntry)
	}
	if index >= len(def.Steps) {
		return stepEnded, traceEntry{}, nil, e.finish(ctx, q, c, index, nil, traceEntry{})
	}
	step := def.Steps[index]
	deadline.arm(step.ID, e.timeoutOf(&step))
	entry := traceEntry{StepID: step.ID, Index: index, Status: "completed"}
	tctx := tc.Template(stepOutputs(trace))
	if step.If != "" {
		ok, err := e.condition(ctx, step.If, tctx)
		if err != nil {
			f := fail(CodeConditionEvaluationFailed, "step %s: condition: %v", step.ID, err)
			return stepEnded, failed(entry, f), nil, e.finish(ctx, q, c, index, f, failed(entry, f))
		}
		if !ok {
			entry.Status = "skipped"
			return stepNext, entry, nil, e.advance(ctx, q, c, index, entry)
		}
	}
	var out map[string]any
	var sf *runFailure
	switch step.Action {
	case ActionSendMessage:
		out, sf = e.sendMessage(ctx, w, c, def, &step, tc, tctx)
	case ActionAddReaction:
		out, sf = e.addReaction(ctx, w, c, &step, tc, tctx)
	case ActionCallWebhook:
		if f := e.ownerMayCall(ctx, q, c, step.ID); f != nil {
			return e.failStep(ctx, q, c, index, entry, f)
		}
		if startedBefore(trace, index) {
			// A worker marked this call started and stopped before it
			// recorded the outcome: the request may have been sent.
			f := fail(CodeWebhookFailed, "step %s: outcome unknown after a worker stopped; the call is not repeated", step.ID)
			return e.failStep(ctx, q, c, index, entry, f)
		}
		req, f := renderCall(&step, tctx)
		if f != nil {
			return e.failStep(ctx, q, c, index, entry, f)
		}
		req.Depth = tc.Depth + 1
		started := traceEntry{StepID: step.ID, Index: index, Status: "started"}
		// The lease covers the whole call (ended by the step's deadline or
		// the client's timeout, whichever comes first): a worker that dies
		// during it leaves the run to be failed ("outcome unknown") only
		// once the call can no longer be in flight.
		callLease := e.lease + min(deadline.remaining(), e.webhooks.Timeout())
		n, err := q.WorkflowRunStepStart(ctx, db.WorkflowRunStepStartParams{
			Trace: mustJSON([]traceEntry{started}), Now: e.clock.SQL(), LeaseMs: callLease.Milliseconds(),
			CommunityID: c.Run.CommunityID, ID: c.Run.ID, ClaimID: c.ClaimID, Step: int32(index),
		})
		if err == nil && n == 0 {
			err = errLostClaim
		}
		return stepCall, entry, &pendingCall{req: req, entry: entry, last: index == len(def.Steps)-1}, err
	case ActionRequestApproval:
		return e.requestApproval(ctx, w, c, index, &step, entry, tctx)
	case ActionDelay:
		entry.Status = "delayed"
		n, err := q.WorkflowRunPark(ctx, db.WorkflowRunParkParams{
			NextStep: int32(index + 1), Trace: mustJSON([]traceEntry{entry}),
			Now: e.clock.SQL(), DelayMs: step.DelayDuration().Milliseconds(),
			CommunityID: c.Run.CommunityID, ID: c.Run.ID, ClaimID: c.ClaimID, Step: int32(index),
		})
		if err == nil && n == 0 {
			err = errLostClaim
		}
		return stepParked, entry, nil, err
	default:
		// send_dm, set_channel_topic, and actions this relay does not run yet.
		sf = fail(CodeActionNotImplemented, "step %s: action %s is not implemented", step.ID, step.Action)
	}
	if sf != nil && sf.code == CodeDatabaseError {
		return stepEnded, entry, nil, sf // the transaction is aborted: roll back
	}
	if sf != nil {
		return stepEnded, failed(entry, sf), nil, e.finish(ctx, q, c, index, sf, failed(entry, sf))
	}
	entry.Output = out
	if index == len(def.Steps)-1 {
		return stepEnded, entry, nil, e.finish(ctx, q, c, index, nil, entry)
	}
	return stepNext, entry, nil, e.advance(ctx, q, c, index, entry)
}

func (e *Engine) failStep(ctx context.Context, q *db.Queries, c Claimed, index int, entry traceEntry, f *runFailure) (stepResult, traceEntry, *pendingCall, error) {
	if f.code == CodeDatabaseError {
		return stepEnded, entry, nil, f
	}
	return stepEnded, failed(entry, f), nil, e.finish(ctx, q, c, index, f, failed(entry, f))
}

// startedBefore reports whether the trace marks step index started with no
// outcome recorded after it.
func startedBefore(trace []traceEntry, index int) bool {
	return len(trace) > 0 && trace[len(trace)-1].Index == index && trace[len(trace)-1].Status == "started"
}

// ownerMayCall: a step that reaches outside the relay runs on the owner's
// authority only while the owner is an owner or admin of the channel. The
// call goes out after the step's transaction commits, so the write lock
// would order nothing: a plain read sees every change committed before it.
func (e *Engine) ownerMayCall(ctx context.Context, q *db.Queries, c Claimed, stepID string) *runFailure {
	access, err := ingest.ChannelAccessNow(ctx, q, db.ChannelAccessParams{CommunityID: c.Run.CommunityID, ID: *c.Run.ChannelID, Pubkey: c.Run.OwnerPubkey})
	if err != nil && !dberr.IsNotFound(err) {
		return dbFail(err, "step %s: channel unavailable", stepID)
	}
	if err != nil || access.MemberRole == nil || (*access.MemberRole != db.MemberRoleOwner && *access.MemberRole != db.MemberRoleAdmin) {
		return fail(CodeOwnerUnauthorized, "step %s: call_webhook needs the owner to be an owner or admin of the channel", stepID)
	}
	return nil
}

func renderCall(step *Step, tctx template.Context) (safehttp.Request, *runFailure) {
	render := func(field, text string) (string, *runFailure) {
		out, err := template.Render(text, tctx)
		if err != nil {
			return "", fail(CodeTemplateResolutionFailed, "step %s: %s: %v", step.ID, field, err)
		}
		return out, nil
	}
	req := safehttp.Request{Method: step.Method, Headers: map[string]string{}}
	var f *runFailure
	if req.URL, f = renderURL(step, tctx); f != nil {
		return req, f
	}
	for k, v := range step.Headers {
		if req.Headers[k], f = render("headers", v); f != nil {
			return req, f
		}
	}
	body, f := render("body", step.Body)
	req.Body = []byte(body)
	return req, f
}

// renderURL renders a call_webhook URL with each placeholder's value as one
// piece of data: percent-encoded but for the unreserved characters, so a
// value cannot add a path segment, a query parameter or a fragment, nor
// name another host. Values come from whoever triggered the run (a message
// any member posts): "1/close?force=" in ".../issues/{{trigger.text}}/comments"
// called /issues/1/close with the owner's headers. Nor may a value change
// the path's shape through what servers normalize: a path segment that a
// value leaves empty ("/issues//comments", which servers merge into
// /issues/comments) or makes "." or ".." (which climb the path) fails the
// step, as does a placeholder without a value, and a definition saved
// before its host had to be written out.
func renderURL(step *Step, tctx template.Context) (string, *runFailure) {
	if !urlOriginIsLiteral(step.URL) {
		return "", fail(CodeTemplateResolutionFailed, "step %s: url: %s; the owner must save the workflow again", step.ID, urlOriginPlaceholder)
	}
	var missing string
	rendered, err := template.Expand(step.URL, tctx, func(path, value string, found bool) string {
		if !found && missing == "" {
			missing = path
		}
		return strings.ReplaceAll(url.QueryEscape(value), "+", "%20")
	})
	if err != nil {
		return "", fail(CodeTemplateResolutionFailed, "step %s: url: %v", step.ID, err)
	}
	if missing != "" {
		return "", fail(CodeTemplateResolutionFailed, "step %s: url: {{%s}} has no value", step.ID, missing)
	}
	// The same URL with every value a plain "x": a segment that is empty or a
	// dot segment only in the rendering a value made so. Values hold no "/",
	// "?" or "#", so both renderings have the same segments.
	probe, _ := template.Expand(step.URL, tctx, func(string, string, bool) string { return "x" })
	want := urlPathSegments(probe)
	for i, seg := range urlPathSegments(rendered) {
		if (seg == "" || seg == "." || seg == "..") && seg != want[i] {
			return "", fail(CodeTemplateResolutionFailed, `step %s: url: a value may not leave a path segment empty or make it "." or ".."`, step.ID)
		}
	}
	return rendered, nil
}

// urlPathSegments splits the path of a URL whose scheme and host are
// written out (urlOriginIsLiteral) at its slashes.
func urlPathSegments(rawURL string) []string {
	_, rest, _ := strings.Cut(rawURL, "://")
	start := strings.IndexAny(rest, "/?#")
	if start < 0 || rest[start] != '/' {
		return nil
	}
	path := rest[start:]
	if end := strings.IndexAny(path, "?#"); end >= 0 {
		path = path[:end]
	}
	return strings.Split(path, "/")
}

// finishCall sends a started call_webhook request outside any transaction,
// under the step's deadline, and records its outcome, fenced like every
// transition (in ctx: the record is made even when the deadline passed).
func (e *Engine) finishCall(ctx context.Context, deadline *stepDeadline, c Claimed, index int, call *pendingCall) (stepResult, traceEntry, error) {
	resp, err := e.webhooks.Do(deadline.ctx, call.req)
	entry := call.entry
	var f *runFailure
	switch {
	case err != nil && deadline.expired():
		f = deadline.failure()
	case err != nil:
		f = fail(CodeWebhookFailed, "step %s: %v", entry.StepID, err)
	case resp.Status < 200 || resp.Status > 299:
		f = fail(CodeWebhookFailed, "step %s: the server answered HTTP %d", entry.StepID, resp.Status)
	default:
		entry.Output = map[string]any{"status": resp.Status}
		body, cut := traceBody(resp.Body)
		entry.Output["body"] = body
		if cut {
			entry.Output["body_truncated"] = true
		}
	}
	q := db.New(e.pool)
	switch {
	case f != nil:
		return stepEnded, failed(entry, f), e.recordCall(ctx, c, index, func() error { return e.finish(ctx, q, c, index, f, failed(entry, f)) })
	case call.last:
		return stepEnded, entry, e.recordCall(ctx, c, index, func() error { return e.finish(ctx, q, c, index, nil, entry) })
	}
	return stepNext, entry, e.recordCall(ctx, c, index, func() error { return e.advance(ctx, q, c, index, entry) })
}

// recordCall runs the statement recording a call's outcome, again (up to
// stepAttempts in all) when it failed for a transient reason: a pooled
// connection whose session the server ended (a restart, a failover,
// pg_terminate_backend) fails its next statement, and the call, which is
// not repeated, would end its run as database_error though it succeeded.
// Running it again is safe: it is fenced on the claim and the step, so a
// first attempt that committed unseen makes the next find the step moved
// (errLostClaim) rather than record it twice.
func (e *Engine) recordCall(ctx context.Context, c Claimed, step int, record func() error) error {
	pause := stepRetryPause
	for attempt := 1; ; attempt++ {
		err := record()
		if err == nil || attempt == stepAttempts || !dberr.IsTransient(err) || ctx.Err() != nil {
			return err
		}
		e.log.Warn("recording a webhook call's outcome failed; trying it again", "run", c.Run.ID, "step", step, "attempt", attempt, "err", err)
		select {
		case <-ctx.Done():
			return err
		case <-time.After(pause):
		}
		pause *= 2
	}
}

// MaxTraceBodyBytes bounds the webhook answer a call_webhook step keeps in
// its run's trace (and hands to later steps as its body output): the trace
// is rewritten with every step and read with every claim, so a run of
// several calls must not carry megabytes through each.
const MaxTraceBodyBytes = 64 << 10

// traceBody is a webhook answer as its step's body output: jsonb-safe, cut
// to at most MaxTraceBodyBytes on a character boundary (cut reports it).
func traceBody(b []byte) (body string, cut bool) {
	body = jsonbText(b)
	if len(body) <= MaxTraceBodyBytes {
		return body, false
	}
	end := MaxTraceBodyBytes
	for end > 0 && !utf8.RuneStart(body[end]) {
		end--
	}
	return body[:end], true
}

// jsonbText is b as text a jsonb value can hold: PostgreSQL refuses the
// NUL character in jsonb, and invalid UTF-8 would not survive as JSON
// text; both become U+FFFD.
func jsonbText(b []byte) string {
	return strings.ReplaceAll(strings.ToValidUTF8(string(b), "\uFFFD"), "\x00", "\uFFFD")
}

// callOutcome says what a call_webhook step's call came to, from its
// trace entry: its failure, or the status the server answered.
func callOutcome(entry traceEntry) string {
	if entry.Status == "failed" {
		return entry.Error
	}
	if status, ok := entry.Output["status"]; ok {
		return fmt.Sprintf("step %s: the server answered HTTP %v", entry.StepID, status)
	}
	return ""
}

func failed(entry traceEntry, f *runFailure) traceEntry {
	entry.Status, entry.Error = "failed", f.message
	return entry
}

func mustJSON(v any) []byte {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	return b
}

func stepOutputs(trace []traceEntry) map[string]map[string]any {
	out := map[string]map[string]any{}
	for _, t := range trace {
		if t.Output != nil {
			out[t.StepID] = t.Output
		}
	}
	return out
}

func (e *Engine) advance(ctx context.Context, q *db.Queries, c Claimed, index int, entry traceEntry) error {
	n, err := q.WorkflowRunStepDone(ctx, db.WorkflowRunStepDoneParams{
		NextStep: int32(index + 1), Trace: mustJSON([]traceEntry{entry}), Now: e.clock.SQL(), LeaseMs: e.lease.Milliseconds(),
		CommunityID: c.Run.CommunityID, ID: c.Run.ID, ClaimID: c.ClaimID, Step: int32(index),
	})
	if err == nil && n == 0 {
		err = errLostClaim
	}
	return err
}

// finish ends the run: completed when f is nil, else failed with f's code.
func (e *Engine) finish(ctx context.Context, q *db.Queries, c Claimed, _ int, f *runFailure, entry traceEntry) error {
	params := db.WorkflowRunFinishParams{
		Status: db.WorkflowRunStatusCompleted, Trace: []byte("[]"), Now: e.clock.SQL(),
		CommunityID: c.Run.CommunityID, ID: c.Run.ID, ClaimID: c.ClaimID,
	}
	entry.Error = boundedMessage(entry.Error)
	if entry.Status != "" {
		params.Trace = mustJSON([]traceEntry{entry})
	}
	if f != nil {
		code, msg := string(f.code), boundedMessage(f.message)
		params.Status, params.ErrorCode, params.ErrorMessage = db.WorkflowRunStatusFailed, &code, &msg
	}
	n, err := q.WorkflowRunFinish(ctx, params)
	if err == nil && n == 0 {
		err = errLostClaim
	}
	if err == nil {
		// Counted when the statement succeeded; a rollback afterwards (rare:
		// the commit itself failing) would count a run that did not end.
		e.metrics.runEnded(f, e.clock.Now().Sub(c.Run.CreatedAt))
	}
	return err
}

// loadPinned re-reads the workflow row and the exact signed definition
// event the run is pinned to. Any doubt fails closed: a disabled or
// archived workflow, a run without a pinned event, an event that is gone
// (deleted, or replaced by a newer save), not signed by the owner, or no
// longer valid.
func (e *Engine) loadPinned(ctx context.Context, q *db.Queries, c Claimed) (*Definition, TriggerContext, *runFailure) {
	var tc TriggerContext
	if err := json.Unmarshal(c.Run.TriggerContext, &tc); err != nil {
		return nil, tc, fail(CodeInvalidDefinition, "run has no readable trigger context")
	}
	row, err := q.WorkflowGet(ctx, db.WorkflowGetParams{CommunityID: c.Run.CommunityID, ID: c.Run.WorkflowID, Now: e.clock.SQL()})
	if err != nil {
		return nil, tc, dbFail(err, "workflow row unavailable")
	}
	if !row.Enabled || row.Status != db.WorkflowStatusActive {
		return nil, tc, fail(CodeWorkflowDisabled, "workflow is %s", disabledState(row))
	}
	pinned, ok := nostr.DecodeHex32(tc.DefinitionEventID)
	if !ok || row.ChannelID == nil {
		return nil, tc, fail(CodeInvalidDefinition, "the run is not pinned to a signed definition; the owner must save the workflow again")
	}
	ev, err := q.EventWorkflowDefinition(ctx, db.EventWorkflowDefinitionParams{CommunityID: c.Run.CommunityID, ID: pinned[:], ChannelID: *row.ChannelID, Now: e.clock.SQL()})
	if dberr.IsNotFound(err) {
		return nil, tc, fail(CodeInvalidDefinition, "the pinned definition event is no longer stored (deleted or replaced while the run was executing)")
	}
	if err != nil {
		return nil, tc, dbFail(err, "definition event unavailable")
	}
	if ev.Expired {
		// Expired is gone to every reader (NIP-40), purged or not: the
		// run fails at its next step as it will once the purge took it.
		return nil, tc, fail(CodeInvalidDefinition, "the pinned definition event expired (NIP-40) while the run was executing")
	}
	if string(ev.Pubkey) != string(row.OwnerPubkey) {
		return nil, tc, fail(CodeOwnerUnauthorized, "the pinned definition is not signed by the workflow owner")
	}
	def, err := e.definitions.parse(ev.ID, ev.Content)
	if err != nil {
		// Saving refuses what does not parse, so this is a definition
		// stored under an earlier, more lenient parser.
		code := CodeInvalidDefinition
		var de *DefinitionError
		if errors.As(err, &de) && strings.HasPrefix(de.Text, "invalid YAML") {
			code = CodeInvalidYAML
		}
		return nil, tc, fail(code, "the pinned definition no longer parses (%v); the owner must save it again", err)
	}
	if !def.Enabled {
		return nil, tc, fail(CodeWorkflowDisabled, "the definition sets enabled: false")
	}
	return def, tc, nil
}

// pinnedTo reports whether a run's trigger context pins the definition
// event id.
func pinnedTo(triggerContext []byte, id []byte) bool {
	var tc TriggerContext
	return json.Unmarshal(triggerContext, &tc) == nil && tc.DefinitionEventID == hex.EncodeToString(id) && len(id) == 32
}

func disabledState(row db.WorkflowGetRow) string {
	if row.Status != db.WorkflowStatusActive {
		return string(row.Status)
	}
	return "disabled"
}

// sendMessage posts the step's relay-signed doorbell message: the rendered
// text for people, and tags that point at the signed definition and the
// cause, so an agent verifies the owner's signed step instead of trusting
// relay prose. Wake targets come only from the unrendered, owner-signed
// template.
func (e *Engine) sendMessage(ctx context.Context, w *ingest.Write, c Claimed, def *Definition, step *Step, tc TriggerContext, tctx template.Context) (map[string]any, *runFailure) {
	text, err := template.Render(step.Text, tctx)
	if err != nil {
		return nil, fail(CodeTemplateResolutionFailed, "step %s: text: %v", step.ID, err)
	}
	if strings.TrimSpace(text) == "" {
		return nil, fail(CodeTemplateResolutionFailed, "step %s: empty message content", step.ID)
	}
	channel := *c.Run.ChannelID
	if step.Channel != "" {
		rendered, err := template.Render(step.Channel, tctx)
		if err != nil {
			return nil, fail(CodeTemplateResolutionFailed, "step %s: channel: %v", step.ID, err)
		}
		if channel, err = uuid.Parse(strings.TrimSpace(rendered)); err != nil {
			return nil, fail(CodeTemplateResolutionFailed, "step %s: channel is not a channel id", step.ID)
		}
	}
	q := w.Q
	access, f := ownerChannelAccess(ctx, q, c, step.ID, channel)
	if f != nil {
		return nil, f
	}
	if f := e.triggererMayWrite(ctx, q, c, step, tc, channel); f != nil {
		return nil, f
	}
	if access.ArchivedAt != nil {
		return nil, fail(CodeWebhookFailed, "step %s: channel is archived", step.ID)
	}
	w.ReadChannel(channel, access)
	owner := hex.EncodeToString(c.Run.OwnerPubkey)
	tags := nostr.Tags{
		{"workflow-run", c.Run.ID.String()},
		{"workflow-step", step.ID},
		{"workflow-owner", owner},
		{"workflow-definition", tc.DefinitionEventID, step.ID},
		{"workflow-cause", tc.Cause.Kind, tc.Cause.Ref},
		{"p", owner},
		{"h", channel.String()},
		{"buzz:workflow", DoorbellMarker},
	}
	if tc.Cause.Kind == CauseWebhook && len(tc.WebhookFields) > 0 {
		tags = append(tags, nostr.Tag{"workflow-cargo", string(mustJSON(tc.WebhookFields))})
	}
	members, err := mentionable(ctx, q, c.Run.CommunityID, channel, step.Text)
	if err != nil {
		return nil, dbFail(err, "step %s: members unavailable", step.ID)
	}
	for _, pk := range mention.Resolve(step.Text, members, owner) {
		tags = append(tags, nostr.Tag{"p", pk})
	}
	if step.ReplyInThread && tc.MessageID != "" {
		root := tc.RootMessageID
		if root == "" || root == tc.MessageID {
			tags = append(tags, nostr.Tag{"e", tc.MessageID, "", "reply"})
		} else {
			tags = append(tags, nostr.Tag{"e", root, "", "root"}, nostr.Tag{"e", tc.MessageID, "", "reply"})
		}
	}
	// EmitWaking: the owner and the mentioned members get their mention
	// rows and listener outbox rows in this step's transaction, so an agent
	// served by an operator listener hears the doorbell too, and a step
	// fenced out by a lost claim wakes nobody.
	if err := w.EmitWaking(ctx, kindChat, text, tags, &channel); err != nil {
		return nil, dbFail(err, "step %s: message not stored", step.ID)
	}
	return map[string]any{"message_id": w.LastEmitted().ID, "channel_id": channel.String()}, nil
}

// mentionable reads the members of channel that template could wake: only
// those whose folded display name is one of its mention candidates, found
// through an index of folded names, so a step reads rows in proportion to
// its mentions, not to its channel's members. A template with more
// candidates than mention.MaxCandidates (one crowded with "@"s) reads
// every member with a name, as every step did before: looking up that
// many candidates would cost more.
func mentionable(ctx context.Context, q *db.Queries, community, channel uuid.UUID, template string) ([]mention.Member, error) {
	candidates, ok := mention.Candidates(template)
	var rows []db.ChannelMemberDisplayNamesRow
	var err error
	switch {
	case ok && len(candidates) == 0:
		return nil, nil
	case ok:
		var named []db.ChannelMemberDisplayNamesNamedRow
		named, err = q.ChannelMemberDisplayNamesNamed(ctx, db.ChannelMemberDisplayNamesNamedParams{CommunityID: community, ChannelID: channel, Names: candidates})
		for _, n := range named {
			rows = append(rows, db.ChannelMemberDisplayNamesRow(n))
		}
	default:
		rows, err = q.ChannelMemberDisplayNames(ctx, db.ChannelMemberDisplayNamesParams{CommunityID: community, ChannelID: channel})
	}
	if err != nil {
		return nil, err
	}
	members := make([]mention.Member, len(rows))
	for i, n := range rows {
		members[i] = mention.Member{Pubkey: hex.EncodeToString(n.Pubkey), DisplayName: n.DisplayName}
	}
	return members, nil
}

// ownerChannelAccess reads the owner's access to channel, where a step is
// about to post: a channel that is gone (deleted) or private to others
// fails the step with owner_unauthorized. The caller checks ArchivedAt.
func ownerChannelAccess(ctx context.Context, q *db.Queries, c Claimed, stepID string, channel uuid.UUID) (db.ChannelAccessRow, *runFailure) {
	access, err := ingest.ChannelAccess(ctx, q, db.ChannelAccessParams{CommunityID: c.Run.CommunityID, ID: channel, Pubkey: c.Run.OwnerPubkey})
	if dberr.IsNotFound(err) || err == nil && !canRead(access) {
		// One answer for both: every reader of the workflow's channel sees
		// the run's error, and it must not tell which private channel ids
		// exist.
		return access, fail(CodeOwnerUnauthorized, "step %s: the channel does not exist or is private to its members", stepID)
	}
	if err != nil {
		return access, dbFail(err, "step %s: channel unavailable", stepID)
	}
	return access, nil
}

// triggererMayWrite checks a channel a template picked against whoever
// triggered the run. A literal channel is the owner's choice, signed in the
// definition; a templated one is chosen by what the trigger carries (its
// text, say), so without this check any member of the workflow's channel
// could have the relay post into any channel the owner may write, a
// private one they are not in among them. For an event cause the author
// must therefore be allowed to write there too (an open channel, or active
// membership of a private one), answered like the owner's refusal so the
// run's error tells nothing more. A command is the owner's own; a schedule
// has no author, and a webhook's caller holds the owner's secret.
func (e *Engine) triggererMayWrite(ctx context.Context, q *db.Queries, c Claimed, step *Step, tc TriggerContext, channel uuid.UUID) *runFailure {
	if !strings.Contains(step.Channel, "{{") || tc.Cause.Kind != CauseEvent {
		return nil
	}
	author, ok := nostr.DecodeHex32(tc.Author)
	if !ok {
		return fail(CodeOwnerUnauthorized, "step %s: the channel does not exist or is private to its members", step.ID)
	}
	if string(author[:]) == string(c.Run.OwnerPubkey) {
		return nil
	}
	access, err := ingest.ChannelAccess(ctx, q, db.ChannelAccessParams{CommunityID: c.Run.CommunityID, ID: channel, Pubkey: author[:]})
	if dberr.IsNotFound(err) || err == nil && !canRead(access) {
		return fail(CodeOwnerUnauthorized, "step %s: the channel does not exist or is private to its members", step.ID)
	}
	if err != nil {
		return dbFail(err, "step %s: channel unavailable", step.ID)
	}
	return nil
}

// addReaction reacts, as the relay, to the message that triggered the run.
func (e *Engine) addReaction(ctx context.Context, w *ingest.Write, c Claimed, step *Step, tc TriggerContext, tctx template.Context) (map[string]any, *runFailure) {
	if tc.MessageID == "" {
		return nil, fail(CodeWebhookFailed, "step %s: the run has no message to react to", step.ID)
	}
	emoji, err := template.Render(step.Emoji, tctx)
	if err != nil {
		return nil, fail(CodeTemplateResolutionFailed, "step %s: emoji: %v", step.ID, err)
	}
	channel := *c.Run.ChannelID
	// On the owner's authority, as a message step: read under the channel's
	// write lock, after any removal of the owner that committed while this
	// step ran (the workflow row it read first was still enabled then). The
	// reaction itself is checked as the relay, which may read any channel.
	if _, f := ownerChannelAccess(ctx, w.Q, c, step.ID, channel); f != nil {
		return nil, f
	}
	tags := nostr.Tags{
		{"e", tc.MessageID},
		{"h", channel.String()},
		{"workflow-run", c.Run.ID.String()},
		{"workflow-step", step.ID},
		{"buzz:workflow", DoorbellMarker},
	}
	// EmitReaction writes the reactions row a user's reaction gets, so the
	// relay's reaction counts like any other.
	id, err := w.EmitReaction(ctx, emoji, tags)
	var rej *ingest.Rejection
	if errors.As(err, &rej) {
		return nil, fail(CodeWebhookFailed, "step %s: %s", step.ID, rej.Reason)
	}
	if err != nil {
		return nil, dbFail(err, "step %s: reaction not stored", step.ID)
	}
	return map[string]any{"reaction_id": id}, nil
}

// requestApproval stores the approval (only the SHA-256 of a fresh random
// token), tells the channel with a relay-signed kind 46010 naming the
// approval by that hash, and leaves the run waiting, unclaimed, for a
// grant (46030), a denial (46031) or the expiry.
func (e *Engine) requestApproval(ctx context.Context, w *ingest.Write, c Claimed, index int, step *Step, entry traceEntry, tctx template.Context) (stepResult, traceEntry, *pendingCall, error) {
	q := w.Q
	// The request is posted in the run's channel and decided there: one
	// deleted or archived while the run was parked (a delay) must not get
	// it, nor leave the run waiting for a decision nobody can store, as a
	// send_message into it fails too. Checked before the workflow row is
	// locked, as every channel write takes the channel's write lock before
	// the rows it then writes: the removal of the workflow's owner holds
	// that lock exclusive while its trigger disables the owner's workflows,
	// so a step holding the workflow row and then asking the lock waited
	// for the removal, and the removal for the step. Its answer is given
	// after the workflow's own, as before.
	channel := *c.Run.ChannelID
	access, channelFailure := ownerChannelAccess(ctx, q, c, step.ID, channel)
	if channelFailure != nil && channelFailure.cause != nil {
		// The transaction is aborted: nothing more can be read in it.
		return e.failStep(ctx, q, c, index, entry, channelFailure)
	}
	// The workflow row FOR SHARE: an archive or a re-save that committed
	// after this step read the row is seen here, and one still to come
	// finds the approval stored and withdraws it. Without it, an approval
	// asked for under a definition just replaced waited, undecidable, for
	// its timeout. Lock order: the channel's write lock, the workflow, then
	// (inserted) the approval, then the run, as an archive takes them.
	wf, err := q.WorkflowLockForApprovalRequest(ctx, db.WorkflowLockForApprovalRequestParams{CommunityID: c.Run.CommunityID, ID: c.Run.WorkflowID})
	if err != nil {
		return e.failStep(ctx, q, c, index, entry, dbFail(err, "step %s: workflow unavailable", step.ID))
	}
	switch pinned := c.Run.TriggerContext; {
	case wf.Status != db.WorkflowStatusActive || !wf.Enabled:
		return e.failStep(ctx, q, c, index, entry, fail(CodeWorkflowDisabled, "workflow is %s", disabledState(db.WorkflowGetRow{Status: wf.Status, Enabled: wf.Enabled})))
	case !pinnedTo(pinned, wf.DefinitionEventID):
		return e.failStep(ctx, q, c, index, entry, fail(CodeInvalidDefinition, "the pinned definition event is no longer stored (deleted or replaced while the run was executing)"))
	}
	f := channelFailure
	if f == nil && access.ArchivedAt != nil {
		f = fail(CodeWebhookFailed, "step %s: channel is archived", step.ID)
	}
	if f != nil {
		return e.failStep(ctx, q, c, index, entry, f)
	}
	w.ReadChannel(channel, access)
	message, err := template.Render(step.Message, tctx)
	if err != nil {
		return e.failStep(ctx, q, c, index, entry, fail(CodeTemplateResolutionFailed, "step %s: message: %v", step.ID, err))
	}
	timeout, _ := time.ParseDuration(step.Timeout)
	if timeout > MaxApprovalTimeout {
		// Saved before the bound: saving refuses it today.
		e.log.Warn("workflow approval timeout beyond the maximum; clamped", "run", c.Run.ID, "step", step.ID,
			"timeout", step.Timeout, "max", MaxApprovalTimeout)
		timeout = MaxApprovalTimeout
	}
	token := sha256.Sum256([]byte(uuid.New().String()))
	ref := hex.EncodeToString(token[:])
	if err := q.WorkflowApprovalCreate(ctx, db.WorkflowApprovalCreateParams{
		CommunityID: c.Run.CommunityID, Token: token[:], WorkflowID: c.Run.WorkflowID, RunID: c.Run.ID,
		StepID: step.ID, StepIndex: int32(index), ApproverSpec: step.From, TimeoutMs: timeout.Milliseconds(), Now: e.clock.SQL(),
	}); err != nil {
		return stepEnded, entry, nil, err
	}
	tags := nostr.Tags{
		{"workflow-run", c.Run.ID.String()},
		{"workflow-step", step.ID},
		{"approval", ref},
		{"h", channel.String()},
		{"buzz:workflow", DoorbellMarker},
	}
	if _, ok := nostr.DecodeHex32(step.From); ok {
		tags = append(tags, nostr.Tag{"p", strings.ToLower(step.From)})
	}
	// EmitWaking: an approver named by pubkey gets a mention row and
	// listener outbox rows, so an agent approver is woken to act.
	if err := w.EmitWaking(ctx, KindApprovalRequested, message, tags, &channel); err != nil {
		return stepEnded, entry, nil, err
	}
	entry.Status = "waiting_approval"
	entry.Output = map[string]any{"approval_ref": ref}
	n, err := q.WorkflowRunAwaitApproval(ctx, db.WorkflowRunAwaitApprovalParams{
		NextStep: int32(index + 1), Trace: mustJSON([]traceEntry{entry}),
		CommunityID: c.Run.CommunityID, ID: c.Run.ID, ClaimID: c.ClaimID, Step: int32(index),
	})
	if err == nil && n == 0 {
		err = errLostClaim
	}
	return stepParked, entry, nil, err
}
