-- NIP-10 reply trees inside channels (thread_metadata). Every reply's row is
-- written in its event's transaction; counters move by relative increments
-- and every writer of one thread first locks the thread's root row, so the
-- replies of a thread serialize and always lock in the same order.

-- name: ThreadParentLookup :one
-- The parent a reply names: a live event of the same community and channel
-- (not deleted, not expired by @now, the relay's clock, as EventReactionTarget),
-- with its thread row when it has one (NULL depth: a top-level message that
-- nobody answered yet); reader_is_party says whether a p tag names the
-- replier or the replier wrote it (p-gated kinds, as EventReactionTarget).
SELECT e.created_at, e.kind,
       (e.tag_index && ARRAY['p:' || @reader_hex::text] OR e.pubkey = decode(@reader_hex::text, 'hex'))::boolean AS reader_is_party,
       t.depth, t.root_event_id, t.root_created_at
FROM events e
LEFT JOIN thread_metadata t
    ON t.community_id = e.community_id AND t.event_created_at = e.created_at AND t.event_id = e.id
WHERE e.community_id = @community_id::uuid
  AND e.id = @id::bytea
  AND e.channel_id = @channel_id::uuid
  AND e.deleted_at IS NULL
  AND (e.expires_at IS NULL OR e.expires_at > @now::timestamptz)
LIMIT 1;

-- name: ThreadTopLevelEnsure :exec
-- A top-level message gets its depth-0 row when its first reply arrives.
-- Concurrent first replies: the second waits on the first's uncommitted row,
-- then does nothing.
INSERT INTO thread_metadata (community_id, event_created_at, event_id, channel_id)
VALUES (@community_id::uuid, @event_created_at::timestamptz, @event_id::bytea, @channel_id::uuid)
ON CONFLICT DO NOTHING;

-- name: ThreadRootLock :one
-- Taken first by every reply of a thread: serializes them, so the counter
-- updates below never interleave or deadlock.
SELECT depth FROM thread_metadata
WHERE community_id = @community_id::uuid
  AND event_created_at = @event_created_at::timestamptz
  AND event_id = @event_id::bytea
FOR UPDATE;

-- name: ThreadReplyInsert :exec
INSERT INTO thread_metadata (
    community_id, event_created_at, event_id, channel_id,
    parent_event_id, parent_created_at, root_event_id, root_created_at, depth
) VALUES (
    @community_id::uuid, @event_created_at::timestamptz, @event_id::bytea, @channel_id::uuid,
    @parent_event_id::bytea, @parent_created_at::timestamptz,
    @root_event_id::bytea, @root_created_at::timestamptz, @depth::int
);

-- name: ThreadAncestorsCountReply :execrows
-- Counts a new reply on the path from its parent up to the root: the parent's
-- reply_count, every ancestor's descendant_count and last_reply_at. Returns
-- the number of ancestors touched (the reply's depth).
WITH RECURSIVE ancestors AS (
    SELECT a.event_created_at, a.event_id, a.parent_created_at, a.parent_event_id
    FROM thread_metadata a
    WHERE a.community_id = @community_id::uuid
      AND a.event_created_at = @parent_created_at::timestamptz
      AND a.event_id = @parent_event_id::bytea
    UNION ALL
    SELECT up.event_created_at, up.event_id, up.parent_created_at, up.parent_event_id
    FROM thread_metadata up
    JOIN ancestors ON up.event_created_at = ancestors.parent_created_at AND up.event_id = ancestors.parent_event_id
    WHERE up.community_id = @community_id::uuid
)
UPDATE thread_metadata t
SET reply_count = t.reply_count + CASE WHEN t.event_id = @parent_event_id::bytea THEN 1 ELSE 0 END,
    descendant_count = t.descendant_count + 1,
    last_reply_at = greatest(t.last_reply_at, @reply_created_at::timestamptz)
FROM ancestors
WHERE t.community_id = @community_id::uuid
  AND t.event_created_at = ancestors.event_created_at
  AND t.event_id = ancestors.event_id;
