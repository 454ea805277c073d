-- name: UserProfileSync :execrows
-- Mirrors a kind 0 profile into users. Only a newer version (ties to the
-- lowest id, like the replaceable-slot trigger) changes the row, unless
-- the version mirrored is no longer stored: an expired profile leaves its
-- slot to an older version (events_keep_newest_version deletes the expired
-- row as it stores the older one), and the mirror follows the version
-- stored and served rather than keep the expired one's fields. Profile
-- fields follow the event (absent means NULL); channel_add_policy changes
-- only when the profile names it. A profile never sets agent_owner_pubkey:
-- that is proven by the owner's signature (UserAgentOwnerRecord).
INSERT INTO users (
    community_id, pubkey, display_name, about, avatar_url, nip05_handle,
    channel_add_policy, metadata_event_id, metadata_created_at, updated_at
) VALUES (
    @community_id::uuid, @pubkey::bytea,
    sqlc.narg('display_name')::text, sqlc.narg('about')::text,
    sqlc.narg('avatar_url')::text, sqlc.narg('nip05_handle')::text,
    coalesce(sqlc.narg('channel_add_policy')::channel_add_policy, 'anyone'),
    @metadata_event_id::bytea, @metadata_created_at::timestamptz,
    coalesce(sqlc.narg('now')::timestamptz, now())
)
ON CONFLICT (community_id, pubkey) DO UPDATE
SET display_name = EXCLUDED.display_name,
    about = EXCLUDED.about,
    avatar_url = EXCLUDED.avatar_url,
    nip05_handle = EXCLUDED.nip05_handle,
    channel_add_policy = coalesce(sqlc.narg('channel_add_policy')::channel_add_policy, users.channel_add_policy),
    metadata_event_id = EXCLUDED.metadata_event_id,
    metadata_created_at = EXCLUDED.metadata_created_at,
    updated_at = EXCLUDED.updated_at
WHERE users.metadata_created_at IS NULL
   OR users.metadata_created_at < EXCLUDED.metadata_created_at
   OR (users.metadata_created_at = EXCLUDED.metadata_created_at AND users.metadata_event_id > EXCLUDED.metadata_event_id)
   OR NOT EXISTS (
       SELECT FROM events e
       WHERE e.community_id = users.community_id AND e.created_at = users.metadata_created_at
         AND e.id = users.metadata_event_id
   );

-- name: UserChannelAddPolicy :one
-- The user's add policy and agent owner. An owner whose attestation ended
-- (agent_owner_until passed) counts as none; agent_owner_until is the
-- stored bound whatever it is.
SELECT channel_add_policy,
       (CASE WHEN agent_owner_until IS NULL OR agent_owner_until > coalesce(sqlc.narg('now')::timestamptz, now())
             THEN agent_owner_pubkey END)::bytea AS agent_owner_pubkey,
       agent_owner_until
FROM users
WHERE community_id = @community_id::uuid AND pubkey = @pubkey::bytea;

-- name: UserAgentOwnerRecord :one
-- Records owner as agent's verified owner, first wins, in one statement:
-- both users rows are created if missing (the owner's for the foreign key),
-- and an agent that already has an owner keeps it. ON CONFLICT DO UPDATE
-- locks the agent's row and sees its latest committed version, so of two
-- racing attestations exactly one owner is recorded, and each caller gets
-- back the owner now on record: equal to owner means recorded (or already
-- so), different means a conflict. The attestation's created_at< bound
-- (@until, NULL: none) goes with the owner; the owner's next attestation
-- sets it again, so a renewed one keeps the owner counting. An ended
-- owner is not replaced by another (an operator clears it, as a wrong one).
WITH owner_row AS (
    INSERT INTO users (community_id, pubkey, updated_at)
    VALUES (@community_id::uuid, @owner::bytea, coalesce(sqlc.narg('now')::timestamptz, now()))
    ON CONFLICT (community_id, pubkey) DO NOTHING
)
INSERT INTO users (community_id, pubkey, agent_owner_pubkey, agent_owner_until, updated_at)
VALUES (@community_id::uuid, @agent::bytea, @owner::bytea, sqlc.narg('until')::timestamptz, coalesce(sqlc.narg('now')::timestamptz, now()))
ON CONFLICT (community_id, pubkey) DO UPDATE
SET agent_owner_pubkey = coalesce(users.agent_owner_pubkey, EXCLUDED.agent_owner_pubkey),
    agent_owner_until = CASE WHEN users.agent_owner_pubkey IS NULL OR users.agent_owner_pubkey = EXCLUDED.agent_owner_pubkey
                             THEN EXCLUDED.agent_owner_until ELSE users.agent_owner_until END
RETURNING agent_owner_pubkey::bytea AS recorded_owner;

-- name: UserRecordedOwner :one
-- The agent owner recorded for a pubkey in one community, with the owner's
-- display name from the same community (NULL when the owner has no profile
-- there). No row when the pubkey has no recorded owner, or its owner's
-- attestation ended.
SELECT u.agent_owner_pubkey::bytea AS agent_owner_pubkey,
       o.display_name AS owner_display_name,
       u.channel_add_policy
FROM users u
LEFT JOIN users o ON o.community_id = u.community_id AND o.pubkey = u.agent_owner_pubkey
WHERE u.community_id = @community_id::uuid
  AND u.pubkey = @pubkey::bytea
  AND u.agent_owner_pubkey IS NOT NULL
  AND (u.agent_owner_until IS NULL OR u.agent_owner_until > coalesce(sqlc.narg('now')::timestamptz, now()));
