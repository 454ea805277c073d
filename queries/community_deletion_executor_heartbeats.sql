-- name: DeletionExecutorBeat :exec
SELECT community_deletion_executor_heartbeats_beat(@executor_id::text, @mode::text, sqlc.narg('request_id')::uuid,
    sqlc.narg('generation')::bigint, sqlc.narg('stage')::text, @draining::boolean, @stopped::boolean);

-- name: DeletionExecutorHeartbeats :many
SELECT * FROM community_deletion_executor_heartbeats ORDER BY heartbeat_at DESC;
