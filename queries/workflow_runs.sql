-- Workflow runs after creation: the claims are rendered from
-- queries/templates/workflow_run_claim.sql.tmpl; every transition here is
-- fenced by (id, claim_id, status = 'running').

-- name: WorkflowRunCreate :one
-- A trigger's run, admitted against the workflow's bound on unfinished
-- runs. The caller holds WorkflowLockForRuns, so the count below sees every
-- run a concurrent trigger of the same workflow created: under the bound
-- the run is queued (pending, due now); at the bound it is recorded failed
-- at once with the capacity code and diagnostic, so it shows in run history
-- and metrics instead of growing the queue. A refused run keeps no
-- idempotency key: the caller may retry with the same key later.
INSERT INTO workflow_runs (community_id, id, workflow_id, trigger_event_id, trigger_context, idempotency_key,
                           status, error_code, error_message, completed_at, run_at, created_at)
SELECT @community_id::uuid, @id::uuid, @workflow_id::uuid, sqlc.narg('trigger_event_id')::bytea, @trigger_context::jsonb,
       CASE WHEN a.at_capacity THEN NULL ELSE sqlc.narg('idempotency_key')::text END,
       CASE WHEN a.at_capacity THEN 'failed' ELSE 'pending' END::workflow_run_status,
       CASE WHEN a.at_capacity THEN @capacity_code::text END,
       CASE WHEN a.at_capacity THEN @capacity_message::text END,
       CASE WHEN a.at_capacity THEN coalesce(sqlc.narg('now')::timestamptz, now()) END,
       coalesce(sqlc.narg('now')::timestamptz, now()), coalesce(sqlc.narg('now')::timestamptz, now())
FROM (
    SELECT count(*) >= @max_unfinished::int AS at_capacity
    FROM (
        SELECT 1 FROM workflow_runs u
        WHERE u.community_id = @community_id::uuid AND u.workflow_id = @workflow_id::uuid
          AND u.status IN ('pending', 'running', 'waiting_approval')
        LIMIT @max_unfinished::int
    ) unfinished
) a
RETURNING status, created_at;

-- name: WorkflowRunSoonestEnd :one
-- The earliest one of the workflow's unfinished runs could end, as far as
-- the database knows: a run that is running or waiting for an approval at
-- any moment (now), else the soonest pending run when it is due (a delayed
-- run not before its delay ends; a disabled workflow fails it only at its
-- next step); now too when none is unfinished any more. It tells a trigger
-- refused at capacity when a retry could first be admitted. Two probes of
-- workflow_runs_unfinished_by_status, however many runs are unfinished.
SELECT (CASE WHEN EXISTS (
            SELECT FROM workflow_runs r
            WHERE r.community_id = @community_id::uuid AND r.workflow_id = @workflow_id::uuid
              AND r.status IN ('running', 'waiting_approval'))
        THEN n.now
        -- greatest() skips the NULL of no pending run.
        ELSE greatest(n.now, (
            SELECT r.run_at FROM workflow_runs r
            WHERE r.community_id = @community_id::uuid AND r.workflow_id = @workflow_id::uuid
              AND r.status = 'pending'
            ORDER BY r.run_at
            LIMIT 1))
        END)::timestamptz AS soonest,
       n.now::timestamptz AS now
FROM (SELECT coalesce(sqlc.narg('now')::timestamptz, now()) AS now) n;

-- name: WorkflowRunStepDone :execrows
-- One step finished (or was skipped): record it and move to the next,
-- renewing the lease. Fenced: zero rows means this worker lost its claim,
-- and the caller rolls back whatever the step wrote in the same
-- transaction.
UPDATE workflow_runs
SET current_step = @next_step::int,
    expired_leases = 0,
    execution_trace = execution_trace || @trace::jsonb,
    lease_until = coalesce(sqlc.narg('now')::timestamptz, now()) + interval '1 millisecond' * @lease_ms::bigint
WHERE community_id = @community_id::uuid AND id = @id::uuid AND claim_id = @claim_id::uuid AND status = 'running'
  AND current_step = @step::int;

-- name: WorkflowRunPark :execrows
-- A delay step: the run is pending again, due after the delay, with no
-- claim, so no worker holds it while it waits. Fenced like
-- WorkflowRunStepDone. The due time is on the database's clock, the one
-- the claim compares it with, not the relay's.
UPDATE workflow_runs
SET status = 'pending',
    expired_leases = 0,
    current_step = @next_step::int,
    execution_trace = execution_trace || @trace::jsonb,
    run_at = coalesce(sqlc.narg('now')::timestamptz, now()) + interval '1 millisecond' * @delay_ms::bigint,
    claim_id = NULL,
    lease_until = NULL
WHERE community_id = @community_id::uuid AND id = @id::uuid AND claim_id = @claim_id::uuid AND status = 'running'
  AND current_step = @step::int;

-- name: WorkflowRunRelease :execrows
-- A stopping worker hands a run back between steps: pending, due now, with
-- no claim, so another worker resumes it at current_step at once rather
-- than after the lease. Fenced like WorkflowRunStepDone.
UPDATE workflow_runs
SET status = 'pending',
    run_at = coalesce(sqlc.narg('now')::timestamptz, now()),
    claim_id = NULL,
    lease_until = NULL
WHERE community_id = @community_id::uuid AND id = @id::uuid AND claim_id = @claim_id::uuid AND status = 'running'
  AND current_step = @step::int;

-- name: WorkflowRunFinish :execrows
-- The run ends: completed (no code), failed or cancelled (code and
-- diagnostic together). Fenced like WorkflowRunStepDone.
UPDATE workflow_runs
SET status = @status::workflow_run_status,
    execution_trace = execution_trace || @trace::jsonb,
    error_code = sqlc.narg('error_code')::text,
    error_message = sqlc.narg('error_message')::text,
    completed_at = coalesce(sqlc.narg('now')::timestamptz, now()),
    claim_id = NULL,
    lease_until = NULL
