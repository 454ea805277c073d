-- 040: a run whose step keeps losing its worker is ended, not resumed for
-- ever (workflow_runs.expired_leases, error code step_abandoned).
--
-- Why: a run's lease expires when its worker stops mid-step (a crash, a
-- kill -9, an OOM) or its step outlasts the lease, and the next poll of any
-- process resumes it at the same step. Nothing bounded that: a step that
-- kills its worker (a panic, memory) was taken by every process in turn,
-- one crash per lease, with nothing in run history or metrics to say why.
-- The claim now counts, per run, the leases that expired at its current
-- step (reset by every transition that moves the step), and the engine
-- ends a run whose count reached its bound with step_abandoned.
-- Lock impact: ACCESS EXCLUSIVE on workflow_runs for an instant: ADD COLUMN
-- with a constant default changes only the catalog (no rewrite), and the
-- wider CHECK is added NOT VALID (no scan). It is not validated: every
-- existing row passed the earlier CHECK, whose list this one contains.
-- Deploy: processes of the previous version neither count nor read the
-- column, and never write the new code; run it before the new version.
-- Roll back: the down part restores the earlier CHECK (it fails while runs
-- carry step_abandoned: set those to legacy_unclassified first) and drops
-- the column.

SET LOCAL lock_timeout = '5s';

ALTER TABLE workflow_runs ADD COLUMN expired_leases integer NOT NULL DEFAULT 0
    CONSTRAINT workflow_runs_expired_leases_nonnegative CHECK (expired_leases >= 0);

COMMENT ON COLUMN workflow_runs.expired_leases IS
    'Leases that expired at the run''s current step (its worker stopped or outlasted the lease); counted by the claim that resumes it, reset when the step moves. At the engine''s bound the run ends with step_abandoned.';

ALTER TABLE workflow_runs DROP CONSTRAINT workflow_runs_error_code_known;
ALTER TABLE workflow_runs ADD CONSTRAINT workflow_runs_error_code_known CHECK (error_code IN (
    'invalid_yaml', 'invalid_definition', 'condition_evaluation_failed',
    'template_resolution_failed', 'step_timeout', 'webhook_failed',
    'capacity_exceeded', 'database_error', 'owner_unauthorized',
    'action_not_implemented', 'approval_denied', 'approval_expired',
    'workflow_disabled', 'step_abandoned', 'legacy_unclassified')) NOT VALID;

---- create above / drop below ----

SET LOCAL lock_timeout = '5s';

ALTER TABLE workflow_runs DROP CONSTRAINT workflow_runs_error_code_known;
ALTER TABLE workflow_runs ADD CONSTRAINT workflow_runs_error_code_known CHECK (error_code IN (
    'invalid_yaml', 'invalid_definition', 'condition_evaluation_failed',
    'template_resolution_failed', 'step_timeout', 'webhook_failed',
    'capacity_exceeded', 'database_error', 'owner_unauthorized',
    'action_not_implemented', 'approval_denied', 'approval_expired',
    'workflow_disabled', 'legacy_unclassified'));
ALTER TABLE workflow_runs DROP COLUMN expired_leases;
