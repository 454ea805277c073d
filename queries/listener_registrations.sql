-- Operator-listener registrations: the target pubkeys each listener is told
-- about. Deployment-wide, not per community.

-- name: ListenerRegistrationsUpsert :execrows
-- Registers targets for a listener. A repeated registration refreshes
-- created_at, renewing its 30-day lifetime.
INSERT INTO operator_listener_pubkeys (listener_pubkey, target_pubkey, created_at)
SELECT DISTINCT @listener::bytea, t.target_pubkey, coalesce(sqlc.narg('now')::timestamptz, now())
FROM unnest(@targets::bytea[]) AS t (target_pubkey)
ON CONFLICT (listener_pubkey, target_pubkey) DO UPDATE SET created_at = EXCLUDED.created_at;

-- name: ListenerRegistrationsDelete :execrows
-- Idempotent: targets that are not registered are ignored. Run through
-- outbox.RemoveTargets, which drops the targets' queued rows with it.
DELETE FROM operator_listener_pubkeys
WHERE listener_pubkey = @listener::bytea AND target_pubkey = ANY(@targets::bytea[]);

-- name: ListenerRegistrationsList :many
-- Registrations, all listeners when listener is NULL.
SELECT listener_pubkey, target_pubkey, created_at
FROM operator_listener_pubkeys
WHERE sqlc.narg('listener')::bytea IS NULL OR listener_pubkey = sqlc.narg('listener')::bytea
ORDER BY listener_pubkey, created_at, target_pubkey;

-- name: ListenerRegistrationsReapExpired :execrows
-- Registrations not renewed within their lifetime stop generating outbox rows.
DELETE FROM operator_listener_pubkeys
WHERE created_at < coalesce(sqlc.narg('now')::timestamptz, now()) - interval '1 millisecond' * @lifetime_ms::bigint;
