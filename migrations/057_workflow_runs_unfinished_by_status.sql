---- tern: disable-tx ----
-- 057: a workflow's unfinished runs indexed by status and due time.
--
-- Why: a webhook call refused at capacity answers Retry-After with the
-- soonest moment one of the workflow's unfinished runs could end
-- (queries/workflow_runs.sql WorkflowRunSoonestEnd). Through
-- workflow_runs_unfinished (community, workflow) that took a min() over
-- every unfinished run, up to the bound (1,000 by default), heap rows
-- included, on every refused call. With status and run_at in the key it is
-- two index probes: any run that may end at any moment (running or
-- awaiting an approval), else the soonest pending one
-- (TestCapacityAnswerReadsAFewRuns). The count that admits a run reads the
-- new index by its (community, workflow) prefix as it read the old one,
-- which therefore goes.
-- Lock impact: CREATE and DROP INDEX CONCURRENTLY take SHARE UPDATE
-- EXCLUSIVE on workflow_runs: reads and writes go on; each waits for the
-- transactions already running to finish. An interrupted build leaves an
-- INVALID index, which `buzz-relay migrate` names (with the DROP to run)
-- before it migrates again. Both statements are idempotent.
-- Roll back: the down part builds the old index again, then drops this
-- one.
-- Deploy note: relays of the previous version read the new index as well
-- (same predicate, same leading columns); no order is needed.

CREATE INDEX CONCURRENTLY IF NOT EXISTS workflow_runs_unfinished_by_status
    ON workflow_runs (community_id, workflow_id, status, run_at)
    WHERE status IN ('pending', 'running', 'waiting_approval');

DROP INDEX CONCURRENTLY IF EXISTS workflow_runs_unfinished;

---- create above / drop below ----
---- tern: disable-tx ----

CREATE INDEX CONCURRENTLY IF NOT EXISTS workflow_runs_unfinished ON workflow_runs (community_id, workflow_id)
    WHERE status IN ('pending', 'running', 'waiting_approval');

DROP INDEX CONCURRENTLY IF EXISTS workflow_runs_unfinished_by_status;
