-- name: ChannelCreate :execrows
-- Zero rows: a channel with this id already exists in the community.
INSERT INTO channels (community_id, id, name, visibility, description, created_by)
VALUES (@community_id::uuid, @id::uuid, @name::text, @visibility::channel_visibility, @description::text, @created_by::bytea)
ON CONFLICT DO NOTHING;

-- name: ChannelLockForUpdate :one
-- Serializes every membership or metadata change of one channel, so the
-- discovery events written after it describe the state that committed.
SELECT * FROM channels
WHERE community_id = @community_id::uuid AND id = @id::uuid AND deleted_at IS NULL
FOR UPDATE;

-- name: ChannelAccess :one
-- What a pubkey may do in a channel: the channel's state and the caller's
-- active role (NULL when not an active member).
SELECT c.visibility, c.archived_at, m.role AS member_role
FROM channels c
LEFT JOIN channel_members m
    ON m.community_id = c.community_id AND m.channel_id = c.id
   AND m.pubkey = @pubkey::bytea AND m.removed_at IS NULL
WHERE c.community_id = @community_id::uuid AND c.id = @id::uuid AND c.deleted_at IS NULL;

-- name: ChannelsReadable :many
-- The channels a pubkey may read (spec D.5): every open channel and every
-- channel it is an active member of, never a deleted one.
SELECT c.id
FROM channels c
WHERE c.community_id = @community_id::uuid
  AND c.deleted_at IS NULL
  AND (c.visibility = 'open' OR EXISTS (
      SELECT FROM channel_members m
      WHERE m.community_id = c.community_id AND m.channel_id = c.id
        AND m.pubkey = @pubkey::bytea AND m.removed_at IS NULL));

-- name: ChannelMemberUpsert :exec
-- Adds or re-adds a member (clearing a soft removal). An active member keeps
-- its role unless a role is given.
INSERT INTO channel_members (community_id, channel_id, pubkey, role, invited_by)
VALUES (@community_id::uuid, @channel_id::uuid, @pubkey::bytea,
        coalesce(sqlc.narg('role')::member_role, 'member'), sqlc.narg('invited_by')::bytea)
ON CONFLICT (community_id, channel_id, pubkey) DO UPDATE
SET role = CASE
        WHEN sqlc.narg('role')::member_role IS NOT NULL THEN sqlc.narg('role')::member_role
        WHEN channel_members.removed_at IS NOT NULL THEN 'member'
        ELSE channel_members.role
    END,
    joined_at = CASE WHEN channel_members.removed_at IS NOT NULL THEN now() ELSE channel_members.joined_at END,
    invited_by = coalesce(EXCLUDED.invited_by, channel_members.invited_by),
    removed_at = NULL,
    removed_by = NULL;

-- name: ChannelMemberRemove :execrows
UPDATE channel_members
SET removed_at = now(), removed_by = @removed_by::bytea
WHERE community_id = @community_id::uuid AND channel_id = @channel_id::uuid
  AND pubkey = @pubkey::bytea AND removed_at IS NULL;

-- name: ChannelMembersActive :many
SELECT pubkey, role FROM channel_members
WHERE community_id = @community_id::uuid AND channel_id = @channel_id::uuid AND removed_at IS NULL
ORDER BY joined_at, pubkey;

-- name: ChannelUpdateMetadata :exec
UPDATE channels
SET name = coalesce(sqlc.narg('name')::text, name),
    description = coalesce(sqlc.narg('description')::text, description),
    visibility = coalesce(sqlc.narg('visibility')::channel_visibility, visibility),
    updated_at = now()
WHERE community_id = @community_id::uuid AND id = @id::uuid;

-- name: ChannelSoftDelete :exec
UPDATE channels SET deleted_at = now(), updated_at = now()
WHERE community_id = @community_id::uuid AND id = @id::uuid AND deleted_at IS NULL;

-- name: EventsDeleteInChannel :execrows
-- NIP-29 9005: a channel admin hides events of that channel, whoever wrote them.
UPDATE events SET deleted_at = now()
WHERE community_id = @community_id::uuid AND channel_id = @channel_id::uuid
  AND id = ANY(@ids::bytea[]) AND deleted_at IS NULL;

-- name: UserChannelAddPolicy :one
SELECT channel_add_policy, agent_owner_pubkey FROM users
WHERE community_id = @community_id::uuid AND pubkey = @pubkey::bytea;

-- name: CommunitySigningKeyEnsure :one
-- The community's relay key, created once: concurrent first callers agree on
-- the key that won.
UPDATE communities SET signing_key = coalesce(signing_key, @candidate::bytea)
WHERE id = @id::uuid
RETURNING signing_key;

-- name: CommunitiesOfChannels :many
-- Deliberately tenant-independent (spec C.1): reports each live channel's true
-- owning community for the tracer's non-interference check. Served by
-- idx_channels_id_live. Unknown ids are simply absent.
SELECT id, community_id FROM channels WHERE id = ANY(@ids::uuid[]) AND deleted_at IS NULL;
