-- name: DeletionCheckpointsOfRequest :many
SELECT * FROM community_deletion_checkpoints WHERE request_id = @request_id::uuid ORDER BY sequence;

-- name: DeletionCheckpointUpsert :exec
SELECT community_deletion_checkpoints_upsert(@request_id::uuid, @stage::text, @unit_key::text, @status::text,
    @generation::bigint, @detail::jsonb, sqlc.narg('error')::text);
