package workflow

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"log/slog"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/buzzrelay/buzz/internal/clock"
	"github.com/buzzrelay/buzz/internal/db"
	"github.com/buzzrelay/buzz/internal/dberr"
	"github.com/buzzrelay/buzz/internal/ingest"
	"github.com/buzzrelay/buzz/internal/nostr"
)

// Approval kinds.
const (
	KindApprovalRequested = 46010 // relay-signed: a run waits for approval
	KindApprovalGranted   = 46011 // relay-signed: the approval was granted
	KindApprovalDenied    = 46012 // relay-signed: the approval was denied
	KindApprovalGrant     = 46030
	KindApprovalDeny      = 46031
)

// RelayOnlyKinds are the run lifecycle and approval notices only the relay
// signs (46001-46012); clients may not publish them.
func relayOnlyKinds() []int {
	var kinds []int
	for k := 46001; k <= 46012; k++ {
		kinds = append(kinds, k)
	}
	return kinds
}

// approvalRef reads the approval's stored hash (hex) from the d tag, else
// an e tag.
func approvalRef(ev *nostr.Event) ([32]byte, error) {
	tag := ev.Tags.First("d")
	if tag == nil {
		tag = ev.Tags.First("e")
	}
	if tag == nil {
		return [32]byte{}, ingest.Reject("invalid", "missing d tag (approval reference)")
	}
	ref, ok := nostr.DecodeHex32(tag[1])
	if !ok {
		return [32]byte{}, ingest.Reject("invalid", "bad approval reference format")
	}
	return ref, nil
}

func validateDecision(ev *nostr.Event) error {
	_, err := approvalRef(ev)
	return err
}

type decision struct {
	token    [32]byte
	approval db.WorkflowApprovalGetRow
}

// ApprovalHandler is the handler of a grant (46030) or deny (46031).
func (t *Triggers) ApprovalHandler(kind int) ingest.Handler {
	return ingest.Handler{Validate: validateDecision, Prepare: t.prepareDecision, Apply: func(ctx context.Context, w *ingest.Write) error {
		return t.applyDecision(ctx, w, kind == KindApprovalGrant)
	}}
}

func (t *Triggers) prepareDecision(ctx context.Context, w *ingest.Write) error {
	token, _ := approvalRef(w.Event)
	a, err := w.Q.WorkflowApprovalGet(ctx, db.WorkflowApprovalGetParams{CommunityID: w.Tenant.ID(), Token: token[:]})
	if dberr.IsNotFound(err) {
		return ingest.Reject("invalid", "approval not found")
	}
	if err != nil {
		return err
	}
	// The decision is stored in the run's channel: the decider must be
	// allowed to write there like any event with an h tag ("any" approver
	// means any such writer). One who may not is told what an unknown
	// reference gets, before anything about the approval is revealed.
	if a.ChannelID != nil {
		if err := bindWriteOrHide(ctx, w, *a.ChannelID, "approval not found"); err != nil {
			return err
		}
	}
	switch spec := strings.TrimSpace(a.ApproverSpec); {
	case spec == "" || spec == "any":
	case len(spec) == 64 && isHex(spec):
		if !strings.EqualFold(spec, w.Actor) {
			return ingest.Reject("restricted", "not the approver of this step")
		}
	default:
		// Roles and @mentions are not resolved yet: fail closed.
		return ingest.Reject("restricted", "approver spec '%s' is not yet supported", spec)
	}
	// Lock order: the approval, then (applyDecision) its run; never a
	// workflow row. Every transaction that ends a wait for an approval
	// takes the same order after the workflow rows it changes (archive,
	// re-save, owner removal: workflow, approvals, runs; the expiry sweep:
	// approvals, runs), and triggers take only workflow rows (in id order),
	// so a decision deadlocks with none of them.
	locked, err := w.Q.WorkflowApprovalLockForDecision(ctx, db.WorkflowApprovalLockForDecisionParams{CommunityID: w.Tenant.ID(), Token: token[:]})
	if dberr.IsNotFound(err) {
		return ingest.Reject("invalid", "approval not found") // its run was deleted meanwhile
	}
	if err != nil {
		return err
	}
	a.Status, a.ExpiresAt = locked.Status, locked.ExpiresAt
	if err := decidable(ctx, w, a); err != nil {
		return err
	}
	if a.Status != db.WorkflowApprovalStatusPending {
		return ingest.Reject("invalid", "approval already %s", a.Status)
	}
	if !a.ExpiresAt.After(w.Now()) {
		return ingest.Reject("invalid", "approval token has expired")
	}
	w.SetState(&decision{token: token, approval: a})
	return nil
}

