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

-- name: ScheduledWorkflowFiresDeleteOld :execrows
-- History retention: deletes up to @batch slot claims made before @before,
-- oldest first. A slot that old is far outside the catch-up window, so no
-- tick would fire it again; its run (which ended no earlier than the claim)
-- may then go too. A community being deleted is skipped.
DELETE FROM scheduled_workflow_fires f
USING (
    SELECT o.community_id, o.workflow_id, o.scheduled_for FROM scheduled_workflow_fires o
    WHERE o.claimed_at < @before::timestamptz AND community_write_allowed(o.community_id)
    ORDER BY o.claimed_at
    LIMIT @batch::int
    FOR UPDATE SKIP LOCKED
) old
WHERE f.community_id = old.community_id AND f.workflow_id = old.workflow_id AND f.scheduled_for = old.scheduled_for;
