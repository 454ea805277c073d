-- Schedule slot claims: the primary key (community, workflow, slot) lets
-- exactly one relay process fire each slot.

-- name: ScheduledWorkflowFireClaim :execrows
-- Claims a slot; zero rows means another process (or an earlier tick)
-- already fired it.
INSERT INTO scheduled_workflow_fires (community_id, workflow_id, scheduled_for, claimed_at)
VALUES (@community_id::uuid, @workflow_id::uuid, @scheduled_for::timestamptz, coalesce(sqlc.narg('now')::timestamptz, now()))
ON CONFLICT DO NOTHING;

-- name: ScheduledWorkflowFireLink :exec
-- Records the run a claimed slot created, in the claim's transaction.
UPDATE scheduled_workflow_fires
SET workflow_run_id = @run_id::uuid
WHERE community_id = @community_id::uuid AND workflow_id = @workflow_id::uuid AND scheduled_for = @scheduled_for::timestamptz;