// decidable refuses a decision its run could no longer act on: the
// workflow was archived or disabled, saved again (the run executes the
// definition it started under, now replaced), or the definition event
// deleted. Accepted, the grant would make the run due only for it to fail
// at its next step. The caller holds the approval's row lock
// (WorkflowApprovalLockForDecision), and the workflow is read after it, in
// a statement of its own: an archive, a re-save or the owner's removal
// racing the decision either withdrew the approval first, and its change
// of the workflow is seen here, or waits for the decision to commit (and
// then finds the approval decided, not pending).
func decidable(ctx context.Context, w *ingest.Write, a db.WorkflowApprovalGetRow) error {
	wf, err := w.Q.WorkflowGet(ctx, db.WorkflowGetParams{CommunityID: w.Tenant.ID(), ID: a.WorkflowID, Now: w.SQLNow()})
	if err != nil {
		return err
	}
	switch {
	case wf.Status != db.WorkflowStatusActive:
		return ingest.Reject("invalid", "the workflow was archived; its run no longer waits for this approval")
	case !wf.Enabled:
		return ingest.Reject("invalid", "the workflow is disabled (its owner is no longer a member of the channel); its run no longer waits for this approval")
	case hex.EncodeToString(wf.DefinitionEventID) != a.PinnedDefinition:
		return ingest.Reject("invalid", "the workflow was saved again since this approval was requested; its run no longer waits for it")
	}
	pinned, ok := nostr.DecodeHex32(a.PinnedDefinition)
	if !ok || a.ChannelID == nil {
		return ingest.Reject("invalid", "the workflow's definition was deleted; its run cannot go on")
	}
	ev, err := w.Q.EventWorkflowDefinition(ctx, db.EventWorkflowDefinitionParams{CommunityID: w.Tenant.ID(), ID: pinned[:], ChannelID: *a.ChannelID, Now: w.SQLNow()})
	if dberr.IsNotFound(err) {
		return ingest.Reject("invalid", "the workflow's definition was deleted; its run cannot go on")
	}
	if err == nil && ev.Expired {
		return ingest.Reject("invalid", "the workflow's definition expired (NIP-40); its run cannot go on")
	}
	return err
}

// withdrawApprovals ends, in w's transaction, the waits of workflow's runs
// for an approval: the workflow was archived or saved again, so a grant
// could only fail the run at its next step. The approvals expire with the
// reason as their note, and their runs end failed with code.
func (t *Triggers) withdrawApprovals(ctx context.Context, w *ingest.Write, workflow uuid.UUID, code ErrorCode, reason string) error {
	runs, err := w.Q.WorkflowApprovalsWithdraw(ctx, db.WorkflowApprovalsWithdrawParams{CommunityID: w.Tenant.ID(), WorkflowID: workflow, Note: reason})
	if err != nil {
		return err
	}
	return t.endWithdrawnRuns(ctx, w, runs, code, reason)
}

// endWithdrawnRuns fails, in w's transaction, the waiting runs whose
// approvals were withdrawn, with code and reason, each counted once w
// commits.
func (t *Triggers) endWithdrawnRuns(ctx context.Context, w *ingest.Write, runs []uuid.UUID, code ErrorCode, reason string) error {
	for _, run := range runs {
		ended, err := w.Q.WorkflowRunApprovalEnded(ctx, db.WorkflowRunApprovalEndedParams{
			Status: db.WorkflowRunStatusFailed, ErrorCode: string(code), ErrorMessage: reason,
			CommunityID: w.Tenant.ID(), ID: run, Now: w.SQLNow(),
		})
		if err != nil {
			return err
		}
		for _, created := range ended {
			took := w.Now().Sub(created)
			w.AfterCommit(func() { t.Metrics.runOver(string(db.WorkflowRunStatusFailed), code, took) })
		}
	}
	return nil
}

func isHex(s string) bool {
	_, err := hex.DecodeString(s)
	return err == nil
}

