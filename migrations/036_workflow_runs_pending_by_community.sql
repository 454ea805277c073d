---- tern: disable-tx ----
-- 036: the run claim finds pending workflow runs by community, not in one
-- run_at order across communities.
--
-- Why: the poll's claim (queries/templates/workflow_run_claim.sql.tmpl)
-- found pending runs in run_at order across every community
-- (workflow_runs_due). A community holding its share of a worker's slots
-- is skipped while others have runs due, so with 200,000 of its runs due
-- before another community's, every claim read all of them to reach the
-- other's (about 30 ms a claim, growing with the backlog). The claim now
-- walks workflow_runs_pending_by_community instead: one descent per
-- community with pending runs finds its oldest run, and the runs it takes
-- are read from the front of their community's range. workflow_runs_due
-- (run_at order across communities) is read by nothing else, and left in
-- place the planner took it for one community's runs too (a walk past every
-- other community's), so it is dropped: one index fewer to write per run.
-- Lock impact: CREATE INDEX CONCURRENTLY and DROP INDEX CONCURRENTLY take
-- SHARE UPDATE EXCLUSIVE on workflow_runs: reads and writes go on; each
-- waits for transactions already running to finish. An interrupted build
-- leaves an INVALID index, which `buzz-relay migrate` names (with the DROP
-- to run) before it migrates again.
-- Deploy: relay processes of the previous version still running after this
-- migration have no workflow_runs_due and sort every due run on each poll;
-- run it once they are gone, or expect slower polls while they drain.
-- Roll back: the down part builds workflow_runs_due again and drops the new
-- index (CONCURRENTLY, the same locks). Migrate down before starting the
-- previous relay version: its claim reads every pending run without
-- workflow_runs_due, and this version's without the new index.

CREATE INDEX CONCURRENTLY IF NOT EXISTS workflow_runs_pending_by_community
    ON workflow_runs (community_id, run_at, created_at, id) WHERE status = 'pending';
DROP INDEX CONCURRENTLY IF EXISTS workflow_runs_due;

---- create above / drop below ----
---- tern: disable-tx ----

CREATE INDEX CONCURRENTLY IF NOT EXISTS workflow_runs_due
    ON workflow_runs (run_at, created_at, id) WHERE status = 'pending';
DROP INDEX CONCURRENTLY IF EXISTS workflow_runs_pending_by_community;
