---- tern: disable-tx ----
-- 021: an index for each foreign key that had none.
--
-- Why: PostgreSQL checks a foreign key on every delete (or key update) of a
-- referenced row by looking up the referencing rows, once per row. Without
-- an index led by the referencing columns, each lookup scans the whole
-- referencing table, so deleting many referenced rows is quadratic.
--   scheduled_workflow_fires (community_id, workflow_run_id) -> workflow_runs:
--     deleting a workflow cascades to its runs, and each run deleted scanned
--     every schedule claim. Measured on the 2-core dev box, one workflow
--     with 10,000 runs beside another's 10,000: DELETE 7.1 s -> 0.36 s. A
--     community purge deletes runs in batches and paid the same per row.
--     Partial: a claim whose run was never created references nothing.
--   community_deletion_executor_heartbeats (request_id) -> requests:
--     requests are never deleted, so no check runs today; one row per
--     executor makes the index free, and the rule "every foreign key has an
--     index" stays without exceptions (internal/migrate checks it over the
--     live catalog).
--
-- Lock impact: CREATE INDEX CONCURRENTLY takes SHARE UPDATE EXCLUSIVE on
-- each table: reads and writes go on; it waits for transactions already
-- running to finish. Both tables are small next to events.
-- Roll back: the down part drops the indexes; nothing else changed.

CREATE INDEX CONCURRENTLY IF NOT EXISTS scheduled_workflow_fires_by_run
    ON scheduled_workflow_fires (community_id, workflow_run_id) WHERE workflow_run_id IS NOT NULL;

CREATE INDEX CONCURRENTLY IF NOT EXISTS community_deletion_executor_heartbeats_by_request
    ON community_deletion_executor_heartbeats (request_id) WHERE request_id IS NOT NULL;

---- create above / drop below ----
---- tern: disable-tx ----

DROP INDEX CONCURRENTLY IF EXISTS community_deletion_executor_heartbeats_by_request;

DROP INDEX CONCURRENTLY IF EXISTS scheduled_workflow_fires_by_run;
