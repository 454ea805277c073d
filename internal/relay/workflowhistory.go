package relay

import (
	"encoding/hex"
	"encoding/json"
	"net/http"
	"strconv"
	"time"

	"github.com/google/uuid"

	"github.com/buzzrelay/buzz/internal/community"
	"github.com/buzzrelay/buzz/internal/db"
	"github.com/buzzrelay/buzz/internal/dberr"
)

// Run-history pages: the default and the largest page a reader may ask for.
const (
	defaultRunsPage = 20
	maxRunsPage     = 100
)

type runWire struct {
	ID             string          `json:"id"`
	WorkflowID     string          `json:"workflow_id"`
	Status         string          `json:"status"`
	CurrentStep    int32           `json:"current_step"`
	ExecutionTrace json.RawMessage `json:"execution_trace"`
	StartedAt      *int64          `json:"started_at"`
	CompletedAt    *int64          `json:"completed_at"`
	ErrorCode      *string         `json:"error_code"`
	ErrorMessage   *string         `json:"error_message"`
	CreatedAt      int64           `json:"created_at"`
}

type runsCursor struct {
	Before   string `json:"before"`
	BeforeID string `json:"before_id"`
}

// approvalWire never carries a field named token: the stored hash is a
// reference for display, not a credential to hand around.
type approvalWire struct {
	ApprovalRef    string  `json:"approval_ref"`
	WorkflowID     string  `json:"workflow_id"`
	RunID          string  `json:"run_id"`
	StepID         string  `json:"step_id"`
	StepIndex      int32   `json:"step_index"`
	ApproverSpec   string  `json:"approver_spec"`
	Status         string  `json:"status"`
	ApproverPubkey *string `json:"approver_pubkey"`
	Note           *string `json:"note"`
	ExpiresAt      string  `json:"expires_at"`
	CreatedAt      int64   `json:"created_at"`
}

func unixOrNil(t *time.Time) *int64 {
	if t == nil {
		return nil
	}
	u := t.Unix()
	return &u
}

// workflowReadable authenticates the caller (NIP-98) and requires that it
// can read the workflow's channel right now. ok false: already answered.
// ok true: the caller holds a read slot for the request's statements
// (anyone may sign one) and gives it back with release.
func (b *httpBridge) workflowReadable(w http.ResponseWriter, r *http.Request, tenant community.Tenant, workflowID uuid.UUID) (release func(), ok bool) {
	s := b.s
	pubkey, _, ok := b.authenticate(w, r, tenant)
	if !ok {
		return nil, false
	}
	release, err := s.readSlot(r.Context())
	if err != nil {
		writeError(w, http.StatusServiceUnavailable, busyReadingReason)
		return nil, false
	}
	if !b.channelOfWorkflowReadable(w, r, tenant, workflowID, pubkey) {
		release()
		return nil, false
	}
	return release, true
}

func (b *httpBridge) channelOfWorkflowReadable(w http.ResponseWriter, r *http.Request, tenant community.Tenant, workflowID uuid.UUID, pubkey string) bool {
	s := b.s
	row, err := s.queries.WorkflowGet(r.Context(), db.WorkflowGetParams{CommunityID: tenant.ID(), ID: workflowID})
	if dberr.IsNotFound(err) {
		writeError(w, http.StatusNotFound, "invalid: workflow not found")
		return false
	}
	if err != nil {
		s.databaseFailed(w, r, err, "workflow lookup")
		return false
	}
	readable, err := s.access.Readable(r.Context(), tenant.ID(), pubkey)
	if err != nil {
		s.databaseFailed(w, r, err, "workflow channel access")
		return false
	}
	// A workflow the caller cannot read answers as an unknown one, so the
	// answer does not tell whether a private channel's workflow exists.
	// One without a channel is readable by nobody.
	if row.ChannelID == nil || !readable.Has(*row.ChannelID) {
		writeError(w, http.StatusNotFound, "invalid: workflow not found")
		return false
	}
	return true
}

