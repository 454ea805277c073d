-- Runbook: operator-listener mention delivery (internal/outbox, docs/listener-delivery.md).
--
--   psql -X -v ON_ERROR_STOP=1 -f sql/runbooks/listener_outbox.sql "$BUZZ_DATABASE_URL"
--
-- Read-only. How the outbox works, in short: a stored message that p-tags a
-- registered target gets one row per (listener, target) in
-- operator_listener_outbox, in the event's own transaction. A delivery
-- worker claims it (state 'sending', attempts + 1, a 30 s lease, a claim_id),
-- POSTs to the listener, and deletes the row on success or terminal failure.
-- Transient failures (408, 429, 5xx, network, timeout) go back to 'pending'
-- with next_attempt_at 1, 2, 4 ... 128 s later; attempt 9 is the last. Rows
-- older than 15 minutes are never claimed again and the reaper deletes them
-- every 5 minutes, so this table only ever holds recent work.
--
-- Healthy: few or no rows; nothing older than a few seconds unless a
-- listener is failing. Also see the relay's metrics:
--   buzz_operator_listener_deliveries_total{outcome="accepted|retry|failed|unroutable"}
--   buzz_operator_listener_handoff_dropped_total (the poll covers these)

-- Read-only in fact, not only by intent, and never stuck behind a lock: a
-- statement that waits 2 s for one (a migration's ACCESS EXCLUSIVE, say)
-- stops the runbook with "lock timeout" instead of holding every section
-- for the 30 s statement timeout. Named, so pg_stat_activity (and the
-- replica probe's warning, should a slow section hold its wall) tells
-- this session from the relays'.
\set QUIET on
SET default_transaction_read_only = on;
SET statement_timeout = '30s';
SET lock_timeout = '2s';
SET application_name = 'buzz runbook listener_outbox';
\set QUIET off

\echo '== 1. Backlog per listener (pending = waiting or retrying, sending = leased to a worker)'
-- A growing pending count with due_now > 0 means no worker claims this
-- listener's rows: check that some relay pod lists the listener in
-- BUZZ_OPERATOR_LISTENERS (a pod only claims rows of listeners it routes).
SELECT encode(listener_pubkey, 'hex')                                  AS listener,
       count(*) FILTER (WHERE state = 'pending')                       AS pending,
       count(*) FILTER (WHERE state = 'sending')                       AS sending,
       count(*) FILTER (WHERE state = 'pending' AND next_attempt_at <= now()) AS due_now,
       min(created_at)                                                 AS oldest_created_at,
       date_trunc('second', now() - min(created_at))                   AS oldest_age
FROM operator_listener_outbox
GROUP BY listener_pubkey
ORDER BY count(*) DESC, listener;

\echo '== 2. Due rows per listener and community (the poll serves a listener''s communities in turn)'
-- If these stay due for more than a few seconds, no worker is polling:
-- check that the relay pods run the delivery worker (log line
-- "operator-listener mention delivery worker started"). Within a community
-- the poll takes the earliest due row first.
SELECT encode(listener_pubkey, 'hex') AS listener, community_id, count(*) AS due_now,
       min(next_attempt_at) AS earliest_due,
       date_trunc('second', now() - min(created_at)) AS oldest_age
FROM operator_listener_outbox
WHERE state = 'pending' AND next_attempt_at <= now()
GROUP BY listener_pubkey, community_id
ORDER BY min(next_attempt_at), listener, community_id
LIMIT 20;

\echo '== 3. Expired leases (a worker died or stalled mid-delivery; any poll reclaims these)'
SELECT id, encode(listener_pubkey, 'hex') AS listener, attempts, claim_id,
       lease_until, date_trunc('second', now() - lease_until) AS expired_for
FROM operator_listener_outbox
WHERE state = 'sending' AND lease_until < now()
ORDER BY lease_until
LIMIT 20;

\echo '== 4. Retried rows (attempts > 1) and rows near the 15-minute retention cutoff'
-- Retries point at a failing listener (see the relay log lines
-- "operator-listener delivery will be retried" for the cause). Rows past
-- 15 minutes are dropped undelivered; mentions are not replayed.
SELECT id, encode(listener_pubkey, 'hex') AS listener, state, attempts,
       next_attempt_at, created_at,
       date_trunc('second', created_at + interval '15 minutes' - now()) AS until_dropped
FROM operator_listener_outbox
WHERE attempts > 1 OR created_at < now() - interval '10 minutes'
ORDER BY created_at
LIMIT 50;

\echo '== 5. Registrations per listener (each expires 30 days after its last renewal)'
-- expiring_7d > 0 with no renewal in sight means the listener stopped
-- re-registering; its targets stop producing rows once the daily sweep runs.
SELECT encode(listener_pubkey, 'hex')                                       AS listener,
       count(*)                                                            AS targets,
       min(created_at)                                                     AS oldest_registration,
       max(created_at)                                                     AS newest_registration,
       count(*) FILTER (WHERE created_at < now() - interval '23 days')     AS expiring_7d,
       count(*) FILTER (WHERE created_at < now() - interval '30 days')     AS past_lifetime
FROM operator_listener_pubkeys
GROUP BY listener_pubkey
ORDER BY listener;
