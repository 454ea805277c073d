-- name: HTTPAuthReplayClaim :execrows
-- Claims a NIP-98 auth event for one request. Zero rows affected means the
-- event was already used in this community: a replay.
INSERT INTO http_auth_replays (community_id, event_id, expires_at)
VALUES (@community_id::uuid, @event_id::bytea, @expires_at::timestamptz)
ON CONFLICT (community_id, event_id) DO NOTHING;

-- name: HTTPAuthReplaysPurge :execrows
-- Drops a community's claims whose auth events can no longer pass the
-- created_at check.
DELETE FROM http_auth_replays
WHERE community_id = @community_id::uuid
  AND expires_at < coalesce(sqlc.narg('now')::timestamptz, now());

-- name: HTTPAuthReplayRelease :exec
-- Gives a claim back: its request stored nothing and failed for the relay's
-- reason, so the same auth header may be sent again within its window.
DELETE FROM http_auth_replays
WHERE community_id = @community_id::uuid AND event_id = @event_id::bytea;
