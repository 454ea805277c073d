-- name: DeletionRequestSubmit :one
-- Opens (or, retried by the same requester, returns) the request for an
-- active community.
SELECT * FROM community_deletion_submit(@host::text, @requested_by::text, sqlc.narg('reason')::text);

-- name: DeletionRequestFreezeInventory :one
SELECT * FROM community_deletion_freeze_inventory(@id::uuid, @manifest::jsonb, @digest::bytea);

-- name: DeletionRequestApprove :one
SELECT * FROM community_deletion_approve(@id::uuid, @approved_by::text, sqlc.narg('note')::text, @digest::bytea);

-- name: DeletionRequestUnblock :one
SELECT * FROM community_deletion_unblock(@id::uuid, @unblocked_by::text, @reason::text);

-- name: DeletionRequestGet :one
SELECT * FROM community_deletion_requests WHERE id = @id::uuid;

-- name: DeletionRequestList :many
SELECT * FROM community_deletion_requests ORDER BY created_at DESC, id DESC LIMIT @max_rows::int;

-- name: DeletionApprovalGet :one
SELECT * FROM community_deletion_approvals WHERE request_id = @request_id::uuid;

-- name: DeletionCheckpoints :many
SELECT * FROM community_deletion_checkpoints WHERE request_id = @request_id::uuid ORDER BY sequence;

-- name: DeletionRequestClaim :one
-- The named request, or the oldest due one when id is NULL. No row: nothing
-- claimable. A returned row with blocked_at set was blocked by catalog
-- validation instead of claimed.
SELECT * FROM community_deletion_claim(sqlc.narg('id')::uuid, @owner::text, @lease_seconds::float8);

-- name: DeletionRequestHeartbeat :one
SELECT community_deletion_heartbeat(@id::uuid, @owner::text, @generation::bigint, @mode::text, @draining::boolean, @lease_seconds::float8)::timestamptz AS lease_until;

-- name: DeletionExecutorBeat :exec
SELECT community_deletion_executor_beat(@executor_id::text, @mode::text, sqlc.narg('request_id')::uuid,
    sqlc.narg('generation')::bigint, sqlc.narg('stage')::text, @draining::boolean, @stopped::boolean);

-- name: DeletionRequestRelease :one
SELECT community_deletion_release(@id::uuid, @owner::text, @generation::bigint)::boolean AS released;

-- name: DeletionRequestRecordFailure :one
SELECT * FROM community_deletion_record_failure(@id::uuid, @owner::text, @generation::bigint, @stage::text,
    @message::text, @permanent::boolean, @base_delay_seconds::float8, @max_streak::int);

-- name: DeletionRequestAdvance :one
SELECT * FROM community_deletion_advance(@id::uuid, @owner::text, @generation::bigint, @from_stage::text, sqlc.narg('fence_generation')::bigint);

-- name: DeletionBeginQuiescing :exec
SELECT community_deletion_begin_quiescing(@id::uuid, @owner::text, @generation::bigint);

-- name: DeletionFence :one
SELECT community_deletion_fence(@id::uuid, @owner::text, @generation::bigint)::bigint AS fence_generation;

-- name: DeletionVerifyLease :one
SELECT * FROM community_deletion_verify_lease(@id::uuid, @owner::text, @generation::bigint, @stage::text);

-- name: DeletionEnterExecutor :one
-- Verifies lease and fence and admits this transaction's writes to the
-- fenced community.
SELECT * FROM community_deletion_enter_executor(@id::uuid, @owner::text, @generation::bigint, @stage::text);

-- name: DeletionCheckpoint :exec
SELECT community_deletion_checkpoint(@request_id::uuid, @stage::text, @unit_key::text, @status::text,
    @generation::bigint, @detail::jsonb, sqlc.narg('error')::text);

-- name: DeletionManifestChunkInsert :exec
INSERT INTO community_deletion_manifest_keys (request_id, chunk_no, prefix, key_class, keys)
VALUES (@request_id::uuid, @chunk_no::bigint, @prefix::text, @key_class::text, @keys::jsonb);

