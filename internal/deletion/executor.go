package deletion

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/buzzrelay/buzz/internal/community"
	"github.com/buzzrelay/buzz/internal/crossrelay"
	"github.com/buzzrelay/buzz/internal/db"
	"github.com/buzzrelay/buzz/internal/dberr"
	"github.com/buzzrelay/buzz/internal/media"
)

// Executor runs claimed deletion requests stage by stage.
type Executor struct {
	pool     *pgxpool.Pool
	store    media.Store   // nil: no object store is configured
	redis    *redis.Client // nil: Redis is not configured
	cfg      Config
	id       string
	mode     string
	progress func(Progress)
	log      *slog.Logger
}

// Options configure an Executor.
type Options struct {
	Pool  *pgxpool.Pool
	Store media.Store
	Redis *redis.Client
	// ID names this executor in leases and heartbeats; default
	// {hostname}:{pid}.
	ID string
	// Mode is "run" or "drain", recorded in the heartbeat table.
	Mode     string
	Config   Config
	Progress func(Progress) // optional
	Log      *slog.Logger   // optional
}

// DefaultExecutorID is {hostname or "buzz-admin"}:{pid}.
func DefaultExecutorID() string {
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "buzz-admin"
	}
	return fmt.Sprintf("%s:%d", host, os.Getpid())
}

// NewExecutor builds an executor.
func NewExecutor(o Options) *Executor {
	e := &Executor{pool: o.Pool, store: o.Store, redis: o.Redis, cfg: o.Config, id: o.ID, mode: o.Mode, progress: o.Progress, log: o.Log}
	if e.id == "" {
		e.id = DefaultExecutorID()
	}
	if e.mode == "" {
		e.mode = "run"
	}
	if e.log == nil {
		e.log = slog.New(slog.DiscardHandler)
	}
	if e.cfg.ManifestChunkKeys <= 0 {
		e.cfg = DefaultConfig()
	}
	return e
}

// Outcome is where a request stands after the executor let it go.
type Outcome struct {
	RequestID     uuid.UUID `json:"request_id"`
	Stage         string    `json:"stage"`
	RetryCount    int32     `json:"retry_count"`
	LastError     *string   `json:"last_error"`
	NextAttemptAt time.Time `json:"next_attempt_at"`
	BlockedReason *string   `json:"blocked_reason"`
}

// Failed reports whether the run ended short of finishing.
func (o Outcome) Failed() bool { return o.LastError != nil || o.BlockedReason != nil }

func outcomeOf(r db.CommunityDeletionRequest) Outcome {
	return Outcome{RequestID: r.ID, Stage: r.Stage, RetryCount: r.RetryCount, LastError: r.LastError,
		NextAttemptAt: r.NextAttemptAt, BlockedReason: r.BlockedReason}
}

// Progress is one report of a running deletion.
type Progress struct {
	RequestID      uuid.UUID `json:"request_id"`
	Stage          string    `json:"stage"`
	Step           string    `json:"step"`
	Chunk          int64     `json:"chunk"`
	Chunks         int64     `json:"chunks"`
	ObjectsDeleted int64     `json:"objects_deleted"`
	ObjectsTotal   int64     `json:"objects_total"`
	RowsDeleted    int64     `json:"rows_deleted"`
	RowsTotal      int64     `json:"rows_total"` // from the inventory; rows may have churned before the fence
	Generation     int64     `json:"lease_generation"`
}

// lease is this executor's claim on one request.
type lease struct {
	id        uuid.UUID
	owner     string
	gen       int64
	community uuid.UUID
}

// Run claims the request id and works it until it finishes, blocks, fails
// or ctx ends (a shutdown releases the claim without counting a failure).
func (e *Executor) Run(ctx context.Context, id uuid.UUID) (Outcome, error) {
	return e.claimAndExecute(ctx, &id)
}

// Drain works every runnable request, oldest due first, until none is
// left; it stops early after a request that failed.
func (e *Executor) Drain(ctx context.Context) ([]Outcome, error) {
	var outcomes []Outcome
	for ctx.Err() == nil {
		out, err := e.claimAndExecute(ctx, nil)
		if errors.Is(err, ErrNotRunnable) {
			return outcomes, nil
		}
		if err != nil {
			return outcomes, err
		}
		outcomes = append(outcomes, out)
		if out.Failed() {
			return outcomes, nil
		}
	}
	return outcomes, nil
}

