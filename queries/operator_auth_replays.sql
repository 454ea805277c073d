-- The operator API's NIP-98 replay store: each auth event is accepted once.

-- name: OperatorAuthReplayClaim :execrows
-- Claims a NIP-98 auth event for one /operator/* request. Zero rows affected
-- means it was already used: a replay.
INSERT INTO operator_auth_replays (event_id, expires_at)
VALUES (@event_id::bytea, @expires_at::timestamptz)
ON CONFLICT (event_id) DO NOTHING;

-- name: OperatorAuthReplaysPurge :execrows
-- Drops claims whose auth events can no longer pass the created_at check.
DELETE FROM operator_auth_replays
WHERE expires_at < coalesce(sqlc.narg('now')::timestamptz, now());
