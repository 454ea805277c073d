-- Operator-listener mention delivery. The claims are rendered from
-- queries/templates/outbox_claim.sql.tmpl; everything after a claim is here.

-- name: OutboxEnqueueMentions :one
-- Runs in the event's transaction, only when the event row was newly
-- inserted: one outbox row per (registered listener, mentioned target).
-- Returns at most keep new ids (the hand-off capacity) and the total
-- inserted, so a large fan-out never builds an unbounded list in the relay.
WITH inserted AS (
    INSERT INTO operator_listener_outbox (listener_pubkey, target_pubkey, community_id, event_id, event_kind, event_created_at,
                                          created_at, next_attempt_at)
    SELECT r.listener_pubkey, r.target_pubkey, @community_id::uuid, @event_id::bytea, @event_kind::int,
           to_timestamp(@event_created_at::bigint),
           coalesce(sqlc.narg('now')::timestamptz, now()), coalesce(sqlc.narg('now')::timestamptz, now())
    FROM operator_listener_pubkeys r
    WHERE r.target_pubkey = ANY(@targets::bytea[])
    ON CONFLICT DO NOTHING
    RETURNING id
)
SELECT coalesce((array_agg(id))[1:sqlc.arg('keep')::int], '{}')::uuid[] AS kept_ids,
       count(*) AS inserted
FROM inserted;

-- name: OutboxComplete :execrows
-- A delivered or terminally failed row is deleted. Fenced: zero rows means
-- this worker lost its claim (lease expired and the row was claimed again,
-- or the reaper removed it).
DELETE FROM operator_listener_outbox
WHERE id = @id::uuid AND claim_id = @claim_id::uuid AND state = 'sending';

-- name: OutboxRetry :execrows
-- A transient failure: the row is due again after delay_ms. Never for the
-- last allowed attempt (that one is terminal). Fenced like OutboxComplete.
UPDATE operator_listener_outbox
SET state = 'pending',
    claim_id = NULL,
    lease_until = NULL,
    next_attempt_at = coalesce(sqlc.narg('now')::timestamptz, now()) + interval '1 millisecond' * @delay_ms::bigint
WHERE id = @id::uuid AND claim_id = @claim_id::uuid AND state = 'sending'
  AND attempts < @max_attempts::int;

-- name: OutboxRelease :execrows
-- This pod has no route for the row's listener: hand the row back without
-- spending an attempt, due again after delay_ms. Fenced like OutboxComplete.
UPDATE operator_listener_outbox
SET state = 'pending',
    claim_id = NULL,
    lease_until = NULL,
    next_attempt_at = coalesce(sqlc.narg('now')::timestamptz, now()) + interval '1 millisecond' * @delay_ms::bigint,
    attempts = greatest(attempts - 1, 0)
WHERE id = @id::uuid AND claim_id = @claim_id::uuid AND state = 'sending';

-- name: OutboxReapExpired :execrows
-- Rows older than the retention are never claimed again; the reaper drops
-- them (including a row whose worker is still sending: its completion is
-- then fenced out).
DELETE FROM operator_listener_outbox
WHERE created_at < coalesce(sqlc.narg('now')::timestamptz, now()) - interval '1 millisecond' * @retention_ms::bigint
  -- A community being deleted is skipped (its deletion removes the rows).
  AND community_write_allowed(community_id);

-- name: OutboxBacklogByListener :many
-- Undelivered rows per listener, for buzz-admin (all listeners when
-- listener is NULL).
SELECT listener_pubkey,
       count(*) FILTER (WHERE state = 'pending') AS pending,
       count(*) FILTER (WHERE state = 'sending') AS sending,
       min(created_at)::timestamptz AS oldest_created_at
FROM operator_listener_outbox
WHERE sqlc.narg('listener')::bytea IS NULL OR listener_pubkey = sqlc.narg('listener')::bytea
GROUP BY listener_pubkey
ORDER BY listener_pubkey;
