---- tern: disable-tx ----
-- 052: an index of the workflows the scheduler fires.
--
-- Why: every scheduler tick (each BUZZ_WORKFLOW_POLL, 1 s, on every relay
-- process) reads the scheduled workflows of every community
-- (queries/workflows.sql WorkflowsScheduled). No index held them, so the
-- statement scanned every active workflow, message-, reaction- and
-- webhook-triggered ones included, and detoasted each one's whole
-- definition (up to an event's size) to read the trigger inside it. Any
-- member may save 20 workflows in each channel and create channels, so a
-- member could make every tick of every process in the deployment read
-- as many definitions as they cared to save (20,001 rows read to return
-- one, TestScheduleTickReadsScheduledWorkflowsOnly). This partial index
-- holds only what the statement returns, in its order.
-- Lock impact: CREATE INDEX CONCURRENTLY takes SHARE UPDATE EXCLUSIVE on
-- workflows: reads and writes go on; it waits for transactions already
-- running to finish. An interrupted build leaves an INVALID index, which
-- `buzz-relay migrate` names (with the DROP to run) before it migrates
-- again.
-- Roll back: the down part drops the index; the tick scans the table
-- again.
-- Deploy note: the predicate must stay the statement's own (enabled,
-- status, definition_event_id and the trigger's "on"), or the planner
-- cannot use the index.

CREATE INDEX CONCURRENTLY IF NOT EXISTS workflows_scheduled
    ON workflows (community_id, id)
    WHERE enabled AND status = 'active' AND definition_event_id IS NOT NULL
      AND (definition -> 'trigger' ->> 'on') = 'schedule';

---- create above / drop below ----
---- tern: disable-tx ----

DROP INDEX CONCURRENTLY IF EXISTS workflows_scheduled;
