-- name: ServingLeaseAcquire :one
SELECT community_serving_write_leases_acquire(@community_id::uuid, @operation::text, @owner::text, @lease_seconds::float8)::uuid AS lease_id;

-- name: ServingLeaseRenew :one
SELECT community_serving_write_leases_renew(@id::uuid, @lease_seconds::float8)::boolean AS renewed;

-- name: ServingLeaseRelease :one
SELECT community_serving_write_leases_release(@id::uuid)::boolean AS released;

-- name: ServingLeaseGuard :exec
SELECT community_serving_write_leases_guard(@id::uuid);

-- name: ServingLeasesReap :one
SELECT community_serving_write_leases_reap(@max_rows::int)::bigint AS reaped;
