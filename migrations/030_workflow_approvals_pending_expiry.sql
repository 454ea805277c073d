---- tern: disable-tx ----
-- 030: the approval expirer reads pending approvals only.
--
-- Why: every scheduler tick (BUZZ_WORKFLOW_POLL, 1 s, on every relay
-- process) runs WorkflowApprovalsExpire: pending approvals of every
-- community whose expires_at has passed. No index led by status or
-- expires_at served it, so each tick walked workflow_approvals_by_status
-- (community_id, status) whole, and decided approvals are kept for good:
-- the tick's cost grew with every approval ever made (63 buffers at 50,000
-- approvals, 143 at 150,000, per tick and process; 22 with this index). This partial
-- index holds only pending approvals, in expiry order, so a tick reads the
-- approvals it expires.
-- Lock impact: CREATE INDEX CONCURRENTLY takes SHARE UPDATE EXCLUSIVE on
-- workflow_approvals: reads and writes go on; it waits for transactions
-- already running to finish. An interrupted build leaves an INVALID index,
-- which `buzz-relay migrate` names (with the DROP to run) before it
-- migrates again.
-- Roll back: the down part drops the index; the expirer works as before,
-- slower.

CREATE INDEX CONCURRENTLY IF NOT EXISTS workflow_approvals_pending_expiry
    ON workflow_approvals (expires_at) WHERE status = 'pending';

---- create above / drop below ----
---- tern: disable-tx ----

DROP INDEX CONCURRENTLY IF EXISTS workflow_approvals_pending_expiry;