func (e *Executor) claimAndExecute(ctx context.Context, id *uuid.UUID) (Outcome, error) {
	q := db.New(e.pool)
	row, err := q.DeletionRequestClaim(ctx, db.DeletionRequestClaimParams{ID: id, Owner: e.id, LeaseSeconds: e.cfg.Lease.Seconds()})
	if dberr.IsNotFound(err) {
		return Outcome{}, ErrNotRunnable
	}
	if err != nil {
		return Outcome{}, dberr.Interpret(err)
	}
	if row.BlockedAt != nil {
		return outcomeOf(row), nil // catalog validation blocked it
	}
	return e.execute(ctx, row)
}

// execute works one claimed request. A heartbeat keeps the lease; losing
// it cancels the stage in progress, and the lost owner records nothing
// (its successor owns the request and its retry policy).
func (e *Executor) execute(ctx context.Context, row db.CommunityDeletionRequest) (Outcome, error) {
	l := lease{id: row.ID, owner: e.id, gen: row.LeaseGeneration, community: row.CommunityID}
	q := db.New(e.pool)
	bg := context.WithoutCancel(ctx)
	_ = q.DeletionExecutorBeat(bg, db.DeletionExecutorBeatParams{ExecutorID: e.id, Mode: e.mode, RequestID: &l.id, Generation: &l.gen, Stage: &row.Stage})

	stageCtx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	beatDone := make(chan struct{})
	go func() {
		defer close(beatDone)
		e.heartbeat(stageCtx, l, cancel)
	}()
	stopBeat := func() {
		cancel(context.Canceled)
		<-beatDone
	}

	var stageErr error
	for Runnable(row.Stage) {
		stageErr = e.runStage(stageCtx, l, row)
		if stageErr != nil {
			break
		}
		// The stage committed: its result is read even if the heartbeat
		// gave up meanwhile (a request past its last stage cannot be
		// renewed), or a finished deletion would be reported as a lost
		// lease. A lease really lost stops the next stage.
		next, err := q.DeletionRequestGet(bg, l.id)
		if err != nil {
			stageErr = err
			break
		}
		row = next
	}
	cause := context.Cause(stageCtx)
	stopBeat()

	final := func() (Outcome, error) {
		r, err := q.DeletionRequestGet(bg, l.id)
		if err != nil {
			return outcomeOf(row), err
		}
		return outcomeOf(r), nil
	}
	switch {
	case stageErr == nil:
		_ = q.DeletionExecutorBeat(bg, db.DeletionExecutorBeatParams{ExecutorID: e.id, Mode: e.mode, RequestID: &l.id, Generation: &l.gen, Stage: &row.Stage, Stopped: true})
		return final()
	case errors.Is(cause, dberr.ErrDeletionLeaseLost) || errors.Is(dberr.Interpret(stageErr), dberr.ErrDeletionLeaseLost):
		e.log.Warn("deletion lease lost", "request", l.id, "generation", l.gen, "err", stageErr)
		out, _ := final()
		return out, fmt.Errorf("%w: %v", dberr.ErrDeletionLeaseLost, stageErr)
	case ctx.Err() != nil:
		// Shutdown: hand the request back for the next executor, no retry
		// counted.
		_ = q.DeletionExecutorBeat(bg, db.DeletionExecutorBeatParams{ExecutorID: e.id, Mode: e.mode, RequestID: &l.id, Generation: &l.gen, Stage: &row.Stage, Draining: true, Stopped: true})
		_, _ = q.DeletionRequestRelease(bg, db.DeletionRequestReleaseParams{ID: l.id, Owner: l.owner, Generation: l.gen})
		return final()
	}
	stageErr = dberr.Interpret(stageErr)
	isPermanent := errors.Is(stageErr, ErrPermanent) || errors.Is(stageErr, dberr.ErrDeletionSafety)
	e.log.Warn("deletion stage failed", "request", l.id, "stage", row.Stage, "permanent", isPermanent, "err", stageErr)
	_, err := q.DeletionRequestRecordFailure(bg, db.DeletionRequestRecordFailureParams{
		ID: l.id, Owner: l.owner, Generation: l.gen, Stage: row.Stage,
		Message: truncateUTF8(stageErr.Error(), maxErrorBytes), Permanent: isPermanent,
		BaseDelaySeconds: e.cfg.RetryBaseDelay.Seconds(), MaxStreak: int32(e.cfg.MaxFailureStreak),
	})
	_ = q.DeletionExecutorBeat(bg, db.DeletionExecutorBeatParams{ExecutorID: e.id, Mode: e.mode, RequestID: &l.id, Generation: &l.gen, Stage: &row.Stage, Stopped: true})
	if err != nil {
		out, _ := final()
		return out, dberr.Interpret(err)
	}
	return final()
}