-- name: DeletionManifestChunksClear :execrows
-- Leftovers of an interrupted manifest build (allowed only before the freeze).
DELETE FROM community_deletion_manifest_keys WHERE request_id = @request_id::uuid;

-- name: DeletionManifestChunk :one
SELECT * FROM community_deletion_manifest_keys WHERE request_id = @request_id::uuid AND chunk_no = @chunk_no::bigint;

-- name: DeletionManifestNextUndeleted :one
SELECT * FROM community_deletion_manifest_keys
WHERE request_id = @request_id::uuid AND deleted_at IS NULL
ORDER BY chunk_no LIMIT 1;

-- name: DeletionManifestProgress :one
SELECT count(*)::bigint AS chunks, count(deleted_at)::bigint AS deleted_chunks,
       coalesce(sum(jsonb_array_length(keys)), 0)::bigint AS keys,
       coalesce(sum(jsonb_array_length(keys)) FILTER (WHERE deleted_at IS NOT NULL), 0)::bigint AS deleted_keys
FROM community_deletion_manifest_keys WHERE request_id = @request_id::uuid;

-- name: DeletionFreezeObjects :exec
SELECT community_deletion_freeze_objects(@id::uuid, @owner::text, @generation::bigint, @manifest::jsonb);

-- name: DeletionMarkDrained :exec
SELECT community_deletion_mark_drained(@id::uuid, @owner::text, @generation::bigint, @detail::jsonb);

-- name: DeletionStampChunk :exec
SELECT community_deletion_stamp_chunk(@id::uuid, @owner::text, @generation::bigint, @chunk_no::bigint, @detail::jsonb);

-- name: DeletionTombstone :exec
SELECT community_deletion_tombstone(@id::uuid, @owner::text, @generation::bigint, @detail::jsonb);

-- name: DeletionVerifyPostgres :exec
SELECT community_deletion_verify_postgres(@id::uuid, @owner::text, @generation::bigint);

-- name: DeletionMarkVerified :exec
SELECT community_deletion_mark_verified(@id::uuid, @owner::text, @generation::bigint, @detail::jsonb);

-- name: DeletionCatalogProblems :many
SELECT p.table_name::text AS table_name, p.problem::text AS problem FROM community_deletion_catalog_problems() p;

-- name: DeletionScopedTables :many
SELECT t::text AS table_name FROM community_scoped_tables() t;

-- name: DeletionFencedTables :many
SELECT t::text AS table_name FROM community_fenced_tables() t;

-- name: DeletionScopedForeignKeys :many
SELECT f.child::text AS child, f.parent::text AS parent FROM community_scoped_foreign_keys() f;

-- name: DeletionSchemaLockShared :exec
SELECT pg_advisory_xact_lock_shared(community_schema_destruction_lock_key());

-- name: DeletionExecutorHeartbeats :many
SELECT * FROM community_deletion_executor_heartbeats ORDER BY heartbeat_at DESC;

-- name: ServingLeaseAcquire :one
SELECT community_serving_lease_acquire(@community_id::uuid, @operation::text, @owner::text, @lease_seconds::float8)::uuid AS lease_id;

-- name: ServingLeaseRenew :one
SELECT community_serving_lease_renew(@id::uuid, @lease_seconds::float8)::boolean AS renewed;

-- name: ServingLeaseRelease :one
SELECT community_serving_lease_release(@id::uuid)::boolean AS released;

-- name: ServingLeaseGuard :exec
SELECT community_serving_lease_guard(@id::uuid);

-- name: ServingLeasesReap :one
SELECT community_serving_leases_reap(@max_rows::int)::bigint AS reaped;

-- name: StorageTaxonomySweepInsert :one
INSERT INTO storage_taxonomy_sweeps (started_at, listed_objects, unknown_object_count, unknown_key_sample)
SELECT least(@started_at::timestamptz, clock_timestamp()), @listed_objects::bigint, @unknown_object_count::bigint, @unknown_key_sample::jsonb
WHERE @started_at::timestamptz <= clock_timestamp() + interval '5 minutes'
RETURNING *;

-- name: CommunityByID :one
SELECT * FROM communities WHERE id = @id::uuid;
