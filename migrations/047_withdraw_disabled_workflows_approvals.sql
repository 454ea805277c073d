-- 047: approvals still pending on workflows their owner's removal disabled
-- end now, as a removal ends them today.
--
-- Why: an owner's leaving or removal disables their workflows in the
-- channel (workflows_disable_on_owner_removal), and a decision of such a
-- workflow's approval is refused. A removal now also ends those approvals
-- in its transaction (the OwnerRemoval side rows); one that was pending on
-- a workflow disabled before that waits, for nothing, until it expires (up
-- to a week), and its run then ends approval_expired, which says nobody
-- decided rather than why nobody could. This ends them the way a removal
-- does: the approval becomes expired with the reason as its note, its
-- waiting run fails with workflow_disabled and the same diagnostic,
-- completed now. A removal emits no event for them, so neither does this
-- (its only other trace, buzz_workflow_runs_total, is a process's counter a
-- migration cannot reach: these runs are not counted). A workflow its
-- owner's removal disabled is one that is active and not enabled
-- (archiving clears both, a save enables it again).
-- Lock impact: one statement; ROW EXCLUSIVE on workflow_approvals and
-- workflow_runs, a row lock on each approval and run it ends; it waits at
-- most lock_timeout for a decision holding one. No table is rewritten.
-- Pending approvals are few (workflow_approvals_pending_expiry holds them); the
-- candidates are found first, so that the fence check, which takes a shared
-- advisory lock per community, runs only for their communities. Rows of a
-- community being deleted are left to its deletion (community_write_allowed).
-- Deploy: any order. A relay of a version before the OwnerRemoval side rows
-- still leaves such approvals pending; this statement is idempotent and may
-- be run again by hand once none is left.
-- Roll back: nothing is undone; the ended runs stay ended, as a removal
-- would have left them.

SET LOCAL lock_timeout = '5s';

WITH candidates AS MATERIALIZED (
    SELECT a.community_id, a.token
    FROM workflow_approvals a
    JOIN workflows w ON w.community_id = a.community_id AND w.id = a.workflow_id
    WHERE a.status = 'pending' AND w.status = 'active' AND NOT w.enabled
), withdrawn AS (
    UPDATE workflow_approvals a
    SET status = 'expired',
        note = 'the workflow was disabled while the run waited for approval: its owner is no longer a member of the channel'
    FROM candidates c
    WHERE a.community_id = c.community_id AND a.token = c.token AND a.status = 'pending'
      AND community_write_allowed(c.community_id)
    RETURNING a.community_id, a.run_id
)
UPDATE workflow_runs r
SET status = 'failed',
    error_code = 'workflow_disabled',
    error_message = 'the workflow was disabled while the run waited for approval: its owner is no longer a member of the channel',
    completed_at = now()
FROM withdrawn
WHERE r.community_id = withdrawn.community_id AND r.id = withdrawn.run_id
  AND r.status = 'waiting_approval';

---- create above / drop below ----

-- Nothing to undo (see Roll back above); tern needs a statement.
SELECT 1;
