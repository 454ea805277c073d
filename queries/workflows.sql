-- Workflow definitions, runs and their transitions. The run claims are
-- rendered from queries/templates/workflow_run_claim.sql.tmpl.

-- name: WorkflowGet :one
SELECT owner_pubkey, channel_id, status, enabled, definition_event_id,
       coalesce(definition ->> '_webhook_secret', '')::text AS webhook_secret
FROM workflows
WHERE community_id = @community_id::uuid AND id = @id::uuid;

-- name: WorkflowUpsert :one
-- Materializes a kind 30620 definition. A re-save updates the row only when
-- the same owner saves it for the same channel: the WHERE makes a racing
-- save by someone else return no row (refused), whatever the earlier read
-- saw. A re-save enables the workflow again (the signer is a channel member
-- at save time) and pins the new event.
INSERT INTO workflows (community_id, id, name, owner_pubkey, channel_id, definition, definition_hash,
                       definition_event_id, status, enabled, created_at, updated_at)
VALUES (@community_id::uuid, @id::uuid, @name::text, @owner_pubkey::bytea, sqlc.narg('channel_id')::uuid,
        @definition::jsonb, @definition_hash::bytea, @definition_event_id::bytea, 'active', true,
        coalesce(sqlc.narg('now')::timestamptz, now()), coalesce(sqlc.narg('now')::timestamptz, now()))
ON CONFLICT (community_id, id) DO UPDATE
SET name = EXCLUDED.name,
    definition = EXCLUDED.definition,
    definition_hash = EXCLUDED.definition_hash,
    definition_event_id = EXCLUDED.definition_event_id,
    status = 'active',
    enabled = true,
    updated_at = EXCLUDED.updated_at
WHERE workflows.owner_pubkey = EXCLUDED.owner_pubkey
  AND workflows.channel_id IS NOT DISTINCT FROM EXCLUDED.channel_id
RETURNING id;

-- name: WorkflowArchive :execrows
-- A kind 5 deletion of the definition's coordinate by its owner: the
-- workflow stops firing. The row stays for its run history.
UPDATE workflows
SET status = 'archived', enabled = false, updated_at = coalesce(sqlc.narg('now')::timestamptz, now())
WHERE community_id = @community_id::uuid AND id = @id::uuid AND owner_pubkey = @owner_pubkey::bytea
  AND status <> 'archived';

-- name: WorkflowsTriggerable :many
-- The workflows an event in a channel may trigger: active, enabled, and
-- pinned to a signed definition event (a row without one fires nothing
-- until its owner saves it again).
SELECT id, owner_pubkey, definition, definition_event_id
FROM workflows
WHERE community_id = @community_id::uuid AND channel_id = @channel_id::uuid
  AND status = 'active' AND enabled AND definition_event_id IS NOT NULL
ORDER BY id;

-- name: WorkflowDefinitionEvent :one
-- The exact signed definition a run is pinned to, in the workflow's
-- channel, if it is still stored (not deleted).
SELECT id, pubkey, content, tags
FROM events
WHERE community_id = @community_id::uuid AND id = @id::bytea AND kind = 30620
  AND channel_id = @channel_id::uuid AND deleted_at IS NULL;

-- name: WorkflowRunCreate :exec
INSERT INTO workflow_runs (community_id, id, workflow_id, trigger_event_id, trigger_context, run_at, created_at)
VALUES (@community_id::uuid, @id::uuid, @workflow_id::uuid, sqlc.narg('trigger_event_id')::bytea,
        @trigger_context::jsonb, coalesce(sqlc.narg('now')::timestamptz, now()),
        coalesce(sqlc.narg('now')::timestamptz, now()));

-- name: WorkflowRunStepDone :execrows
-- One step finished (or was skipped): record it and move to the next,
-- renewing the lease. Fenced: zero rows means this worker lost its claim,
-- and the caller rolls back whatever the step wrote in the same
-- transaction.
UPDATE workflow_runs
SET current_step = @next_step::int,
    execution_trace = execution_trace || @trace::jsonb,
    lease_until = coalesce(sqlc.narg('now')::timestamptz, now()) + interval '1 millisecond' * @lease_ms::bigint
WHERE community_id = @community_id::uuid AND id = @id::uuid AND claim_id = @claim_id::uuid AND status = 'running'
  AND current_step = @step::int;

-- name: WorkflowRunPark :execrows
-- A delay step: the run is pending again, due at run_at, with no claim, so
-- no worker holds it while it waits. Fenced like WorkflowRunStepDone.
UPDATE workflow_runs
SET status = 'pending',
    current_step = @next_step::int,
    execution_trace = execution_trace || @trace::jsonb,
    run_at = @run_at::timestamptz,
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

-- name: WorkflowChannelMemberNames :many
-- The active members of a channel who have a display name: the only
-- pubkeys a workflow message may wake by @name.
SELECT m.pubkey, u.display_name::text AS display_name
FROM channel_members m
JOIN users u ON u.community_id = m.community_id AND u.pubkey = m.pubkey
WHERE m.community_id = @community_id::uuid AND m.channel_id = @channel_id::uuid AND m.removed_at IS NULL
  AND u.display_name IS NOT NULL AND u.display_name <> ''
ORDER BY m.pubkey;
