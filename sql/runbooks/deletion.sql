-- Runbook: whole-community deletion (internal/deletion, docs/deletion.md).
--
--   psql -X -v ON_ERROR_STOP=1 -f sql/runbooks/deletion.sql "$BUZZ_DATABASE_URL"
--
-- Read-only. In short: `buzz-admin deletions submit` opens a request and
-- freezes its inventory (stage inventoried); `approve` binds an approval
-- to that exact inventory digest (approved); `run ID` or `drain` claims it
-- under a lease and walks it through fenced, drained, bindings_removed,
-- postgres_purged, cache_purged, logically_verified to retention_pending.
-- A blocked request stays where it is until `buzz-admin deletions unblock`.
--
-- Healthy: no request blocked, no lease expired while its executor's
-- heartbeat is old (a dead executor: the next run takes it over after the
-- lease), no fenced or quiescing community without a request moving.

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
SET application_name = 'buzz runbook deletion';
\set QUIET off

\echo '== 1. Requests by stage'
SELECT stage, count(*) AS requests,
       count(*) FILTER (WHERE blocked_at IS NOT NULL) AS blocked,
       count(*) FILTER (WHERE lease_until >= now()) AS leased,
       max(updated_at) AS last_change
FROM community_deletion_requests
GROUP BY stage
ORDER BY array_position(ARRAY['submitted', 'inventoried', 'approved', 'fenced', 'drained', 'bindings_removed',
                              'postgres_purged', 'cache_purged', 'logically_verified', 'retention_pending'], stage);

\echo '== 2. Lease holders and heartbeat age'
-- A lease whose executor stopped beating will expire; `deletions run ID`
-- (or drain) then takes the request over under the next generation. An
-- executor that beats while its lease expired lost the request: its late
-- writes are refused by generation.
SELECT r.id AS request_id, r.community_host, r.stage, r.lease_owner, r.lease_generation,
       date_trunc('second', r.lease_until - now()) AS lease_left,
       h.mode, h.draining, date_trunc('second', now() - h.heartbeat_at) AS heartbeat_age, h.stopped_at
FROM community_deletion_requests r
LEFT JOIN community_deletion_executor_heartbeats h ON h.executor_id = r.lease_owner
WHERE r.lease_owner IS NOT NULL
ORDER BY r.lease_until;

\echo '== 3. Executors seen'
SELECT executor_id, mode, request_id, lease_generation, stage, draining,
       date_trunc('second', now() - heartbeat_at) AS heartbeat_age, stopped_at
FROM community_deletion_executor_heartbeats
ORDER BY heartbeat_at DESC
LIMIT 20;

\echo '== 4. Blocked requests and why'
-- Fix the cause, then: buzz-admin deletions unblock ID --unblocked-by WHO --reason WHY
SELECT id, community_host, stage, blocked_at, blocked_reason, retry_count, last_error
FROM community_deletion_requests
WHERE blocked_at IS NOT NULL
ORDER BY blocked_at;

\echo '== 5. Retrying requests (transient failures, next attempt)'
SELECT id, community_host, stage, retry_stage, retry_count, next_attempt_at, left(last_error, 200) AS last_error
FROM community_deletion_requests
WHERE blocked_at IS NULL AND retry_count > 0
ORDER BY next_attempt_at;

\echo '== 6. Object deletion progress per request (manifest chunks)'
SELECT k.request_id, r.community_host, count(*) AS chunks, count(k.deleted_at) AS chunks_deleted,
       sum(jsonb_array_length(k.keys)) AS keys,
       sum(jsonb_array_length(k.keys)) FILTER (WHERE k.deleted_at IS NOT NULL) AS keys_deleted,
       max(k.deleted_at) AS last_chunk_deleted_at
FROM community_deletion_manifest_keys k
JOIN community_deletion_requests r ON r.id = k.request_id
GROUP BY k.request_id, r.community_host
ORDER BY k.request_id;

\echo '== 7. Chunks of unfinished requests: per request, the next 20 to delete (all deleted: the last 20)'
-- Per request, so one large manifest cannot hide the others, and from
-- where deletion stands, not from chunk 0 (a request's chunks go once it
-- is verified, so only unfinished ones have any).
SELECT k.request_id, k.chunk_no, k.prefix, k.key_class, jsonb_array_length(k.keys) AS keys, k.deleted_at,
       c.lease_generation, c.detail
FROM (SELECT k.*, row_number() OVER (PARTITION BY k.request_id
                                     ORDER BY k.deleted_at IS NOT NULL,
                                              CASE WHEN k.deleted_at IS NULL THEN k.chunk_no ELSE -k.chunk_no END) AS nth
      FROM community_deletion_manifest_keys k) k
LEFT JOIN community_deletion_checkpoints c
  ON c.request_id = k.request_id AND c.stage = 'drained' AND c.unit_key = 'chunk:' || k.chunk_no
WHERE k.nth <= 20
ORDER BY k.request_id, k.chunk_no;

\echo '== 8. Latest checkpoints (failures first)'
SELECT request_id, sequence, stage, unit_key, status, lease_generation, attempts,
       left(coalesce(error, detail::text), 200) AS error_or_detail, completed_at
FROM community_deletion_checkpoints
ORDER BY (status = 'failed') DESC, sequence DESC
LIMIT 30;

\echo '== 9. Communities not active, and their request'
SELECT c.id, c.host, c.deletion_state, c.deletion_fence_generation, c.deleted_at, r.id AS request_id, r.stage
FROM communities c
LEFT JOIN community_deletion_requests r ON r.community_id = c.id
WHERE c.deletion_state <> 'active'
ORDER BY c.host;

\echo '== 10. Catalog safety (empty when every community-scoped table is fenced)'
SELECT * FROM community_deletion_catalog_problems();

\echo '== 11. Live serving-write leases (the fence waits for these)'
SELECT community_id, operation, owner, fence_generation, date_trunc('second', lease_until - now()) AS left
FROM community_serving_write_leases
WHERE lease_until >= now()
ORDER BY lease_until;