// heartbeat renews the lease every sixth of its duration; a renewal that
// fails (lost, expired, blocked) cancels the stage with the lease-lost
// cause.
func (e *Executor) heartbeat(ctx context.Context, l lease, cancel context.CancelCauseFunc) {
	q := db.New(e.pool)
	t := time.NewTicker(e.cfg.Lease / 6)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		_, err := q.DeletionRequestHeartbeat(ctx, db.DeletionRequestHeartbeatParams{
			ID: l.id, Owner: l.owner, Generation: l.gen, Mode: e.mode, LeaseSeconds: e.cfg.Lease.Seconds()})
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			cancel(fmt.Errorf("%w: heartbeat: %v", dberr.ErrDeletionLeaseLost, err))
			return
		}
	}
}

// inTx runs fn in one READ COMMITTED transaction.
func (e *Executor) inTx(ctx context.Context, fn func(q *db.Queries, tx pgx.Tx) error) error {
	return dberr.Interpret(pgx.BeginFunc(ctx, e.pool, func(tx pgx.Tx) error { return fn(db.New(tx), tx) }))
}

func (e *Executor) report(p Progress) {
	if e.progress != nil {
		e.progress(p)
	}
}

// runStage re-validates the frozen inventory, then takes the request one
// stage forward.
func (e *Executor) runStage(ctx context.Context, l lease, row db.CommunityDeletionRequest) error {
	inv, err := DecodeInventory(row.InventoryManifest)
	if err != nil {
		return err
	}
	digest, err := inv.Digest()
	if err != nil {
		return err
	}
	if !slices.Equal(digest, row.InventoryDigest) {
		return permanent("the frozen inventory no longer hashes to its approved digest")
	}
	if listed := inv.Storage.MediaStore; listed != "" && listed != mediaStoreState(e.store) {
		// Blocked until an operator runs it with the settings the
		// inventory was taken with: without the store, the media would be
		// left behind as if deleted.
		return permanent("the approved inventory was taken with media store %q, this executor has %q: run it with the relays' BUZZ_MEDIA_* settings",
			listed, mediaStoreState(e.store))
	}
	want := media.CommunityPrefixes(row.CommunityID)
	if len(inv.Storage.Prefixes) != len(want) {
		return permanent("the inventory does not cover exactly the community's prefixes")
	}
	for i, p := range inv.Storage.Prefixes {
		if p.Prefix != want[i] || p.Class != ClassBinding {
			return permanent("the inventory names prefix %q, not the community's own", p.Prefix)
		}
	}
	e.report(Progress{RequestID: l.id, Stage: row.Stage, Step: "start", Generation: l.gen})
	switch row.Stage {
	case StageApproved:
		return e.fence(ctx, l, inv)
	case StageFenced:
		return e.drain(ctx, l, row)
	case StageDrained:
		return e.removeBindings(ctx, l, row)
	case StageBindingsRemoved:
		return e.purgePostgres(ctx, l, inv)
	case StagePostgresPurged:
		return e.purgeCache(ctx, l)
	case StageCachePurged:
		return e.verify(ctx, l, row)
	case StageLogicallyVerified:
		return e.finish(ctx, l)
	}
	return permanent("stage %s is not runnable", row.Stage)
}

