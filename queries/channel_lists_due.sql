-- name: ChannelListsMarkDue :exec
-- Marks a channel's lists behind its membership, in the change's
-- transaction (which holds the channel's row lock). A mark already there
-- keeps its due_at: changes sustained faster than the interval still get
-- their lists written once per interval.
INSERT INTO channel_lists_due (community_id, channel_id, due_at)
VALUES (@community_id::uuid, @channel_id::uuid,
        coalesce(sqlc.narg('now')::timestamptz, now()) + make_interval(secs => @after_seconds::float8))
ON CONFLICT DO NOTHING;

-- name: ChannelListsClaimDue :one
-- Claims the oldest due mark until the claiming transaction ends; SKIP
-- LOCKED: processes folding at once take different channels, and a mark
-- whose writer died (its transaction rolled back) is found again. A
-- community whose writes are fenced (being deleted) is left alone.
SELECT community_id, channel_id FROM channel_lists_due
WHERE due_at <= coalesce(sqlc.narg('now')::timestamptz, now())
  AND community_write_allowed(community_id)
ORDER BY due_at
LIMIT 1
FOR UPDATE SKIP LOCKED;

-- name: ChannelListsDueDone :exec
-- The claimed mark's lists are written (or its channel is gone).
DELETE FROM channel_lists_due
WHERE community_id = @community_id::uuid AND channel_id = @channel_id::uuid;

-- name: ChannelListsPostponeDue :exec
-- A claimed mark whose lists failed to write is due again one interval
-- later, so that the marks behind it (the claim takes the oldest) are not
-- held up by one that keeps failing.
UPDATE channel_lists_due
SET due_at = coalesce(sqlc.narg('now')::timestamptz, now()) + make_interval(secs => @after_seconds::float8)
WHERE community_id = @community_id::uuid AND channel_id = @channel_id::uuid;
