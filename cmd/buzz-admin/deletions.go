package main

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
	"golang.org/x/term"

	"github.com/buzzrelay/buzz/internal/community"
	"github.com/buzzrelay/buzz/internal/config"
	"github.com/buzzrelay/buzz/internal/db"
	"github.com/buzzrelay/buzz/internal/dberr"
	"github.com/buzzrelay/buzz/internal/deletion"
	"github.com/buzzrelay/buzz/internal/media"
)

// exitError ends the process with code after err (if any) was printed.
type exitError struct {
	code int
	err  error
}

func (e exitError) Error() string {
	if e.err == nil {
		return fmt.Sprintf("exit %d", e.code)
	}
	return e.err.Error()
}

func (e exitError) Unwrap() error { return e.err }

// Exit codes of `deletions`: a request that could not be claimed (blocked,
// leased by another executor, finished) is 5, a run that ended blocked or
// failed is 1.
const (
	exitRunFailed   = 1
	exitNotRunnable = 5
)

// requestJSON is the stable JSON shape of a deletion request.
type requestJSON struct {
	ID                  uuid.UUID       `json:"id"`
	CommunityID         uuid.UUID       `json:"community_id"`
	Host                string          `json:"host"`
	Stage               string          `json:"stage"`
	RequestedBy         string          `json:"requested_by"`
	Reason              *string         `json:"reason"`
	InventoryDigest     string          `json:"inventory_digest"`
	Inventory           json.RawMessage `json:"inventory,omitempty"`
	ObjectManifest      json.RawMessage `json:"object_manifest,omitempty"`
	FenceGeneration     *int64          `json:"fence_generation"`
	LeaseOwner          *string         `json:"lease_owner"`
	LeaseGeneration     int64           `json:"lease_generation"`
	LeaseUntil          *time.Time      `json:"lease_until"`
	Attempts            int32           `json:"attempts"`
	RetryCount          int32           `json:"retry_count"`
	NextAttemptAt       time.Time       `json:"next_attempt_at"`
	LastError           *string         `json:"last_error"`
	BlockedAt           *time.Time      `json:"blocked_at"`
	BlockedReason       *string         `json:"blocked_reason"`
	CreatedAt           time.Time       `json:"created_at"`
	UpdatedAt           time.Time       `json:"updated_at"`
	CompletedAt         *time.Time      `json:"completed_at"`
	Approval            *approvalJSON   `json:"approval,omitempty"`
	Checkpoints         []checkpointRow `json:"checkpoints,omitempty"`
	includeFullManifest bool
}

type approvalJSON struct {
	ApprovedBy      string    `json:"approved_by"`
	Note            *string   `json:"note"`
	InventoryDigest string    `json:"inventory_digest"`
	ApprovedAt      time.Time `json:"approved_at"`
}

type checkpointRow struct {
	Sequence        int64           `json:"sequence"`
	Stage           string          `json:"stage"`
	UnitKey         string          `json:"unit_key"`
	Status          string          `json:"status"`
	LeaseGeneration int64           `json:"lease_generation"`
	Attempts        int32           `json:"attempts"`
	Detail          json.RawMessage `json:"detail"`
	Error           *string         `json:"error"`
	StartedAt       time.Time       `json:"started_at"`
	CompletedAt     *time.Time      `json:"completed_at"`
}

func toRequestJSON(r db.CommunityDeletionRequest, full bool) requestJSON {
	out := requestJSON{ID: r.ID, CommunityID: r.CommunityID, Host: r.CommunityHost, Stage: r.Stage, RequestedBy: r.RequestedBy,
		Reason: r.Reason, InventoryDigest: hex.EncodeToString(r.InventoryDigest), FenceGeneration: r.FenceGeneration,
		LeaseOwner: r.LeaseOwner, LeaseGeneration: r.LeaseGeneration, LeaseUntil: r.LeaseUntil, Attempts: r.Attempts,
		RetryCount: r.RetryCount, NextAttemptAt: r.NextAttemptAt, LastError: r.LastError, BlockedAt: r.BlockedAt,
		BlockedReason: r.BlockedReason, CreatedAt: r.CreatedAt, UpdatedAt: r.UpdatedAt, CompletedAt: r.CompletedAt}
	if full {
		out.Inventory = r.InventoryManifest
		out.ObjectManifest = r.DestructiveManifest
	}
	return out
}

