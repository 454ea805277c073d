-- name: HTTPAuthReplayClaim :execrows
-- Claims a NIP-98 auth event for one request. Zero rows affected means the
-- event was already used in this community: a replay.
INSERT INTO http_auth_replays (community_id, event_id, expires_at)
VALUES (@community_id::uuid, @event_id::bytea, @expires_at::timestamptz)
ON CONFLICT (community_id, event_id) DO NOTHING;

-- name: HTTPAuthReplaysPurge :execrows
-- Drops up to batch of a community's claims whose auth events can no
-- longer pass the created_at check, oldest first (http_auth_replays_expiry):
-- it runs on a request's path, so a backlog is purged a batch per request
-- rather than all at once. now is the relay's clock, which checked the
-- events' created_at, not the database's.
DELETE FROM http_auth_replays
WHERE community_id = @community_id::uuid
  AND event_id IN (
    SELECT event_id FROM http_auth_replays
    WHERE community_id = @community_id::uuid AND expires_at < @now::timestamptz
    ORDER BY expires_at
    LIMIT @batch::int
  );

-- name: HTTPAuthReplayRelease :exec
-- Gives a claim back: its request stored nothing and failed for the relay's
-- reason, so the same auth header may be sent again within its window.
DELETE FROM http_auth_replays
WHERE community_id = @community_id::uuid AND event_id = @event_id::bytea;
