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
    joined_at = CASE WHEN channel_members.removed_at IS NOT NULL THEN coalesce(sqlc.narg('now')::timestamptz, now()) ELSE channel_members.joined_at END,
    invited_by = coalesce(EXCLUDED.invited_by, channel_members.invited_by),
    removed_at = NULL,
    removed_by = NULL;

-- name: ChannelMemberRemove :execrows
UPDATE channel_members
SET removed_at = coalesce(sqlc.narg('now')::timestamptz, now()), removed_by = @removed_by::bytea
WHERE community_id = @community_id::uuid AND channel_id = @channel_id::uuid
  AND pubkey = @pubkey::bytea AND removed_at IS NULL;

-- name: ChannelMembersActive :many
SELECT pubkey, role FROM channel_members
WHERE community_id = @community_id::uuid AND channel_id = @channel_id::uuid AND removed_at IS NULL
ORDER BY joined_at, pubkey;

-- name: ChannelMemberDisplayNames :many
-- The active members of a channel who have a display name: the only
-- pubkeys a workflow message may wake by @name.
SELECT m.pubkey, u.display_name::text AS display_name
FROM channel_members m
JOIN users u ON u.community_id = m.community_id AND u.pubkey = m.pubkey
WHERE m.community_id = @community_id::uuid AND m.channel_id = @channel_id::uuid AND m.removed_at IS NULL
  AND u.display_name IS NOT NULL AND u.display_name <> ''
ORDER BY m.pubkey;

-- name: ChannelMembersAtLeast :one
-- Whether the channel has at least @n active members, reading at most @n
-- rows: a membership change asks it to choose how its lists are written.
SELECT count(*) >= @n::int AS at_least FROM (
    SELECT FROM channel_members
    WHERE community_id = @community_id::uuid AND channel_id = @channel_id::uuid AND removed_at IS NULL
    LIMIT @n::int
) m;