const deletionsUsage = `usage: buzz-admin deletions sweep
       buzz-admin deletions submit [--host HOST] --requested-by WHO [--reason WHY] [--without-media]
       buzz-admin deletions list [--limit N]
       buzz-admin deletions inspect ID
       buzz-admin deletions approve ID --approved-by WHO [--note NOTE]
       buzz-admin deletions unblock ID --unblocked-by WHO --reason WHY
       buzz-admin deletions run ID [--executor-id ID]
       buzz-admin deletions drain [--executor-id ID]`

func runDeletions(ctx context.Context, verb string, args []string, getenv func(string) string, out io.Writer) error {
	switch verb {
	case "sweep", "submit", "list", "inspect", "approve", "unblock", "run", "drain":
	default:
		// Deliberately no continuous worker: deletion runs only when an
		// operator starts it.
		return usageError{}
	}
	fs := flag.NewFlagSet("deletions "+verb, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	host := fs.String("host", "", "community host (default: the host of BUZZ_RELAY_URL)")
	requestedBy := fs.String("requested-by", "", "who asks for the deletion")
	reason := fs.String("reason", "", "why")
	withoutMedia := fs.Bool("without-media", false, "submit with no media store configured (the deployment stores no media)")
	limit := fs.Int("limit", 100, "requests to list (1..1000)")
	approvedBy := fs.String("approved-by", "", "who approves")
	note := fs.String("note", "", "approval note")
	unblockedBy := fs.String("unblocked-by", "", "who unblocks")
	executorID := fs.String("executor-id", "", "executor name in leases (default {hostname}:{pid})")
	// The request id comes first, flags after it.
	var positional []string
	for len(args) > 0 && !strings.HasPrefix(args[0], "-") {
		positional, args = append(positional, args[0]), args[1:]
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return err // -h or --help: the usage, on stdout, exit 0
		}
		// The flag package's own words name the flag: "flag provided but
		// not defined: -limt", "invalid value "x" for flag -limit: ...".
		return usageError{err.Error()}
	}
	if fs.NArg() > 0 {
		return usageError{}
	}
	needID := verb == "inspect" || verb == "approve" || verb == "unblock" || verb == "run"
	if (needID && len(positional) != 1) || (!needID && len(positional) != 0) {
		return usageError{}
	}
	// Flags are checked before any connection is tried.
	switch {
	case verb == "submit" && strings.TrimSpace(*requestedBy) == "":
		return usageError{"--requested-by is required"}
	case verb == "list" && (*limit < 1 || *limit > 1000):
		return usageError{"--limit must be from 1 to 1000"}
	case verb == "approve" && strings.TrimSpace(*approvedBy) == "":
		return usageError{"--approved-by is required"}
	case verb == "unblock" && strings.TrimSpace(*unblockedBy) == "":
		return usageError{"--unblocked-by is required"}
	case verb == "unblock" && strings.TrimSpace(*reason) == "":
		return usageError{"--reason is required"}
	}
	var id uuid.UUID
	if needID {
		var err error
		if id, err = uuid.Parse(positional[0]); err != nil {
			return usageError{fmt.Sprintf("%q is not a request id", positional[0])}
		}
	}

	pool, err := connectPool(ctx, getenv)
	if err != nil {
		return err
	}
	defer pool.Close()
	if err := checkPool(ctx, pool, verb != "list" && verb != "inspect"); err != nil {
		return err
	}
	q := db.New(pool)
	enc := json.NewEncoder(out)
	enc.SetIndent("", "  ")

	switch verb {
	case "submit":
		target := community.NormalizeHost(*host)
		if *host == "" {
			target = community.RelayURLAuthority(getenv("BUZZ_RELAY_URL"))
		}
		if target == "" {
			return errors.New("pass --host or set BUZZ_RELAY_URL")
		}
		svc, err := services(ctx, getenv, false)
		if err != nil {
			return err
		}
		defer svc.close()
		if svc.store == nil && !*withoutMedia {
			// Else the community's media would outlive a deletion that
			// reports itself complete.
			return errors.New("no media store is configured (BUZZ_MEDIA_STORE, BUZZ_MEDIA_DIR or BUZZ_MEDIA_S3_*): set them as the relays have them, or pass --without-media if this deployment stores no media")
		}
		req, err := deletion.Submit(ctx, pool, svc.store, target, *requestedBy, *reason)
		if err != nil {
			return err
		}
		return enc.Encode(toRequestJSON(req, true))
	case "list":
		rows, err := q.DeletionRequestList(ctx, int32(*limit))
		if err != nil {
			return err
		}
		list := make([]requestJSON, 0, len(rows))
		for _, r := range rows {
			list = append(list, toRequestJSON(r, false))
		}
		return enc.Encode(list)
	case "inspect":
		return inspect(ctx, q, id, enc)
	case "approve":
		if _, err := deletion.Approve(ctx, pool, id, *approvedBy, *note); err != nil {
			return err
		}
		return inspect(ctx, q, id, enc)
	case "unblock":
		if _, err := deletion.Unblock(ctx, pool, id, *unblockedBy, *reason); err != nil {
			return err
		}
		return inspect(ctx, q, id, enc)
	case "run", "drain":
		return runExecutor(ctx, verb, id, *executorID, pool, getenv, out)
	case "sweep":
		return sweep(ctx, q, getenv, enc)
	}
	return usageError{}
}

