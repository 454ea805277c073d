-- Blobs the media sweep found referenced by no community (migration 059).

-- name: MediaUnreferencedBlobsMark :many
-- Notes blobs found unreferenced now; one already noted keeps when it was
-- first seen so.
INSERT INTO media_unreferenced_blobs AS m (blob_key, first_seen_at, last_seen_at)
SELECT k, coalesce(sqlc.narg('now')::timestamptz, now()), coalesce(sqlc.narg('now')::timestamptz, now())
FROM unnest(@blob_keys::text[]) AS k
ON CONFLICT (blob_key) DO UPDATE SET last_seen_at = EXCLUDED.last_seen_at
RETURNING blob_key, first_seen_at;

-- name: MediaUnreferencedBlobsForget :exec
-- Forgets blobs found referenced again, removed, or gone.
DELETE FROM media_unreferenced_blobs WHERE blob_key = ANY(@blob_keys::text[]);

-- name: MediaUnreferencedBlobsDue :many
-- The blobs unreferenced since before cutoff: the ones to remove, oldest
-- first, then those whose removal failed on an earlier sweep, the longest
-- failed first, so that blobs failing every time do not fill every batch.
SELECT blob_key FROM media_unreferenced_blobs
WHERE first_seen_at <= @cutoff::timestamptz
ORDER BY removal_failed_at NULLS FIRST, first_seen_at, blob_key
LIMIT @max_rows::int;

-- name: MediaUnreferencedBlobsRemovalFailed :exec
-- Notes that the removal of these blobs failed now.
UPDATE media_unreferenced_blobs
SET removal_failed_at = coalesce(sqlc.narg('now')::timestamptz, now())
WHERE blob_key = ANY(@blob_keys::text[]);

-- name: MediaUnreferencedBlobsForgetUnseen :exec
-- At the end of a pass over the store: forgets blobs the pass did not find
-- (removed by a community's deletion, or by hand).
DELETE FROM media_unreferenced_blobs WHERE last_seen_at < @pass_started_at::timestamptz;
