-- Runbook: read-replica routing (internal/replica, docs/replica.md).
--
--   psql -X -v ON_ERROR_STOP=1 -f sql/runbooks/replica.sql "$BUZZ_DATABASE_URL"
--   psql -X -v ON_ERROR_STOP=1 -f sql/runbooks/replica.sql "$BUZZ_READ_DATABASE_URL"
--
-- Read-only; run it on the writer and on each reader (it tells which it is
-- on). In short: every relay process with a reader configured writes a
-- heartbeat token on the writer twice a second (replica_heartbeat.token + 1)
-- after sampling the open transactions. A routed read opens a read-only
-- snapshot on the reader whose first statement reads the token; the relay
-- serves the read there only if that token proves what the read needs,
-- else the writer answers. The relay's own view is the metric
-- buzz_db_route_decision{path,decision,reason}.
--
-- Healthy: on the writer, the token grows and every standby streams with a
-- replay lag well under a second; on a reader, the token is a little behind
-- the writer's and its replay age is small. A reader whose epoch differs
-- from the writer's proves nothing (it follows an older timeline).

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
SET application_name = 'buzz runbook replica';
\set QUIET off

SELECT pg_is_in_recovery() AS on_reader,
       -- Created but not preloaded, the view raises an error instead of answering.
       EXISTS (SELECT FROM pg_extension WHERE extname = 'pg_stat_statements')
         AND current_setting('shared_preload_libraries') ~ 'pg_stat_statements' AS has_pg_stat_statements
\gset

\echo '== 1. Heartbeat: epoch and token here'
-- On the writer this is what the probe last committed; on a reader, what
-- its replay has reached. Compare the two epochs: they must match.
SELECT epoch, token FROM replica_heartbeat WHERE id = 1;

\if :on_reader
\echo '== 2. This reader: replay position and age'
-- replay_age is how old the last transaction this standby replayed is:
-- the heartbeat age of this reader (the probe commits twice a second, so
-- a healthy reader stays under a second). paused means someone ran
-- pg_wal_replay_pause(): fresh reads then go to the writer as stale.
SELECT pg_last_wal_receive_lsn() AS received_lsn,
       pg_last_wal_replay_lsn() AS replayed_lsn,
       date_trunc('milliseconds', now() - pg_last_xact_replay_timestamp()) AS replay_age,
       pg_is_wal_replay_paused() AS paused;
\else
\echo 'Not in recovery: a writer. Run on BUZZ_READ_DATABASE_URL, this means the reader is no standby'
\echo '(the URL names the writer, or the standby was promoted): the relay routes nothing to it,'
\echo 'and /ready says "reader":"not_a_standby".'
\echo '== 2. Readers streaming from this writer: lag per reader'
-- One row per standby. replay_lag is the heartbeat age as that reader sees
-- it; bytes_behind is WAL not yet replayed there. No row: no standby is
-- connected, and every routed read records writer/... reasons.
SELECT application_name, client_addr, state, sync_state,
       replay_lag, pg_wal_lsn_diff(pg_current_wal_lsn(), replay_lsn) AS bytes_behind
FROM pg_stat_replication
ORDER BY application_name, client_addr;

\echo '== 2b. Open transactions on this writer, oldest first'
-- The probe's wall (what covered reads may be proved up to) stays at the
-- oldest open transaction's start, less the floor and 5 s: a transaction
-- left open (an idle-in-transaction session, a long backfill) sends every
-- covered read newer than that to the writer, recorded writer/stale. The
-- relay names it in a warning once it is older than 30 s;
-- buzz_db_replica_wall_lag_seconds shows how far the wall trails.
SELECT pid, application_name, usename, state,
       date_trunc('seconds', now() - xact_start) AS open_for, left(query, 60) AS last_statement
FROM pg_stat_activity
WHERE datname = current_database() AND xact_start IS NOT NULL AND pid <> pg_backend_pid()
  AND backend_type IS DISTINCT FROM 'autovacuum worker' -- the probe leaves them out too
ORDER BY xact_start
LIMIT 5;
\endif

\echo '== 3. Heartbeat statements by name (pg_stat_statements)'
\if :has_pg_stat_statements
-- On the writer: ReplicaHeartbeatAdvance counts probe ticks,
-- ReplicaHeartbeatRotateEpoch counts epoch rotations (one per relay process
-- start, and one per token that went backwards: a restore or re-seed). On a
-- reader:
-- ReplicaHeartbeatProve counts routed reads that reached the proof; the
-- relay's buzz_db_route_decision splits them by reason.
SELECT substring(query FROM '-- name: (\w+)') AS statement, sum(calls) AS calls,
       round(sum(total_exec_time)::numeric / greatest(sum(calls), 1), 3) AS mean_ms
FROM pg_stat_statements
WHERE query LIKE '%-- name: Replica%'
GROUP BY 1
ORDER BY 1;
\else
\echo 'pg_stat_statements is not installed and preloaded here: see buzz_db_route_decision on the relay instead.'
\endif