func inspect(ctx context.Context, q *db.Queries, id uuid.UUID, enc *json.Encoder) error {
	r, err := q.DeletionRequestGet(ctx, id)
	if dberr.IsNotFound(err) {
		return fmt.Errorf("no deletion request %s", id)
	}
	if err != nil {
		return err
	}
	out := toRequestJSON(r, true)
	if a, err := q.DeletionApprovalGet(ctx, id); err == nil {
		out.Approval = &approvalJSON{ApprovedBy: a.ApprovedBy, Note: a.Note, InventoryDigest: hex.EncodeToString(a.InventoryDigest), ApprovedAt: a.ApprovedAt}
	} else if !dberr.IsNotFound(err) {
		return err
	}
	cps, err := q.DeletionCheckpointsOfRequest(ctx, id)
	if err != nil {
		return err
	}
	out.Checkpoints = []checkpointRow{}
	for _, c := range cps {
		out.Checkpoints = append(out.Checkpoints, checkpointRow{Sequence: c.Sequence, Stage: c.Stage, UnitKey: c.UnitKey, Status: c.Status,
			LeaseGeneration: c.LeaseGeneration, Attempts: c.Attempts, Detail: c.Detail, Error: c.Error, StartedAt: c.StartedAt, CompletedAt: c.CompletedAt})
	}
	return enc.Encode(out)
}

// serviceSet is the media store and Redis client the settings name.
type serviceSet struct {
	store media.Store
	redis *redis.Client
}

func (s serviceSet) close() {
	if s.redis != nil {
		s.redis.Close()
	}
}

// services builds the object store (the relay's media settings) and, when
// BUZZ_REDIS_URL is set, a Redis client.
func services(ctx context.Context, getenv func(string) string, withRedis bool) (serviceSet, error) {
	cfg, err := config.FromEnv(getenv)
	if err != nil {
		return serviceSet{}, err
	}
	var s serviceSet
	if s.store, err = media.OpenStore(cfg); err != nil {
		return s, err
	}
	if withRedis && cfg.RedisURL != "" {
		opts, err := redis.ParseURL(cfg.RedisURL)
		if err != nil {
			return s, fmt.Errorf("BUZZ_REDIS_URL: %w", err)
		}
		opts.ContextTimeoutEnabled = true // a stalled Redis fails a call by its deadline
		s.redis = redis.NewClient(opts)
		if err := s.redis.Ping(ctx).Err(); err != nil {
			s.redis.Close()
			return serviceSet{}, fmt.Errorf("redis: %w", err)
		}
	}
	return s, nil
}

func runExecutor(ctx context.Context, verb string, id uuid.UUID, executorID string, pool *pgxpool.Pool, getenv func(string) string, out io.Writer) error {
	cfg, err := deletion.ConfigFromEnv(getenv)
	if err != nil {
		return err
	}
	svc, err := services(ctx, getenv, true)
	if err != nil {
		err = fmt.Errorf("deletion services: %w", err)
		// On record, without a lease: the operator fixes the setting and
		// unblocks. Only a request an executor could claim: blocking one
		// still waiting for its approval would make the approver's
		// `approve` fail ("not waiting for approval") over a setting of
		// this shell.
		if verb == "run" {
			if req, gerr := db.New(pool).DeletionRequestGet(ctx, id); gerr == nil && deletion.Runnable(req.Stage) {
				if _, berr := db.New(pool).DeletionRequestBlockPreclaim(ctx, db.DeletionRequestBlockPreclaimParams{ID: id, Message: err.Error()}); berr != nil {
					err = errors.Join(err, berr)
				}
			}
		}
		return exitError{code: exitRunFailed, err: err}
	}
	defer svc.close()
	display := newProgressDisplay(out)
	exec := deletion.NewExecutor(deletion.Options{Pool: pool, Store: svc.store, Redis: svc.redis, ID: executorID, Mode: verb,
		Config: cfg, Progress: display.update})
	var outcomes []deletion.Outcome
	if verb == "run" {
		o, err := exec.Run(ctx, id)
		if errors.Is(err, deletion.ErrNotRunnable) {
			display.finish()
			return exitError{code: exitNotRunnable, err: whyNotRunnable(ctx, db.New(pool), id)}
		}
		if err != nil {
			display.finish()
			return exitError{code: exitRunFailed, err: err}
		}
		outcomes = append(outcomes, o)
	} else if outcomes, err = exec.Drain(ctx); err != nil {
		display.finish()
		return exitError{code: exitRunFailed, err: err}
	}
	display.finish()
	if outcomes == nil {
		outcomes = []deletion.Outcome{}
	}
	if display.jsonLines {
		if err := json.NewEncoder(out).Encode(map[string]any{"outcomes": outcomes}); err != nil {
			return err
		}
	} else {
		enc := json.NewEncoder(out)
		enc.SetIndent("", "  ")
		if err := enc.Encode(outcomes); err != nil {
			return err
		}
	}
	for _, o := range outcomes {
		if o.Failed() {
			return exitError{code: exitRunFailed}
		}
	}
	return nil
}

