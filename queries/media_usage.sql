-- What each community's media counts against its quota (migration 033):
-- blobs, sidecars and upload records, see media.BlobCharge and ObjectCharge.

-- name: MediaUsageReserve :execrows
-- Adds an upload's charge to the community's usage unless that would pass the
-- quota. Zero rows: refused, nothing changed. The upsert locks the row, so
-- concurrent reservations (on any relay process) add one after the other
-- and each sees the others' bytes.
INSERT INTO media_usage AS u (community_id, bytes, updated_at)
SELECT @community_id::uuid, @size::bigint, now()
WHERE @size::bigint <= @quota::bigint
ON CONFLICT (community_id) DO UPDATE
SET bytes = u.bytes + EXCLUDED.bytes, updated_at = EXCLUDED.updated_at
WHERE u.bytes + EXCLUDED.bytes <= @quota::bigint;

-- name: MediaUsageRelease :exec
-- Gives back a charge: its upload failed after the reservation, or the
-- objects it counted (upload records, the community's sidecar) were
-- deleted. Never below zero: a blob uploaded before migration 033 was
-- never counted.
UPDATE media_usage
SET bytes = greatest(bytes - @size::bigint, 0), updated_at = now()
WHERE community_id = @community_id::uuid;

-- name: MediaUsageGet :one
SELECT bytes FROM media_usage WHERE community_id = @community_id::uuid;