func (t *Triggers) applyDecision(ctx context.Context, w *ingest.Write, grant bool) error {
	d := w.State().(*decision)
	status, word := db.WorkflowApprovalStatusDenied, "denied"
	if grant {
		status, word = db.WorkflowApprovalStatusGranted, "granted"
	}
	n, err := w.Q.WorkflowApprovalDecide(ctx, db.WorkflowApprovalDecideParams{
		Status: status, Approver: w.ActorBytes(), Now: w.SQLNow(), CommunityID: w.Tenant.ID(), Token: d.token[:],
	})
	if err != nil {
		return err
	}
	if n == 0 {
		return ingest.Reject("invalid", "approval already acted on (race)")
	}
	run := d.approval.RunID
	if grant {
		if _, err := w.Q.WorkflowRunApprovalGranted(ctx, db.WorkflowRunApprovalGrantedParams{CommunityID: w.Tenant.ID(), ID: run, Now: w.SQLNow()}); err != nil {
			return err
		}
		t.offerAfterCommit(w, []uuid.UUID{run})
	} else {
		ended, err := w.Q.WorkflowRunApprovalEnded(ctx, db.WorkflowRunApprovalEndedParams{
			Status: db.WorkflowRunStatusCancelled, ErrorCode: string(CodeApprovalDenied),
			ErrorMessage: "workflow cancelled: approval denied by " + w.Actor, CommunityID: w.Tenant.ID(), ID: run, Now: w.SQLNow(),
		})
		if err != nil {
			return err
		}
		for _, created := range ended {
			took := w.Now().Sub(created)
			w.AfterCommit(func() { t.Metrics.runOver(string(db.WorkflowRunStatusCancelled), CodeApprovalDenied, took) })
		}
	}
	if err := emitDecision(ctx, w, d, grant); err != nil {
		return err
	}
	body, _ := json.Marshal(map[string]string{"status": word, "run_id": run.String()})
	w.Reply("response:" + string(body))
	return nil
}

// emitDecision tells the channel, in the decision's transaction, that the
// approval its 46010 asked for was granted (46011) or denied (46012): a
// relay-signed event that names the approval by the same hash, the run and
// step, and the approver's signed decision event (e), which is the
// evidence; the relay's notice is never authority on its own. It p-tags
// nobody and wakes nobody: the approver acted, and the run itself goes on
// (or ends) without anyone being paged.
func emitDecision(ctx context.Context, w *ingest.Write, d *decision, grant bool) error {
	if w.ChannelID == nil {
		return nil // a workflow without a channel has no one to tell
	}
	kind := KindApprovalDenied
	if grant {
		kind = KindApprovalGranted
	}
	tags := nostr.Tags{
		{"workflow-run", d.approval.RunID.String()},
		{"workflow-step", d.approval.StepID},
		{"approval", hex.EncodeToString(d.token[:])},
		{"e", w.Event.ID},
		{"h", w.ChannelID.String()},
		{"buzz:workflow", DoorbellMarker},
	}
	return w.Emit(ctx, kind, "", tags, w.ChannelID)
}

// ExpireApprovals marks pending approvals past their expiry expired and
// fails their waiting runs with approval_expired, counted in m (may be
// nil) once committed; it returns how many approvals expired.
//
// Approvals due later than MaxApprovalTimeout from now (asked for under a
// definition saved before the bound) are first clamped to expire
// MaxApprovalTimeout after they were made, logged on log (nil: the default).
func ExpireApprovals(ctx context.Context, pool *pgxpool.Pool, clk clock.Clock, m *Metrics, log *slog.Logger) (int, error) {
	if log == nil {
		log = slog.Default()
	}
	var expired int
	var took []time.Duration
	var clamped int64
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		q := db.New(tx)
		var err error
		if clamped, err = q.WorkflowApprovalsClampExpiry(ctx, db.WorkflowApprovalsClampExpiryParams{
			Now: clk.SQL(), MaxMs: MaxApprovalTimeout.Milliseconds(),
		}); err != nil {
			return err
		}
		rows, err := q.WorkflowApprovalsExpire(ctx, clk.SQL())
		if err != nil {
			return err
		}
		for _, r := range rows {
			ended, err := q.WorkflowRunApprovalEnded(ctx, db.WorkflowRunApprovalEndedParams{
				Status: db.WorkflowRunStatusFailed, ErrorCode: string(CodeApprovalExpired),
				ErrorMessage: "the approval expired before anyone decided", CommunityID: r.CommunityID, ID: r.RunID, Now: clk.SQL(),
			})
			if err != nil {
				return err
			}
			for _, created := range ended {
				took = append(took, clk.Now().Sub(created))
			}
		}
		expired = len(rows)
		return nil
	})
	if err != nil {
		return 0, err
	}
	if clamped > 0 {
		log.Warn("workflow approvals due beyond the maximum timeout; clamped", "approvals", clamped, "max", MaxApprovalTimeout)
	}
	for _, d := range took {
		m.runOver(string(db.WorkflowRunStatusFailed), CodeApprovalExpired, d)
	}
	return expired, nil
}

