-- name: ReplicaHeartbeatAdvance :one
-- The probe's token write: run last in its transaction, after the open
-- transactions were sampled.
UPDATE replica_heartbeat SET token = token + 1 WHERE id = 1
RETURNING token, epoch;

-- name: ReplicaHeartbeatRotateEpoch :one
-- A new epoch at each relay process's first probe tick and after the token
-- went backwards (a restore or re-seed): readers still on the old timeline
-- then fail the epoch check. The token still grows, so on one timeline
-- tokens only increase, across epochs too.
UPDATE replica_heartbeat SET epoch = gen_random_uuid(), token = token + 1 WHERE id = 1
RETURNING token, epoch;

-- name: ReplicaHeartbeatProve :one
-- The first statement of a routed read's transaction on a reader: it fixes
-- the snapshot and reports the token that snapshot holds, and whether the
-- server was still in recovery after the snapshot was taken (so the
-- snapshot holds nothing a promoted server wrote). The backend is evidence
-- for logs only.
SELECT token, epoch, pg_is_in_recovery() AS in_recovery,
       coalesce(host(inet_server_addr()) || ':' || inet_server_port()::text, 'local')
           || ' pid=' || pg_backend_pid()::text AS backend
FROM replica_heartbeat WHERE id = 1;