// whyNotRunnable says what a run that could not claim request id found,
// and what to do: the claim only answers "nothing to claim", and an
// operator who cannot tell a finished request from one another executor
// holds (until when?) or one that waits for its approval does not know
// whether to wait, approve, unblock or stop.
func whyNotRunnable(ctx context.Context, q *db.Queries, id uuid.UUID) error {
	r, err := q.DeletionRequestGet(ctx, id)
	if dberr.IsNotFound(err) {
		return fmt.Errorf("no deletion request %s", id)
	}
	if err != nil {
		return fmt.Errorf("%w (and reading it: %w)", deletion.ErrNotRunnable, dberr.Interpret(err))
	}
	at := func(t time.Time) string { return t.UTC().Format(time.RFC3339) }
	var why string
	switch {
	case r.Stage == deletion.StageRetentionPending:
		why = "it is finished (stage retention_pending); a finished request is never run again"
	case r.BlockedAt != nil:
		// Before the approval advice: approve refuses a blocked request.
		why = fmt.Sprintf("it is blocked at stage %s since %s: %s; fix that, then `buzz-admin deletions unblock %s`", r.Stage, at(*r.BlockedAt), deref(r.BlockedReason), id)
	case r.Stage == deletion.StageSubmitted:
		// Approve takes only a frozen inventory; the requester's repeated
		// submit freezes it.
		why = fmt.Sprintf("its inventory never froze (stage submitted: the submit stopped first): repeat `buzz-admin deletions submit --host %s --requested-by %q`, then have someone else approve it", r.CommunityHost, r.RequestedBy)
	case r.Stage == deletion.StageInventoried:
		why = fmt.Sprintf("it is not approved yet (stage inventoried): `buzz-admin deletions approve %s --approved-by WHO`, by someone other than %s", id, r.RequestedBy)
	case r.LeaseOwner != nil && r.LeaseUntil != nil && r.LeaseUntil.Before(time.Now()):
		// The claim passes over a row a transaction holds: the lease check
		// holds it to the end of its step, so a lease that ran out with an
		// executor frozen inside a step is not taken over until that ends.
		why = fmt.Sprintf("executor %q's lease (generation %d) ran out at %s at stage %s, but a transaction still holds the request: "+
			"most likely that executor's, frozen inside a step (its lease check holds the request to the step's end); "+
			"the next run takes it over once that transaction ends: should the executor be gone or stuck, end its database session "+
			"(pg_stat_activity, pg_terminate_backend), then run again", *r.LeaseOwner, r.LeaseGeneration, at(*r.LeaseUntil), r.Stage)
	case r.LeaseOwner != nil && r.LeaseUntil != nil:
		why = fmt.Sprintf("executor %q holds its lease (generation %d) until %s at stage %s; should that executor be dead, run again after then", *r.LeaseOwner, r.LeaseGeneration, at(*r.LeaseUntil), r.Stage)
	case r.RetryCount > 0:
		why = fmt.Sprintf("it waits to retry stage %s until %s after %d failure(s), the last: %s", r.Stage, at(r.NextAttemptAt), r.RetryCount, deref(r.LastError))
	default:
		why = fmt.Sprintf("another executor was claiming it at that moment (stage %s): see `buzz-admin deletions inspect %s`", r.Stage, id)
	}
	return fmt.Errorf("deletion request %s cannot be run: %s", id, why)
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

// isTerminal reports whether w is a terminal.
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	return ok && term.IsTerminal(int(f.Fd()))
}