WHERE community_id = @community_id::uuid AND id = @id::uuid AND claim_id = @claim_id::uuid AND status = 'running';

-- name: WorkflowRunGet :one
SELECT status, current_step, execution_trace, error_code, error_message, attempts, claim_id, run_at,
       started_at, completed_at, trigger_context
FROM workflow_runs
WHERE community_id = @community_id::uuid AND id = @id::uuid;

-- name: WorkflowRunStepStart :execrows
-- A step with an effect outside the database (call_webhook) is marked
-- started, and the lease renewed to cover it, before the effect happens. A
-- worker resuming the run finds the mark without a result and fails the
-- step instead of repeating it: such a step runs at most once. Fenced like
-- WorkflowRunStepDone.
UPDATE workflow_runs
SET execution_trace = execution_trace || @trace::jsonb,
    lease_until = coalesce(sqlc.narg('now')::timestamptz, now()) + interval '1 millisecond' * @lease_ms::bigint
WHERE community_id = @community_id::uuid AND id = @id::uuid AND claim_id = @claim_id::uuid AND status = 'running'
  AND current_step = @step::int;

-- name: WorkflowRunKeepLease :execrows
-- A step still at work renews its run's lease, so that no other worker
-- resumes a run whose worker is alive (and runs the step beside it) just
-- because the step outlasts the lease. Never shortens a longer lease (a
-- call_webhook's, which covers its call). Fenced like WorkflowRunStepDone:
-- zero rows means the claim was lost or the step recorded.
UPDATE workflow_runs
SET lease_until = greatest(lease_until, coalesce(sqlc.narg('now')::timestamptz, now()) + interval '1 millisecond' * @lease_ms::bigint)
WHERE community_id = @community_id::uuid AND id = @id::uuid AND claim_id = @claim_id::uuid AND status = 'running'
  AND current_step = @step::int;

-- name: WorkflowRunAwaitApproval :execrows
-- A request_approval step: the run waits, unclaimed, for a decision; a
-- grant resumes it at next_step. Fenced like WorkflowRunStepDone.
UPDATE workflow_runs
SET status = 'waiting_approval',
    expired_leases = 0,
    current_step = @next_step::int,
    execution_trace = execution_trace || @trace::jsonb,
    claim_id = NULL,
    lease_until = NULL
WHERE community_id = @community_id::uuid AND id = @id::uuid AND claim_id = @claim_id::uuid AND status = 'running'
  AND current_step = @step::int;

-- name: WorkflowRunApprovalGranted :execrows
-- A granted approval makes the waiting run due again.
UPDATE workflow_runs
SET status = 'pending', run_at = coalesce(sqlc.narg('now')::timestamptz, now())
WHERE community_id = @community_id::uuid AND id = @id::uuid AND status = 'waiting_approval';

-- name: WorkflowRunApprovalEnded :many
-- A denied (cancelled) or expired (failed) approval ends the waiting run;
-- the row back (none if the run was not waiting) times the run.
UPDATE workflow_runs
SET status = @status::workflow_run_status,
    error_code = @error_code::text,
    error_message = @error_message::text,
    completed_at = coalesce(sqlc.narg('now')::timestamptz, now())
WHERE community_id = @community_id::uuid AND id = @id::uuid AND status = 'waiting_approval'
RETURNING created_at;

-- name: WorkflowRunByIdempotencyKey :one
SELECT id FROM workflow_runs
WHERE community_id = @community_id::uuid AND workflow_id = @workflow_id::uuid AND idempotency_key = @idempotency_key::text;

-- name: WorkflowRunsPage :many
-- Run history, newest first, keyset-paged on (created_at, id): the cursor
-- is the last row's full-precision created_at and id, so rows inserted
-- while a reader pages are neither repeated nor skipped. Fetch limit + 1 to
-- know whether another page exists.
SELECT id, workflow_id, status, current_step, execution_trace, started_at, completed_at, error_code, error_message, created_at
FROM workflow_runs
WHERE community_id = @community_id::uuid AND workflow_id = @workflow_id::uuid
  AND (sqlc.narg('before')::timestamptz IS NULL OR sqlc.narg('before_id')::uuid IS NULL
       OR (created_at, id) < (sqlc.narg('before')::timestamptz, sqlc.narg('before_id')::uuid))
ORDER BY created_at DESC, id DESC
LIMIT @max_rows::int;

-- name: WorkflowRunOf :one
SELECT workflow_id FROM workflow_runs WHERE community_id = @community_id::uuid AND id = @id::uuid;

-- name: WorkflowRunsDeleteEnded :execrows
-- History retention: deletes up to @batch runs that ended before @before,
-- oldest first; their approvals go with them (ON DELETE CASCADE). A run a
-- slot claim still names waits for ScheduledWorkflowFiresDeleteOld to take
-- the claim, and a community being deleted is skipped (its deletion removes
-- its rows). SKIP LOCKED: processes sweeping at once take different rows.
DELETE FROM workflow_runs r
USING (
    SELECT e.community_id, e.id FROM workflow_runs e
    WHERE e.status IN ('completed', 'failed', 'cancelled') AND e.completed_at < @before::timestamptz
      AND NOT EXISTS (SELECT FROM scheduled_workflow_fires f
                      WHERE f.community_id = e.community_id AND f.workflow_run_id = e.id)
      AND community_write_allowed(e.community_id)
    ORDER BY e.completed_at
    LIMIT @batch::int
    FOR UPDATE SKIP LOCKED
) old
WHERE r.community_id = old.community_id AND r.id = old.id;
