-- name: CommunityCreate :one
INSERT INTO communities (host)
VALUES (@host::text)
RETURNING *;

-- name: CommunityEnsure :one
-- Idempotent create for start-up seeding: returns the existing row when the
-- host is taken (whatever its lifecycle state). Returns no row when another
-- transaction inserted the host while this statement ran (its snapshot
-- predates that commit): call it through community.Ensure, which asks again.
WITH inserted AS (
    INSERT INTO communities (host)
    VALUES (@host::text)
    ON CONFLICT (lower(host)) DO NOTHING
    RETURNING *
)
SELECT * FROM inserted
UNION ALL
SELECT * FROM communities WHERE lower(host) = lower(@host::text)
LIMIT 1;

-- name: CommunityResolveServing :one
-- The serving lookup: only active, unarchived, undeleted tenants
-- resolve. The caller passes a host already normalized.
SELECT *
FROM communities
WHERE lower(host) = lower(@host::text)
  AND archived_at IS NULL
  AND deleted_at IS NULL
  AND deletion_state = 'active';

-- name: CommunityByHost :one
-- The operator-plane lookup: ignores lifecycle, so a tombstone still shows.
SELECT * FROM communities WHERE lower(host) = lower(@host::text);

-- name: CommunityList :many
SELECT * FROM communities ORDER BY created_at, host;

-- name: CommunityArchive :one
UPDATE communities
SET archived_at = coalesce(archived_at, coalesce(sqlc.narg('now')::timestamptz, now()))
WHERE lower(host) = lower(@host::text)
RETURNING *;

-- name: CommunityUnarchive :one
UPDATE communities
SET archived_at = NULL
WHERE lower(host) = lower(@host::text)
RETURNING *;

-- name: CommunitySigningKey :one
-- The community's relay key if it has one: a read, so it works whatever the
-- community's lifecycle (the guard refuses any UPDATE from quiescing on).
SELECT signing_key FROM communities WHERE id = @id::uuid;

-- name: CommunitySigningKeyEnsure :one
-- The community's relay key, created once: concurrent first callers agree on
-- the key that won.
UPDATE communities SET signing_key = coalesce(signing_key, @candidate::bytea)
WHERE id = @id::uuid
RETURNING signing_key;

-- name: CommunityClosedAmong :many
-- Of the given communities, those no longer served: being deleted (from
-- quiescing on, for good) or archived (until unarchived). Their live
-- connections must close.
SELECT id, deletion_state <> 'active' AS deleting
FROM communities
WHERE id = ANY(@ids::uuid[])
  AND (deletion_state <> 'active' OR archived_at IS NOT NULL);

-- name: CommunityByID :one
SELECT * FROM communities WHERE id = @id::uuid;
