-- name: ChannelMemberUpsert :execrows
-- Adds or re-adds a member (clearing a soft removal). An active member keeps
-- its role unless a role is given. Zero rows: the member is not active and
-- the channel already has @max_members active members
-- (channels.active_members, which a trigger counts), so nothing is written;
-- an active member is never refused (a role change, a second join). The
-- count is exact across relay processes because the caller holds the
-- channel's row lock (ChannelLockForChange), taken by an earlier statement
-- of its transaction: every add that committed before it is in this
-- statement's snapshot, and none can commit until this transaction ends.
-- (A lock taken inside this statement would not do: a statement that
-- waited for a lock still reads with the snapshot it started with.)
INSERT INTO channel_members (community_id, channel_id, pubkey, role, invited_by)
SELECT @community_id::uuid, @channel_id::uuid, @pubkey::bytea,
       coalesce(sqlc.narg('role')::member_role, 'member'), sqlc.narg('invited_by')::bytea
WHERE EXISTS (
        SELECT FROM channel_members
        WHERE community_id = @community_id::uuid AND channel_id = @channel_id::uuid
          AND pubkey = @pubkey::bytea AND removed_at IS NULL)
   -- No channel row: the insert is tried, and its foreign key refuses it.
   OR coalesce((SELECT active_members FROM channels
                WHERE community_id = @community_id::uuid AND id = @channel_id::uuid), 0) < @max_members::int
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

-- name: ChannelMemberNoticeDate :one
-- Dates a notice about the member (44100/44101) and records it: the
-- clock's second (@now), or one second after the member's previous notice
-- when that is later, never past @latest (the relay's future limit). A
-- member joining, leaving and joining again within one second then gets
-- three notices, strictly ordered, instead of a third identical to the
-- first (a duplicate, dropped) and a tie. The caller holds the channel's
-- row lock, so the changes of one member are dated in turn.
UPDATE channel_members
SET last_notice_at = to_timestamp(greatest(@now::bigint,
        least(coalesce(extract(epoch FROM last_notice_at)::bigint + 1, @now::bigint), @latest::bigint)))
WHERE community_id = @community_id::uuid AND channel_id = @channel_id::uuid AND pubkey = @pubkey::bytea
RETURNING extract(epoch FROM last_notice_at)::bigint AS created_at;

-- name: ChannelMembersActive :many
SELECT pubkey, role FROM channel_members
WHERE community_id = @community_id::uuid AND channel_id = @channel_id::uuid AND removed_at IS NULL
ORDER BY joined_at, pubkey;

-- name: ChannelMemberDisplayNamesNamed :many
-- The active members of a channel whose display name, folded as the
-- mention rules fold it (mention_fold, migration 053), is one of names:
-- a workflow step's mention candidates (mention.Candidates). The pubkeys
-- of those names in the community come first, through users_mention_name
-- (whose predicate display_name <> '' this repeats), then each is looked
-- up among the channel's members by primary key. As a join, the planner
-- guessed 100 users per name and hashed the whole member list instead.
SELECT m.pubkey, u.display_name::text AS display_name
FROM channel_members m
JOIN users u ON u.community_id = m.community_id AND u.pubkey = m.pubkey
WHERE m.community_id = @community_id::uuid AND m.channel_id = @channel_id::uuid AND m.removed_at IS NULL
  AND m.pubkey = ANY(ARRAY(
      SELECT n.pubkey FROM users n
      WHERE n.community_id = @community_id::uuid AND n.display_name <> ''
        AND mention_fold(n.display_name) = ANY(@names::text[])))
ORDER BY m.pubkey;

-- name: ChannelMemberDisplayNames :many
-- The active members of a channel who have a display name: the only
-- pubkeys a workflow message may wake by @name.
SELECT m.pubkey, u.display_name::text AS display_name
FROM channel_members m
JOIN users u ON u.community_id = m.community_id AND u.pubkey = m.pubkey
WHERE m.community_id = @community_id::uuid AND m.channel_id = @channel_id::uuid AND m.removed_at IS NULL
  AND u.display_name IS NOT NULL AND u.display_name <> ''
ORDER BY m.pubkey;
