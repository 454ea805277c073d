-- Operator-listener mention delivery. The poll's claim is rendered from
-- queries/templates/outbox_claim.sql.tmpl; everything after a claim is here.

-- name: OutboxEnqueueMentions :one
-- Runs in the event's transaction, only when the event row was newly
-- inserted: one outbox row per (registered listener, mentioned target).
--
-- Rows for listeners this pod routes (@routable), at most @claim_max of
-- them, are inserted already claimed for this pod's worker: 'sending' under
-- @claim_id, attempt 1, leased for @lease_ms, exactly as OutboxClaimDue
-- would leave them (a new row is trivially due: pending, due now, within
-- retention, no attempt spent, and its community takes writes or the event
-- insert would have failed). The worker then POSTs right after the commit
-- with no claim round trip between. Every claim guarantee holds: nobody
-- else can claim a row under a live lease, and a hand-off that never
-- happens (rollback: the row never existed; a crash before the hand-off)
-- leaves the row to any pod's poll once the lease expires. The other rows
-- are pending, for the poll of a pod that routes them.
--
-- A target is paged only about an event it may read: one in @channel_id
-- (NULL: no channel, everyone) when that channel is open or the target is
-- an active member (channel_readable_by, the rule of ChannelsReadable),
-- read in the event's own transaction. Otherwise any user could make a
-- private channel page an outsider's listener with the event's id, kind
-- and time. OutboxClaimDue asks again before every later attempt.
--
-- Returns the claimed rows (as parallel arrays, at most @claim_max) and
-- the total inserted, so a large fan-out never builds an unbounded list in
-- the relay; the rows of routable listeners left pending (left_to_poll:
-- the claim had no room for them, so the worker's poll is woken for them
-- after the commit); and, like OutboxClaimDue, how much of their lease is left as
-- the statement ends (the lease started with the transaction, which may be
-- old by now).
WITH registered AS (
    SELECT r.listener_pubkey, r.target_pubkey,
           r.listener_pubkey = ANY(@routable::bytea[]) AS routable
    FROM operator_listener_pubkeys r
    WHERE r.target_pubkey = ANY(@targets::bytea[])
      AND channel_readable_by(@community_id::uuid, sqlc.narg('channel_id')::uuid, r.target_pubkey)
),
ranked AS (
    SELECT listener_pubkey, target_pubkey,
           routable AND row_number() OVER (PARTITION BY routable ORDER BY listener_pubkey, target_pubkey)
                        <= @claim_max::int AS claimed
    FROM registered
),
inserted AS (
    INSERT INTO operator_listener_outbox (listener_pubkey, target_pubkey, community_id, event_id, event_kind, event_created_at,
                                          created_at, next_attempt_at, state, claim_id, lease_until, attempts)
    SELECT c.listener_pubkey, c.target_pubkey, @community_id::uuid, @event_id::bytea, @event_kind::int,
           to_timestamp(@event_created_at::bigint),
           coalesce(sqlc.narg('now')::timestamptz, now()), coalesce(sqlc.narg('now')::timestamptz, now()),
           CASE WHEN c.claimed THEN 'sending' ELSE 'pending' END,
           CASE WHEN c.claimed THEN @claim_id::uuid END,
           CASE WHEN c.claimed THEN coalesce(sqlc.narg('now')::timestamptz, now()) + interval '1 millisecond' * @lease_ms::bigint END,
           CASE WHEN c.claimed THEN 1 ELSE 0 END
    FROM ranked c
    ON CONFLICT DO NOTHING
    RETURNING id, listener_pubkey, target_pubkey, state, lease_until
)
SELECT coalesce(array_agg(i.id ORDER BY i.id) FILTER (WHERE i.state = 'sending'), '{}')::uuid[] AS claimed_ids,
       coalesce(array_agg(i.listener_pubkey ORDER BY i.id) FILTER (WHERE i.state = 'sending'), '{}')::bytea[] AS claimed_listeners,
       coalesce(array_agg(i.target_pubkey ORDER BY i.id) FILTER (WHERE i.state = 'sending'), '{}')::bytea[] AS claimed_targets,
       coalesce((SELECT k.host FROM communities k WHERE k.id = @community_id::uuid), '')::text AS host,
       count(*) AS inserted,
       count(*) FILTER (WHERE i.state = 'pending' AND i.listener_pubkey = ANY(@routable::bytea[])) AS left_to_poll,
       coalesce(floor(extract(epoch FROM min(i.lease_until) - coalesce(sqlc.narg('now')::timestamptz, clock_timestamp())) * 1000), 0)::bigint AS lease_left_ms
FROM inserted i;

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

-- name: OutboxDeleteUnsentForTargets :execrows
-- A listener removed these targets: its queued notifications about them go
-- (due now or waiting to retry), except rows a worker is sending now, which
-- a claim holds (a pending row being claimed is re-read as sending and
-- kept) and which finish as claimed.
-- Rows of a community being deleted are skipped (its deletion purges them),
-- not an error that would keep the listener from removing the target.
DELETE FROM operator_listener_outbox
WHERE listener_pubkey = @listener::bytea AND target_pubkey = ANY(@targets::bytea[])
  AND state = 'pending'
  AND community_write_allowed(community_id);
