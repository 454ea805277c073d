-- The media blob sweep's claim (migration 059): one row, leased by one
-- relay process at a time.

-- name: MediaBlobSweepClaim :one
-- Takes the sweep for claimant until now + lease, unless another process
-- holds an unexpired claim. No row: someone else sweeps.
UPDATE media_blob_sweep
SET claimed_by = @claimant::uuid,
    claimed_until = coalesce(sqlc.narg('now')::timestamptz, now()) + make_interval(secs => @lease_seconds::int)
WHERE id = 1
  AND (claimed_until <= coalesce(sqlc.narg('now')::timestamptz, now()) OR claimed_by = @claimant::uuid)
RETURNING pass_cursor, pass_started_at;

-- name: MediaBlobSweepFinish :execrows
-- Records where the pass stands and gives the claim back; a claimant whose
-- lease another process has taken since changes nothing.
UPDATE media_blob_sweep
SET pass_cursor = @pass_cursor::text,
    pass_started_at = @pass_started_at::timestamptz,
    claimed_until = '-infinity'
WHERE id = 1 AND claimed_by = @claimant::uuid;
