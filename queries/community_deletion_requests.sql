-- name: DeletionRequestSubmit :one
-- Opens (or, retried by the same requester, returns) the request for an
-- active community.
SELECT * FROM community_deletion_requests_submit(@host::text, @requested_by::text, sqlc.narg('reason')::text);

-- name: DeletionRequestFreezeInventory :one
SELECT * FROM community_deletion_requests_freeze_inventory(@id::uuid, @manifest::jsonb, @digest::bytea);

-- name: DeletionRequestApprove :one
SELECT * FROM community_deletion_requests_approve(@id::uuid, @approved_by::text, sqlc.narg('note')::text, @digest::bytea);

-- name: DeletionRequestUnblock :one
SELECT * FROM community_deletion_requests_unblock(@id::uuid, @unblocked_by::text, @reason::text);

-- name: DeletionRequestLockForUnblock :one
-- What the unblock in the same transaction would refuse, read under the
-- row's lock it then takes again: an executor blocking the request
-- meanwhile is waited for, not read around. leased is judged on the
-- database's clock, as the unblock function judges it.
SELECT stage, blocked_at, lease_owner, lease_until, lease_generation,
       coalesce(lease_until >= now(), false)::boolean AS leased
FROM community_deletion_requests WHERE id = @id::uuid FOR UPDATE;

-- name: DeletionRequestGet :one
SELECT * FROM community_deletion_requests WHERE id = @id::uuid;

-- name: DeletionRequestList :many
SELECT * FROM community_deletion_requests ORDER BY created_at DESC, id DESC LIMIT @max_rows::int;

-- name: DeletionRequestClaim :one
-- The named request, or the oldest due one when id is NULL. No row: nothing
-- claimable. A returned row with blocked_at set was blocked by catalog
-- validation instead of claimed.
SELECT * FROM community_deletion_requests_claim(sqlc.narg('id')::uuid, @owner::text, @lease_seconds::float8);

-- name: DeletionRequestHeartbeat :one
SELECT community_deletion_requests_heartbeat(@id::uuid, @owner::text, @generation::bigint, @mode::text, @draining::boolean, @lease_seconds::float8)::timestamptz AS lease_until;

-- name: DeletionRequestRelease :one
SELECT community_deletion_requests_release(@id::uuid, @owner::text, @generation::bigint)::boolean AS released;

-- name: DeletionRequestRecordFailure :one
SELECT * FROM community_deletion_requests_record_failure(@id::uuid, @owner::text, @generation::bigint, @stage::text,
    @message::text, @permanent::boolean, @base_delay_seconds::float8, @max_streak::int);

-- name: DeletionRequestAdvance :one
SELECT * FROM community_deletion_requests_advance(@id::uuid, @owner::text, @generation::bigint, @from_stage::text, sqlc.narg('fence_generation')::bigint);

-- name: DeletionRequestBeginQuiescing :exec
SELECT community_deletion_requests_begin_quiescing(@id::uuid, @owner::text, @generation::bigint);

-- name: DeletionRequestFence :one
SELECT community_deletion_requests_fence(@id::uuid, @owner::text, @generation::bigint)::bigint AS fence_generation;

-- name: DeletionRequestVerifyLease :one
SELECT * FROM community_deletion_requests_verify_lease(@id::uuid, @owner::text, @generation::bigint, @stage::text);

-- name: DeletionRequestEnterExecutor :one
-- Verifies lease and fence and admits this transaction's writes to the
-- fenced community.
SELECT * FROM community_deletion_requests_enter_executor(@id::uuid, @owner::text, @generation::bigint, @stage::text);

-- name: DeletionRequestFreezeObjects :exec
SELECT community_deletion_requests_freeze_objects(@id::uuid, @owner::text, @generation::bigint, @manifest::jsonb);

-- name: DeletionRequestMarkDrained :exec
SELECT community_deletion_requests_mark_drained(@id::uuid, @owner::text, @generation::bigint, @detail::jsonb);

-- name: DeletionRequestTombstone :exec
SELECT community_deletion_requests_tombstone(@id::uuid, @owner::text, @generation::bigint, @detail::jsonb);

-- name: DeletionRequestVerifyPostgres :exec
SELECT community_deletion_requests_verify_postgres(@id::uuid, @owner::text, @generation::bigint);

-- name: DeletionRequestMarkVerified :exec
SELECT community_deletion_requests_mark_verified(@id::uuid, @owner::text, @generation::bigint, @detail::jsonb);

-- name: DeletionRequestBlockPreclaim :one
SELECT * FROM community_deletion_requests_block_preclaim(@id::uuid, @message::text);
