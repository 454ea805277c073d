-- name: ChannelCreate :execrows
-- Zero rows: a channel with this id already exists in the community.
INSERT INTO channels (community_id, id, name, visibility, description, created_by)
VALUES (@community_id::uuid, @id::uuid, @name::text, @visibility::channel_visibility, @description::text, @created_by::bytea)
ON CONFLICT DO NOTHING;

-- name: ChannelWritesLockExclusive :exec
-- Waits for every write in flight into the channel (each holds the key
-- shared, see ChannelWritesLockShared) and holds later ones back until
-- this transaction ends. Taken after ChannelLockForChange by every
-- membership or metadata change: a change waiting for the row (a fold
-- holds it for seconds) is not yet queued here, so the channel's writes
-- go on meanwhile.
SELECT pg_advisory_xact_lock(channels_write_lock_key(@community_id::uuid, @id::uuid));

-- name: ChannelWritesLockShared :exec
-- Orders a channel write after any change of who may read the channel
-- (ChannelWritesLockExclusive): one committed first is seen by the access
-- read that follows in a later statement (a new snapshot), one not yet
-- begun waits for this transaction's commit. The lock manager queues
-- requests, so a change waiting here is not passed by writes that come
-- after it.
SELECT pg_advisory_xact_lock_shared(channels_write_lock_key(@community_id::uuid, @id::uuid));

-- name: ChannelLockForChange :one
-- Serializes every membership or metadata change of one channel, so the
-- discovery events written after it describe the state that committed.
-- Taken before ChannelWritesLockExclusive. FOR NO KEY UPDATE: it must not
-- block the foreign-key checks (FOR KEY SHARE) of the writes in flight
-- that the change then waits for; it conflicts with itself, with the
-- fold's ChannelLockForLists and with ChannelLockForWorkflows.
SELECT * FROM channels
WHERE community_id = @community_id::uuid AND id = @id::uuid AND deleted_at IS NULL
FOR NO KEY UPDATE;

-- name: ChannelMembersAtLeast :one
-- Whether the channel has at least @n active members (no row: a deleted
-- channel): a membership change asks it, after its own, to choose how its
-- lists are written.
SELECT active_members >= @n::int AS at_least FROM channels
WHERE community_id = @community_id::uuid AND id = @channel_id::uuid AND deleted_at IS NULL;

-- name: ChannelLockForLists :execrows
-- Serializes the folded write of a large channel's lists with its
-- membership changes (their ChannelLockForChange waits), without blocking
-- the foreign-key checks of its messages and members. The fold takes no
-- write lock: a change waiting here is not queued for it, so the channel's
-- messages are not held for the fold. Zero rows: no live channel.
SELECT 1 FROM channels
WHERE community_id = @community_id::uuid AND id = @id::uuid AND deleted_at IS NULL
FOR NO KEY UPDATE;

-- name: ChannelLockForWorkflows :execrows
-- Serializes the saves that may add an active workflow to one channel, so
-- that WorkflowsActiveInChannel, counted after it, cannot be raced past the
-- per-channel bound. Taken before the save's channel check
-- (ChannelWritesLockShared), as a change takes the row before the write
-- lock. FOR NO KEY UPDATE conflicts with ChannelLockForChange (membership
-- changes wait, briefly) but not with the FOR KEY SHARE that foreign keys
-- from events and members take. Zero rows: no live channel.
SELECT 1 FROM channels
WHERE community_id = @community_id::uuid AND id = @id::uuid AND deleted_at IS NULL
FOR NO KEY UPDATE;

-- name: ChannelAccess :one
-- What a pubkey may do in a channel: the channel's state and the caller's
-- active role (NULL when not an active member), and the channel's readers
-- version (channels.readers_version): the write's fan-out rereads a reader
-- set cached before it. A write reads it after ChannelWritesLockShared.
SELECT c.visibility, c.archived_at, m.role AS member_role, c.readers_version
FROM channels c
LEFT JOIN channel_members m
    ON m.community_id = c.community_id AND m.channel_id = c.id
   AND m.pubkey = @pubkey::bytea AND m.removed_at IS NULL
WHERE c.community_id = @community_id::uuid AND c.id = @id::uuid AND c.deleted_at IS NULL;

-- name: ChannelsReadable :many
-- The channels a pubkey may read: every open channel and every
-- channel it is an active member of, never a deleted one.
SELECT c.id
FROM channels c
WHERE c.community_id = @community_id::uuid
  AND c.deleted_at IS NULL
  AND (c.visibility = 'open' OR EXISTS (
      SELECT FROM channel_members m
      WHERE m.community_id = c.community_id AND m.channel_id = c.id
        AND m.pubkey = @pubkey::bytea AND m.removed_at IS NULL));

-- name: ChannelReaders :one
-- Who may read one channel, for live delivery: everyone when it is open,
-- else its active members. Asked once per published channel event (and
-- cached), never once per subscriber. No row: the channel is deleted.
SELECT c.visibility, c.readers_version,
       coalesce(array_agg(m.pubkey) FILTER (WHERE m.pubkey IS NOT NULL), '{}')::bytea[] AS members
FROM channels c
LEFT JOIN channel_members m
    ON c.visibility = 'private'
   AND m.community_id = c.community_id AND m.channel_id = c.id AND m.removed_at IS NULL
WHERE c.community_id = @community_id::uuid AND c.id = @id::uuid AND c.deleted_at IS NULL
GROUP BY c.visibility, c.readers_version;

-- name: ChannelUpdateMetadata :exec
UPDATE channels
SET name = coalesce(sqlc.narg('name')::text, name),
    description = coalesce(sqlc.narg('description')::text, description),
    visibility = coalesce(sqlc.narg('visibility')::channel_visibility, visibility),
    updated_at = coalesce(sqlc.narg('now')::timestamptz, now())
WHERE community_id = @community_id::uuid AND id = @id::uuid;

-- name: ChannelSoftDelete :exec
UPDATE channels SET deleted_at = coalesce(sqlc.narg('now')::timestamptz, now()), updated_at = coalesce(sqlc.narg('now')::timestamptz, now())
WHERE community_id = @community_id::uuid AND id = @id::uuid AND deleted_at IS NULL;

-- name: ChannelCommunities :many
-- Deliberately tenant-independent: reports each live channel's true
-- owning community for the tracer's non-interference check. Served by
-- idx_channels_id_live. Unknown ids are simply absent.
SELECT id, community_id FROM channels WHERE id = ANY(@ids::uuid[]) AND deleted_at IS NULL;