// ChannelDeletion ends the waits of a deleted channel's runs for an
// approval (side rows of the channel's deletion, kind 9008): the approvals
// expire and their runs fail with approval_expired in the deletion's
// transaction. A decision is stored in the channel, so once it is gone
// nobody can decide, and the runs would wait out the approval's timeout,
// which the owner chooses, up to a week.
func (t *Triggers) ChannelDeletion() ingest.SideRows {
	return ingest.SideRows{
		Needs: func(ev *nostr.Event) bool { return ev.Kind == ingest.KindDeleteGroup },
		Apply: t.expireDeletedChannelsApprovals,
	}
}

func (t *Triggers) expireDeletedChannelsApprovals(ctx context.Context, w *ingest.Write) error {
	if w.ChannelID == nil {
		return nil
	}
	runs, err := w.Q.WorkflowApprovalsExpireInChannel(ctx, db.WorkflowApprovalsExpireInChannelParams{CommunityID: w.Tenant.ID(), ChannelID: *w.ChannelID})
	if err != nil {
		return err
	}
	for _, run := range runs {
		ended, err := w.Q.WorkflowRunApprovalEnded(ctx, db.WorkflowRunApprovalEndedParams{
			Status: db.WorkflowRunStatusFailed, ErrorCode: string(CodeApprovalExpired),
			ErrorMessage: "the channel was deleted before anyone decided the approval", CommunityID: w.Tenant.ID(), ID: run, Now: w.SQLNow(),
		})
		if err != nil {
			return err
		}
		for _, created := range ended {
			took := w.Now().Sub(created)
			w.AfterCommit(func() { t.Metrics.runOver(string(db.WorkflowRunStatusFailed), CodeApprovalExpired, took) })
		}
	}
	return nil
}

// ownerLeftReason is the note of an approval withdrawn because its
// workflow's owner left or was removed from the channel, and the
// diagnostic of its run.
const ownerLeftReason = "the workflow was disabled while the run waited for approval: its owner is no longer a member of the channel"

// OwnerRemoval ends the waits for an approval of the workflows a member's
// leaving (9022) or removal (9001) disabled (side rows of the removal): in
// its transaction, after the database's trigger
// (workflows_disable_on_owner_removal) disabled the owner's workflows in
// the channel, their pending approvals expire with the reason as note and
// their runs fail with workflow_disabled, as when the workflow is archived.
// A decision of such an approval is refused, so the run would otherwise
// wait, for nothing, until its approval expired (up to a week).
func (t *Triggers) OwnerRemoval() ingest.SideRows {
	return ingest.SideRows{
		Needs: func(ev *nostr.Event) bool {
			return ev.Kind == ingest.KindLeaveRequest || ev.Kind == ingest.KindRemoveUser
		},
		Apply: t.withdrawRemovedOwnersApprovals,
	}
}

func (t *Triggers) withdrawRemovedOwnersApprovals(ctx context.Context, w *ingest.Write) error {
	if w.ChannelID == nil {
		return nil
	}
	removed := w.ActorBytes()
	if w.Event.Kind == ingest.KindRemoveUser {
		// Validated: exactly one p tag, a 64-hex pubkey (read as the
		// removal read it).
		target, err := hex.DecodeString(w.Event.Tags.First("p")[1])
		if err != nil {
			return err
		}
		removed = target
	}
	runs, err := w.Q.WorkflowApprovalsWithdrawOfRemovedOwner(ctx, db.WorkflowApprovalsWithdrawOfRemovedOwnerParams{
		CommunityID: w.Tenant.ID(), ChannelID: *w.ChannelID, OwnerPubkey: removed, Note: ownerLeftReason,
	})
	if err != nil {
		return err
	}
	return t.endWithdrawnRuns(ctx, w, runs, CodeWorkflowDisabled, ownerLeftReason)
}
