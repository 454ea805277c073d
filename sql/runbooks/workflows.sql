-- Runbook: workflows (internal/workflow, docs/workflows.md).
--
--   psql -X -v ON_ERROR_STOP=1 -f sql/runbooks/workflows.sql "$BUZZ_DATABASE_URL"
--
-- Read-only. In short: a triggering event, the scheduler or a webhook call
-- inserts a workflow_runs row ('pending', due at run_at). A worker claims it
-- ('running', a claim_id and a lease of BUZZ_WORKFLOW_RUN_LEASE), executes
-- one step per transaction, and ends it 'completed', 'failed' or
-- 'cancelled' (error_code says why), or parks it: 'pending' with a future
-- run_at for a delay, 'waiting_approval' for an approval. A running run
-- whose lease expired is resumed by any worker at current_step.
--
-- Healthy: nothing pending with run_at in the past for more than a few
-- seconds, no expired leases for long, failures explained by error_code.

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
SET application_name = 'buzz runbook workflows';
\set QUIET off

\echo '== 1. Runs by status and error_code'
SELECT status, coalesce(error_code, '-') AS error_code, count(*) AS runs,
       max(created_at) AS newest
FROM workflow_runs
GROUP BY status, error_code
ORDER BY status, error_code;

\echo '== 2. Overdue runs (pending and due, oldest first)'
-- Rows here for more than BUZZ_WORKFLOW_POLL mean no worker polls: check
-- that the relay processes run and log no "workflow run poll failed".
SELECT community_id, id, workflow_id, current_step, run_at,
       date_trunc('second', now() - run_at) AS overdue_by, attempts
FROM workflow_runs
WHERE status = 'pending' AND run_at <= now()
ORDER BY run_at
LIMIT 50;

\echo '== 3. Running runs whose lease expired (a worker stopped mid-run)'
-- The next poll of any worker resumes these at current_step. A run that
-- shows up here again and again (expired_leases growing) stops a worker
-- each time: look for panics or database errors in that workflow's logs.
-- At 3 expiries at one step the claim ends it with step_abandoned.
SELECT community_id, id, workflow_id, current_step, attempts, expired_leases, claim_id, lease_until,
       date_trunc('second', now() - lease_until) AS expired_for
FROM workflow_runs
WHERE status = 'running' AND lease_until < now()
ORDER BY lease_until
LIMIT 50;

\echo '== 4. Pending approvals (expired ones are swept by the next scheduler tick)'
SELECT a.community_id, encode(a.token, 'hex') AS approval_ref, a.workflow_id, a.run_id, a.step_id,
       a.approver_spec, a.expires_at, a.expires_at <= now() AS expired
FROM workflow_approvals a
WHERE a.status = 'pending'
ORDER BY a.expires_at
LIMIT 50;

\echo '== 5. Schedule slots claimed in the last hour, per workflow'
-- Compare with what the schedule should fire: fewer slots than expected
-- means the relay was down longer than BUZZ_WORKFLOW_SCHEDULE_CATCH_UP or
-- the workflow is disabled; a slot without a run means its transaction
-- failed after the claim (it cannot: claim and run commit together).
SELECT f.community_id, f.workflow_id, w.definition -> 'trigger' ->> 'interval' AS every,
       w.definition -> 'trigger' ->> 'cron' AS cron,
       count(*) AS slots_claimed, count(f.workflow_run_id) AS runs_linked,
       max(f.scheduled_for) AS last_slot,
       max(date_trunc('second', f.claimed_at - f.scheduled_for)) AS worst_lag
FROM scheduled_workflow_fires f
JOIN workflows w ON w.community_id = f.community_id AND w.id = f.workflow_id
WHERE f.scheduled_for > now() - interval '1 hour'
GROUP BY f.community_id, f.workflow_id, w.definition
ORDER BY f.community_id, f.workflow_id;

\echo '== 6. Workflows that fire nothing (disabled, archived, never pinned, or their definition expired)'
SELECT community_id, id, name, status, enabled, definition_event_id IS NULL AS unpinned,
       definition_expires_at, updated_at
FROM workflows
WHERE status <> 'active' OR NOT enabled OR definition_event_id IS NULL OR definition_expires_at <= now()
ORDER BY updated_at DESC
LIMIT 50;
