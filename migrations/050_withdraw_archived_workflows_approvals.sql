-- 050: approvals still pending on workflows archived before archiving ended
-- them end now, as an archive ends them today.
--
-- Why: a kind 5 naming a workflow's coordinate archives it (WorkflowArchive)
-- and a decision of its approvals is refused. An archive now also ends those
-- approvals in its transaction (withdrawApprovals); one that was pending on
-- a workflow archived before that waits, for nothing, until it expires (up
-- to a week), and its run then ends approval_expired, which says nobody
-- decided rather than why nobody could. Deleting the coordinate again does
-- not end it either: the archive finds the row already archived and does
-- nothing. This ends them the way an archive does: the approval becomes
-- expired with the reason as its note, its waiting run fails with
-- workflow_disabled and the same diagnostic, completed now. An archive emits
-- no event for them, so neither does this (buzz_workflow_runs_total, a
-- process's counter a migration cannot reach, does not count these runs).
-- An archived workflow is one whose status is 'archived'; migration 047
-- ended those disabled by their owner's removal (active, not enabled).
-- Lock impact: one statement; ROW EXCLUSIVE on workflow_approvals and
-- workflow_runs, a row lock on each approval and run it ends; it waits at
-- most lock_timeout for a decision holding one. No table is rewritten.
-- Pending approvals are few (workflow_approvals_pending_expiry holds them);
-- the candidates are found first, so that the fence check, which takes a
-- shared advisory lock per community, runs only for their communities. Rows
-- of a community being deleted are left to its deletion
-- (community_write_allowed): its fence would refuse them and abort the
-- migration.
-- Deploy: any order. A relay of a version before the archive's withdrawal
-- still leaves such approvals pending; this statement is idempotent and may
-- be run again by hand once none is left.
-- Roll back: nothing is undone; the ended runs stay ended, as an archive
-- would have left them.

SET LOCAL lock_timeout = '5s';

WITH candidates AS MATERIALIZED (
    SELECT a.community_id, a.token
    FROM workflow_approvals a
    JOIN workflows w ON w.community_id = a.community_id AND w.id = a.workflow_id
    WHERE a.status = 'pending' AND w.status = 'archived'
), withdrawn AS (
    UPDATE workflow_approvals a
    SET status = 'expired',
        note = 'the workflow was archived while the run waited for approval'
    FROM candidates c
    WHERE a.community_id = c.community_id AND a.token = c.token AND a.status = 'pending'
      AND community_write_allowed(c.community_id)
    RETURNING a.community_id, a.run_id
)
UPDATE workflow_runs r
SET status = 'failed',
    error_code = 'workflow_disabled',
    error_message = 'the workflow was archived while the run waited for approval',
    completed_at = now()
FROM withdrawn
WHERE r.community_id = withdrawn.community_id AND r.id = withdrawn.run_id
  AND r.status = 'waiting_approval';

---- create above / drop below ----

-- Nothing to undo (see Roll back above); tern needs a statement.
SELECT 1;
