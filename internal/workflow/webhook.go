package workflow

import (
	"bytes"
	"context"
	"crypto/subtle"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net/http"
	"strconv"
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
	"github.com/buzzrelay/buzz/internal/outage"
	"github.com/buzzrelay/buzz/internal/workflow/safehttp"
)

// DefaultWebhookMaxBytes caps a webhook body. Its fields travel to agents
// as one compact JSON tag, so the cap keeps that tag bounded too.
const DefaultWebhookMaxBytes = 61440

// Webhooks serves POST /hooks/{id}: a caller holding the workflow's secret
// starts a run whose trigger context carries the body's top-level fields
// (untrusted cargo, never prose the relay vouches for).
type Webhooks struct {
	Pool     *pgxpool.Pool
	Clock    clock.Clock
	MaxBytes int64
	// Offer receives the new run's id and community after commit; may be
	// nil.
	Offer func(community uuid.UUID, ids []uuid.UUID)
	// MaxUnfinishedRuns bounds each workflow's unfinished runs; a call
	// beyond it records its run failed with capacity_exceeded and answers
	// 429 (0: the default).
	MaxUnfinishedRuns int
	// Metrics counts runs refused at capacity; may be nil.
	Metrics *Metrics
	// ReadSlot, when set, is waited for before the call's statements and
	// held until its answer: anyone may send calls, and the workflow is
	// read before the secret can be checked. An error answers 503.
	ReadSlot func(ctx context.Context) (release func(), err error)
	// Allow, when set, takes one token of the workflow owner's publish
	// rate (hex pubkey) for a call that passed every other check: the run
	// is the owner's by proxy, a row kept for the run retention whose steps
	// store events, so calls go no faster than the owner's own messages.
	// Refused, the call answers 429 with Retry-After and creates nothing.
	Allow func(community uuid.UUID, owner string) (ok bool, retryAfter time.Duration)
	// Log receives the cause of a call the database failed, which the
	// caller is answered only as "database unavailable"; nil: slog.Default.
	Log *slog.Logger
	// Outage, when set, takes a call failed by an unreachable database
	// instead of Log: logged once per outage, answered with Retry-After;
	// and one failed by a server refusing the relay's login: logged as the
	// outage log bounds it, answered without Retry-After.
	Outage *outage.Log
}