// serveWorkflowRuns: GET /workflows/{id}/runs?before=&before_id=&limit=.
func (b *httpBridge) serveWorkflowRuns(w http.ResponseWriter, r *http.Request, tenant community.Tenant) {
	workflowID, err := uuid.Parse(r.PathValue("id"))
	if err != nil {
		writeError(w, http.StatusBadRequest, "invalid: the workflow id is not a UUID")
		return
	}
	q := r.URL.Query()
	params := db.WorkflowRunsPageParams{CommunityID: tenant.ID(), WorkflowID: workflowID}
	before, beforeID := q.Get("before"), q.Get("before_id")
	if (before == "") != (beforeID == "") {
		writeError(w, http.StatusBadRequest, "invalid: before and before_id must be supplied together")
		return
	}
	if before != "" {
		at, err1 := time.Parse(time.RFC3339Nano, before)
		id, err2 := uuid.Parse(beforeID)
		if err1 != nil || err2 != nil {
			writeError(w, http.StatusBadRequest, "invalid: before must be RFC3339 and before_id a UUID")
			return
		}
		params.Before, params.BeforeID = &at, &id
	}
	limit := defaultRunsPage
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > maxRunsPage {
			writeError(w, http.StatusBadRequest, "invalid: limit must be between 1 and 100")
			return
		}
		limit = n
	}
	release, ok := b.workflowReadable(w, r, tenant, workflowID)
	if !ok {
		return
	}
	defer release()
	params.MaxRows = int32(limit + 1)
	rows, err := b.s.queries.WorkflowRunsPage(r.Context(), params)
	if err != nil {
		b.s.databaseFailed(w, r, err, "workflow runs page")
		return
	}
	var next *runsCursor
	if len(rows) > limit {
		rows = rows[:limit]
		last := rows[limit-1]
		next = &runsCursor{Before: last.CreatedAt.UTC().Format(time.RFC3339Nano), BeforeID: last.ID.String()}
	}
	runs := make([]runWire, len(rows))
	for i, row := range rows {
		runs[i] = runWire{
			ID: row.ID.String(), WorkflowID: row.WorkflowID.String(), Status: string(row.Status), CurrentStep: row.CurrentStep,
			ExecutionTrace: row.ExecutionTrace, StartedAt: unixOrNil(row.StartedAt), CompletedAt: unixOrNil(row.CompletedAt),
			ErrorCode: row.ErrorCode, ErrorMessage: row.ErrorMessage, CreatedAt: row.CreatedAt.Unix(),
		}
	}
	writeJSON(w, http.StatusOK, map[string]any{"runs": runs, "next": next})
}

// serveWorkflowApprovals: GET /workflows/{id}/runs/{run_id}/approvals.
func (b *httpBridge) serveWorkflowApprovals(w http.ResponseWriter, r *http.Request, tenant community.Tenant) {
	workflowID, err1 := uuid.Parse(r.PathValue("id"))
	runID, err2 := uuid.Parse(r.PathValue("run_id"))
	if err1 != nil || err2 != nil {
		writeError(w, http.StatusBadRequest, "invalid: the workflow or run id is not a UUID")
		return
	}
	release, ok := b.workflowReadable(w, r, tenant, workflowID)
	if !ok {
		return
	}
	defer release()
	owner, err := b.s.queries.WorkflowRunOf(r.Context(), db.WorkflowRunOfParams{CommunityID: tenant.ID(), ID: runID})
	if dberr.IsNotFound(err) || (err == nil && owner != workflowID) {
		writeError(w, http.StatusNotFound, "invalid: workflow run not found")
		return
	}
	if err != nil {
		b.s.databaseFailed(w, r, err, "workflow run lookup")
		return
	}
	rows, err := b.s.queries.WorkflowApprovalsOfRun(r.Context(), db.WorkflowApprovalsOfRunParams{CommunityID: tenant.ID(), RunID: runID})
	if err != nil {
		b.s.databaseFailed(w, r, err, "workflow approvals")
		return
	}
	out := make([]approvalWire, len(rows))
	for i, a := range rows {
		var approver *string
		if a.ApproverPubkey != nil {
			h := hex.EncodeToString(a.ApproverPubkey)
			approver = &h
		}
		out[i] = approvalWire{
			ApprovalRef: hex.EncodeToString(a.Token), WorkflowID: a.WorkflowID.String(), RunID: a.RunID.String(),
			StepID: a.StepID, StepIndex: a.StepIndex, ApproverSpec: a.ApproverSpec, Status: string(a.Status),
			ApproverPubkey: approver, Note: a.Note, ExpiresAt: a.ExpiresAt.UTC().Format(time.RFC3339), CreatedAt: a.CreatedAt.Unix(),
		}
	}
	writeJSON(w, http.StatusOK, map[string]any{"approvals": out})
}
