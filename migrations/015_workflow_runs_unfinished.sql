-- 015: count a workflow's unfinished runs cheaply.
--
-- Why: run creation is bounded per workflow (BUZZ_WORKFLOW_MAX_UNFINISHED_RUNS):
-- before a trigger queues a run, it counts the workflow's runs that have
-- not ended (pending, running or waiting for approval); at the bound the
-- run is recorded failed with capacity_exceeded instead. The history index
-- would make that count read every run the workflow ever had; this partial
-- index holds only unfinished runs, so the count reads at most the bound's
-- worth of index entries whatever the history.
-- Lock impact: CREATE INDEX (not CONCURRENTLY) takes a SHARE lock on
-- workflow_runs for the build, blocking run writes meanwhile. workflow_runs
-- is new in 012, so it is small wherever 014 runs soon after; on a large
-- table, build the same index CONCURRENTLY by hand first (this statement
-- then does nothing).
-- Roll back: the down part drops the index; the count still works, slower.

CREATE INDEX IF NOT EXISTS workflow_runs_unfinished ON workflow_runs (community_id, workflow_id)
    WHERE status IN ('pending', 'running', 'waiting_approval');

---- create above / drop below ----

DROP INDEX workflow_runs_unfinished;
