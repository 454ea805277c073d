---- tern: disable-tx ----
-- 034: an index for deleting workflow runs that ended long ago.
--
-- Why: workflow_runs, their approvals and scheduled_workflow_fires only
-- ever grew: a schedule firing every second adds 86,400 runs and 86,400
-- slot rows a day, each run carrying its trace. The relay now deletes runs
-- that ended more than BUZZ_WORKFLOW_RUN_RETENTION ago (approvals go with
-- them by their ON DELETE CASCADE) and slot claims as old, a batch per
-- scheduler tick (queries/workflow_runs.sql WorkflowRunsDeleteEnded). This
-- partial index holds only ended runs, oldest end first, so a sweep reads
-- the runs it deletes and a sweep with nothing to do reads one entry. The
-- slot claims are found by scheduled_workflow_fires_claimed (claimed_at),
-- which exists.
-- Lock impact: CREATE INDEX CONCURRENTLY takes SHARE UPDATE EXCLUSIVE on
-- workflow_runs: reads and writes go on; it waits for transactions already
-- running to finish. An interrupted build leaves an INVALID index, which
-- `buzz-relay migrate` names (with the DROP to run) before it migrates
-- again.
-- Roll back: the down part drops the index; the sweep then scans runs by
-- status, slower.

CREATE INDEX CONCURRENTLY IF NOT EXISTS workflow_runs_ended
    ON workflow_runs (completed_at) WHERE status IN ('completed', 'failed', 'cancelled');

---- create above / drop below ----
---- tern: disable-tx ----

DROP INDEX CONCURRENTLY IF EXISTS workflow_runs_ended;