type webhookReply struct {
	RunID      string `json:"run_id"`
	WorkflowID string `json:"workflow_id"`
	Status     string `json:"status"`
	ErrorCode  string `json:"error_code,omitempty"`
	// Error explains a refusal at capacity, prefixed like every error
	// answer; the run itself is recorded failed.
	Error string `json:"error,omitempty"`
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

// webhookError answers msg, which carries its NIP-01 prefix (invalid:,
// auth-required:, rate-limited:, blocked:, error:) so a caller tells a
// refusal to fix from one to retry, as on every other route.
func webhookError(w http.ResponseWriter, status int, msg string) {
	writeJSON(w, status, map[string]string{"error": msg})
}

// MaxWebhookDepth bounds a chain of workflows started by each other's
// call_webhook steps through webhook triggers. A workflow whose step calls
// its own webhook (by mistake, or through a relay's public address) would
// otherwise start runs without end; each call carries its depth
// (safehttp.DepthHeader) and a webhook refuses one past the bound.
const MaxWebhookDepth = 4

// webhookDepth reads a call's depth header: 0 when absent (a caller that
// is no workflow), else the run it starts is that deep; past
// MaxWebhookDepth the call is refused with 508 Loop Detected.
func webhookDepth(header string) (int, int, string) {
	if header == "" {
		return 0, 0, ""
	}
	depth, err := strconv.Atoi(header)
	if err != nil || depth < 1 {
		return 0, http.StatusBadRequest, "invalid: " + safehttp.DepthHeader + " must be a positive integer"
	}
	if depth > MaxWebhookDepth {
		return 0, http.StatusLoopDetected, fmt.Sprintf("invalid: a chain of %d workflow webhook calls is longer than %d: a workflow's call_webhook step reaches its own (or a calling workflow's) webhook", depth, MaxWebhookDepth)
	}
	return depth, 0, ""
}

// Serve handles one webhook call for the community the request's host
// resolved to.
func (h *Webhooks) Serve(w http.ResponseWriter, r *http.Request, communityID uuid.UUID) {
	workflowID, err := uuid.Parse(r.PathValue("id"))
	if err != nil {
		webhookError(w, http.StatusBadRequest, "invalid: the workflow id is not a UUID")
		return
	}
	// The request's URL may carry the secret (?secret=): the log names the
	// workflow, never the URL.
	databaseFailed := func(err error) {
		if h.Outage.Failed(err, "workflow webhook call") {
			// Only an outage ends within the outage log's ping interval;
			// a refused login, which it logs too, is no wait's to end.
			if dberr.IsUnreachable(err) {
				w.Header().Set("Retry-After", "1")
			}
			webhookError(w, http.StatusServiceUnavailable, dberr.UnavailableAnswer)
			return
		}
		log := h.Log
		if log == nil {
			log = slog.Default()
		}
		if r.Context().Err() == nil {
			log.Error("workflow webhook call failed", "community", communityID, "workflow", workflowID, "err", err)
		}
		webhookError(w, http.StatusServiceUnavailable, dberr.UnavailableAnswer)
	}
	limit := h.MaxBytes
	if limit <= 0 {
		limit = DefaultWebhookMaxBytes
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, limit))
	var tooLarge *http.MaxBytesError
	if errors.As(err, &tooLarge) {
		webhookError(w, http.StatusRequestEntityTooLarge, "invalid: body larger than "+strconv.FormatInt(limit, 10)+" bytes")
		return
	}
	if err != nil {
		webhookError(w, http.StatusBadRequest, "invalid: could not read the body")
		return
	}
	if h.ReadSlot != nil {
		release, err := h.ReadSlot(r.Context())
		if err != nil {
			// The relay's busy answer, as its other HTTP routes give it.
			webhookError(w, http.StatusServiceUnavailable, "error: the relay is busy reading; try again shortly")
			return
		}
		defer release()
	}
	q := db.New(h.Pool)
	row, err := q.WorkflowGet(r.Context(), db.WorkflowGetParams{CommunityID: communityID, ID: workflowID, Now: h.Clock.SQL()})
	if err != nil && !dberr.IsNotFound(err) {
		databaseFailed(err)
		return
	}
	// An unknown workflow answers like a wrong secret: a caller without the
	// secret learns nothing about which workflows exist.
	secret := r.Header.Get("X-Webhook-Secret")
	if secret == "" {
		secret = r.URL.Query().Get("secret")
	}
	if err != nil || row.WebhookSecret == "" || subtle.ConstantTimeCompare([]byte(secret), []byte(row.WebhookSecret)) != 1 {
		webhookError(w, http.StatusUnauthorized, "auth-required: authentication failed")
		return
	}
	if row.TriggerOn != OnWebhook || !row.Enabled || row.Status != db.WorkflowStatusActive || row.DefinitionEventID == nil || row.ChannelID == nil {
		webhookError(w, http.StatusConflict, "invalid: workflow is not accepting webhook calls")
		return
	}
	if row.DefinitionExpired {
		webhookError(w, http.StatusConflict, "invalid: "+definitionExpired)
		return
	}
	// A deleted or archived channel's workflow could only start runs that
	// fail, in a history nobody may read any more. Read without the write
	// lock: this is no write transaction, and the run it starts checks the
	// channel again when it writes.
	access, err := ingest.ChannelAccessNow(r.Context(), q, db.ChannelAccessParams{CommunityID: communityID, ID: *row.ChannelID, Pubkey: row.OwnerPubkey})
	if err != nil && !dberr.IsNotFound(err) {
		databaseFailed(err)
		return
	}
	if err != nil || access.ArchivedAt != nil {
		webhookError(w, http.StatusConflict, "invalid: workflow is not accepting webhook calls")
		return
	}
	fields, msg := webhookFields(body)
	if msg != "" {
		webhookError(w, http.StatusBadRequest, "invalid: JSON body: "+msg)
		return
	}
	depth, status, msg := webhookDepth(r.Header.Get(safehttp.DepthHeader))
	if msg != "" {
		webhookError(w, status, msg)
		return
	}
	tc := TriggerContext{
		Depth:             depth,
		ChannelID:         row.ChannelID.String(),
		Timestamp:         strconv.FormatInt(h.Clock.Now().Unix(), 10),
		WebhookFields:     fields,
		DefinitionEventID: hex.EncodeToString(row.DefinitionEventID),
		Cause:             Cause{Kind: CauseWebhook},
	}
	var key *string
	if k := r.Header.Get("Idempotency-Key"); k != "" {
		if len(k) > 255 {
			webhookError(w, http.StatusBadRequest, "invalid: Idempotency-Key longer than 255 bytes")
			return
		}
		// HTTP lets a header carry any byte past 0x7f; the key is stored
		// as text, which PostgreSQL refuses unless it is UTF-8, and the
		// call then failed as 503 "database unavailable", which a caller
		// retries forever.
		if !utf8.ValidString(k) {
			webhookError(w, http.StatusBadRequest, "invalid: Idempotency-Key must be valid UTF-8")
			return
		}
		key = &k
	}
	if h.Allow != nil {
		if ok, retry := h.Allow(communityID, hex.EncodeToString(row.OwnerPubkey)); !ok {
			secs := max(int64(math.Ceil(retry.Seconds())), 1)
			w.Header().Set("Retry-After", strconv.FormatInt(secs, 10))
			webhookError(w, http.StatusTooManyRequests, fmt.Sprintf("rate-limited: the workflow owner's publish rate is spent; try again in %ds", secs))
			return
		}
	}
	var (
		runID  uuid.UUID
		queued bool
	)
	err = pgx.BeginFunc(r.Context(), h.Pool, func(tx pgx.Tx) error {
		var err error
		runID, queued, err = h.admit(r.Context(), db.New(tx), communityID, workflowID, tc, key)
		return err
	})
	if errors.Is(dberr.Interpret(err), dberr.ErrCommunityWriteFenced) {
		// The community's deletion fenced the run: gone for good, where a
		// 503 would have the caller retry until the host answers 404.
		webhookError(w, http.StatusGone, ingest.ErrCommunityBeingDeleted().Error())
		return
	}
	if err != nil {
		databaseFailed(err)
		return
	}
	reply := webhookReply{RunID: runID.String(), WorkflowID: workflowID.String(), Status: "pending"}
	if !queued {
		h.Metrics.refusedAtCapacity()
		reply.Status, reply.ErrorCode = "failed", string(CodeCapacityExceeded)
		reply.Error = "rate-limited: the workflow has its limit of unfinished runs; try again once some end"
		w.Header().Set("Retry-After", strconv.FormatInt(h.secondsUntilARunCanEnd(r.Context(), communityID, workflowID), 10))
		writeJSON(w, http.StatusTooManyRequests, reply)
		return
	}
	if h.Offer != nil {
		h.Offer(communityID, []uuid.UUID{runID})
	}
	writeJSON(w, http.StatusAccepted, reply)
}