// fence: the catalog still has the approved shape, then quiesce (no new
// serving writes), then fence once serving writes drained.
func (e *Executor) fence(ctx context.Context, l lease, inv Inventory) error {
	scoped, err := ScopedTables(ctx, e.pool)
	if err != nil {
		return err
	}
	fenced, err := FencedTables(ctx, e.pool)
	if err != nil {
		return err
	}
	if !slices.Equal(sortedCopy(scoped), inv.Schema.ScopedTables) || !slices.Equal(sortedCopy(fenced), inv.Schema.FencedTables) {
		return permanent("the community-scoped catalog changed since the inventory was approved (now scoped %v, fenced %v)", scoped, fenced)
	}
	if err := e.underFenceLockWait(ctx, l, func(q *db.Queries) error {
		return q.DeletionRequestBeginQuiescing(ctx, db.DeletionRequestBeginQuiescingParams{ID: l.id, Owner: l.owner, Generation: l.gen})
	}); err != nil {
		return err
	}
	return e.underFenceLockWait(ctx, l, func(q *db.Queries) error {
		_, err := q.DeletionRequestFence(ctx, db.DeletionRequestFenceParams{ID: l.id, Owner: l.owner, Generation: l.gen})
		return err
	})
}

// fenceLockWait bounds how long quiescing and the fence wait for the
// community's lock. While they wait, every session asking for that lock,
// even shared, queues behind them: the community's writers, and also the
// statements that read many communities' rows at once (the outbox and
// workflow-run claims, the reapers) as soon as they meet one of its rows,
// which stalls them for every community. A writer that never finishes (an
// idle open transaction, a relay cut off mid-commit) would make that
// stall last as long as it does; past the bound the step fails and is
// retried later, naming the cause.
const fenceLockWait = 5 * time.Second

// underFenceLockWait runs fn in one transaction whose lock waits end after
// fenceLockWait.
func (e *Executor) underFenceLockWait(ctx context.Context, l lease, fn func(q *db.Queries) error) error {
	err := e.inTx(ctx, func(q *db.Queries, tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, "-- name: DeletionFenceLockTimeout\nSELECT set_config('lock_timeout', $1, true)",
			fmt.Sprintf("%dms", fenceLockWait.Milliseconds())); err != nil {
			return err
		}
		return fn(q)
	})
	if dberr.IsLockTimeout(err) {
		return fmt.Errorf("community %s: a transaction writing to it held its lock for over %s; the fence retries later: %w",
			l.community, fenceLockWait, err)
	}
	return err
}

// drain: tell every relay to close the community's connections (again:
// the fence's commit already announced it, but a relay whose listening
// session was reconnecting then hears it now, not at its next sweep), then
// build and freeze the post-fence object manifest.
func (e *Executor) drain(ctx context.Context, l lease, row db.CommunityDeletionRequest) error {
	err := e.inTx(ctx, func(q *db.Queries, tx pgx.Tx) error {
		if _, err := q.DeletionRequestEnterExecutor(ctx, db.DeletionRequestEnterExecutorParams{ID: l.id, Owner: l.owner, Generation: l.gen, Stage: StageFenced}); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, "-- name: DeletionNotifyClosed\nSELECT pg_notify($1, $2)", community.ClosedChannel, l.community.String())
		return err
	})
	if err != nil {
		return err
	}
	if e.redis != nil {
		if err := e.redis.Publish(ctx, crossrelay.ControlChannel(l.community), crossrelay.DisconnectCommunity).Err(); err != nil {
			return fmt.Errorf("publish disconnect: %w", err)
		}
	}
	var summary StorageManifest
	if row.DestructiveManifest == nil {
		if summary, err = e.buildManifest(ctx, l); err != nil {
			return err
		}
		raw, err := json.Marshal(summary)
		if err != nil {
			return err
		}
		if err := db.New(e.pool).DeletionRequestFreezeObjects(ctx, db.DeletionRequestFreezeObjectsParams{ID: l.id, Owner: l.owner, Generation: l.gen, Manifest: raw}); err != nil {
			return err
		}
	} else if err := json.Unmarshal(row.DestructiveManifest, &summary); err != nil {
		return permanent("frozen object manifest does not decode: %v", err)
	}
	if err := summary.Validate(); err != nil {
		return err
	}
	var objects int64
	for _, p := range summary.Prefixes {
		objects += p.ObjectCount
	}
	detail, _ := json.Marshal(map[string]any{"objects": objects, "disconnect_notified": true, "redis_published": e.redis != nil})
	return db.New(e.pool).DeletionRequestMarkDrained(ctx, db.DeletionRequestMarkDrainedParams{ID: l.id, Owner: l.owner, Generation: l.gen, Detail: detail})
}
