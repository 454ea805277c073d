-- Approval requests of workflow runs. token is the SHA-256 of the raw
-- approval token; clients name an approval by its hex.

-- name: WorkflowApprovalCreate :exec
-- The expiry is on the database's clock, like created_at and the sweep
-- that expires it, not the relay's.
INSERT INTO workflow_approvals (community_id, token, workflow_id, run_id, step_id, step_index, approver_spec, expires_at, created_at)
VALUES (@community_id::uuid, @token::bytea, @workflow_id::uuid, @run_id::uuid, @step_id::text, @step_index::int,
        @approver_spec::text,
        coalesce(sqlc.narg('now')::timestamptz, now()) + interval '1 millisecond' * @timeout_ms::bigint,
        coalesce(sqlc.narg('now')::timestamptz, now()));

-- name: WorkflowApprovalGet :one
-- pinned_definition is the definition event (hex) the approval's run
-- executes: a decision is refused once the workflow moved on from it.
SELECT a.workflow_id, a.run_id, a.step_id, a.step_index, a.approver_spec, a.status, a.expires_at, w.channel_id,
       coalesce(r.trigger_context ->> 'definition_event_id', '')::text AS pinned_definition
FROM workflow_approvals a
JOIN workflows w ON w.community_id = a.community_id AND w.id = a.workflow_id
JOIN workflow_runs r ON r.community_id = a.community_id AND r.id = a.run_id
WHERE a.community_id = @community_id::uuid AND a.token = @token::bytea;

-- name: WorkflowApprovalLockForDecision :one
-- A decision locks its approval first, held to the end of its transaction,
-- and only then reads the workflow: an archive, a re-save or the owner's
-- removal (each updates the workflow row, then withdraws its pending
-- approvals) either withdrew this one before, and the decision, reading
-- the workflow after the lock, sees why, or waits for the decision to
-- commit and then finds it decided, not pending. No workflow row is locked:
-- triggers lock those (WorkflowLockForRuns), in id order per event but in
-- arrival order across a group's events, and a decision's lock on one
-- deadlocked with them.
SELECT status, expires_at
FROM workflow_approvals
WHERE community_id = @community_id::uuid AND token = @token::bytea
FOR NO KEY UPDATE;

-- name: WorkflowApprovalDecide :execrows
-- Grants or denies a pending, unexpired approval. Zero rows: someone else
-- decided it first, or it expired meanwhile.
UPDATE workflow_approvals
SET status = @status::workflow_approval_status,
    approver_pubkey = @approver::bytea,
    granted_at = CASE WHEN @status::workflow_approval_status = 'granted' THEN coalesce(sqlc.narg('now')::timestamptz, now()) END,
    denied_at = CASE WHEN @status::workflow_approval_status = 'denied' THEN coalesce(sqlc.narg('now')::timestamptz, now()) END
WHERE community_id = @community_id::uuid AND token = @token::bytea AND status = 'pending'
  AND expires_at > coalesce(sqlc.narg('now')::timestamptz, now());

-- name: WorkflowApprovalsClampExpiry :execrows
-- Pending approvals due later than @max_ms from now were asked for under a
-- timeout beyond the bound (saved before it existed): they expire
-- @max_ms after they were made. The partial pending-expiry index finds
-- them from its far end, so a sweep with none reads one entry.
UPDATE workflow_approvals
SET expires_at = created_at + interval '1 millisecond' * @max_ms::bigint
WHERE status = 'pending'
  AND expires_at > coalesce(sqlc.narg('now')::timestamptz, now()) + interval '1 millisecond' * @max_ms::bigint
  AND community_write_allowed(community_id);

-- name: WorkflowApprovalsExpire :many
-- Pending approvals past their expiry become expired; returns their runs.
UPDATE workflow_approvals
SET status = 'expired'
WHERE status = 'pending' AND expires_at <= coalesce(sqlc.narg('now')::timestamptz, now())
  -- A community being deleted is skipped (its deletion removes the rows).
  AND community_write_allowed(community_id)
RETURNING community_id, run_id;

-- name: WorkflowApprovalsExpireInChannel :many
-- A deleted channel's pending approvals expire at once: a decision is
-- stored in the channel, so nobody can decide them any more, and their runs
-- would wait out the approval's timeout (the owner's to choose, up to a week).
UPDATE workflow_approvals a
SET status = 'expired'
FROM workflows w
WHERE a.community_id = @community_id::uuid AND a.status = 'pending'
  AND w.community_id = a.community_id AND w.id = a.workflow_id AND w.channel_id = @channel_id::uuid
RETURNING a.run_id;

-- name: WorkflowApprovalsOfRun :many
SELECT token, workflow_id, run_id, step_id, step_index, approver_spec, status, approver_pubkey, note, expires_at, created_at
FROM workflow_approvals
WHERE community_id = @community_id::uuid AND run_id = @run_id::uuid
ORDER BY step_index, created_at;

-- name: WorkflowApprovalsWithdraw :many
-- The workflow was archived or saved again: its pending approvals can no
-- longer be decided (the run could only fail after a grant), so they end
-- now, in the same transaction, with the reason in note; returns their
-- runs, which the caller ends.
UPDATE workflow_approvals
SET status = 'expired', note = @note::text
WHERE community_id = @community_id::uuid AND workflow_id = @workflow_id::uuid AND status = 'pending'
RETURNING run_id;

-- name: WorkflowApprovalsWithdrawOfRemovedOwner :many
-- The owner left or was removed from the channel, and the removal's
-- trigger (workflows_disable_on_owner_removal) disabled their workflows
-- there: a decision of their pending approvals is refused, so they end now,
-- in the removal's transaction, with the reason in note; returns their
-- runs, which the caller ends.
UPDATE workflow_approvals a
SET status = 'expired', note = @note::text
FROM workflows w
WHERE a.community_id = @community_id::uuid AND a.status = 'pending'
  AND w.community_id = a.community_id AND w.id = a.workflow_id
  AND w.channel_id = @channel_id::uuid AND w.owner_pubkey = @owner_pubkey::bytea AND NOT w.enabled
RETURNING a.run_id;