// secondsUntilARunCanEnd is the Retry-After of a call refused at capacity:
// a slot frees only when one of the workflow's runs ends, and none can end
// before the soonest of them is due (a delayed run waits out its delay),
// so a retry sooner is refused again. At least 1 s; 1 s when the database
// cannot say.
func (h *Webhooks) secondsUntilARunCanEnd(ctx context.Context, communityID, workflowID uuid.UUID) int64 {
	row, err := db.New(h.Pool).WorkflowRunSoonestEnd(ctx, db.WorkflowRunSoonestEndParams{
		CommunityID: communityID, WorkflowID: workflowID, Now: h.Clock.SQL(),
	})
	if err != nil {
		return 1
	}
	return max(int64(math.Ceil(row.Soonest.Sub(row.Now).Seconds())), 1)
}

// admit returns the run an earlier call with the same idempotency key
// created, else admits a new one (which may be refused at capacity). The
// workflow row lock admitRun takes also orders concurrent calls with one
// key, so they see each other's run. It reports whether a new run was
// queued or an existing one found (queued is false only for a refusal).
func (h *Webhooks) admit(ctx context.Context, q *db.Queries, communityID, workflowID uuid.UUID, tc TriggerContext, key *string) (uuid.UUID, bool, error) {
	run := newRun{CommunityID: communityID, WorkflowID: workflowID, Context: tc, IdempotencyKey: key, Now: h.Clock.SQL()}
	if key == nil {
		return admitRun(ctx, q, run, h.MaxUnfinishedRuns)
	}
	n, err := q.WorkflowLockForRuns(ctx, db.WorkflowLockForRunsParams{CommunityID: communityID, ID: workflowID})
	if err == nil && n == 0 {
		err = errWorkflowGone
	}
	if err != nil {
		return uuid.Nil, false, err
	}
	existing, err := q.WorkflowRunByIdempotencyKey(ctx, db.WorkflowRunByIdempotencyKeyParams{
		CommunityID: communityID, WorkflowID: workflowID, IdempotencyKey: *key,
	})
	if err == nil {
		return existing, true, nil
	}
	if !dberr.IsNotFound(err) {
		return uuid.Nil, false, err
	}
	return admitRun(ctx, q, run, h.MaxUnfinishedRuns)
}

// webhookFields turns an optional JSON object body into string fields: a
// string as-is, anything else as its JSON text.
func webhookFields(body []byte) (map[string]string, string) {
	fields := map[string]string{}
	if len(bytes.TrimSpace(body)) == 0 {
		return fields, ""
	}
	var obj map[string]json.RawMessage
	if err := json.Unmarshal(body, &obj); err != nil {
		return nil, "must be a JSON object"
	}
	// The fields are stored in jsonb, which cannot hold NUL.
	const hasNUL = "fields must not contain NUL characters (\\u0000)"
	for k, raw := range obj {
		if strings.ContainsRune(k, 0) {
			return nil, hasNUL
		}
		var s string
		if json.Unmarshal(raw, &s) == nil {
			if strings.ContainsRune(s, 0) {
				return nil, hasNUL
			}
			fields[k] = s
			continue
		}
		var compact bytes.Buffer
		if err := json.Compact(&compact, raw); err != nil {
			return nil, "must be a JSON object"
		}
		fields[k] = compact.String()
	}
	return fields, ""
}
