---- tern: disable-tx ----
-- 045: a workflow run's lease renewal is a HOT update: no index entry, no
-- dead tuple on another page for vacuum to find.
--
-- Why: a step at work renews its run's lease every third of the lease
-- (WorkflowRunKeepLease, 10 s by default, for up to the step's 300 s
-- deadline), and the renewal sets lease_until, which workflow_runs_recovery
-- indexed (lease_until, created_at, id) WHERE status = 'running'. An update
-- of an indexed column is never HOT: every renewal wrote a new heap tuple
-- and an entry in each of the table's eight indexes, and left the old ones
-- for vacuum, on the table that also holds 30 days of run history.
-- Measured on a test cluster with nothing else running (100 runs claimed by
-- the real claim among 2,000, each renewed 10 times by the real statement,
-- one transaction per renewal, 1,000 new runs inserted between rounds;
-- pg_stat_user_tables after, n_tup_upd / n_tup_hot_upd): before, 1,100
-- updates (100 claims, 1,000 renewals), 0 HOT; after, 1,100 updates, 994
-- HOT (every renewal but 6). TestLeaseRenewalsAreHOTUpdates checks it.
-- The running runs are now indexed by (created_at, id), columns no update
-- changes. The expired-lease scan of the claim (WorkflowRunClaimDue) and the
-- runbook read every running run through it and sort those whose lease
-- expired by lease_until, where they read only the expired ones: running
-- runs are those the workers hold (at most BUZZ_WORKFLOW_MAX_RUNS per relay
-- process) plus the few whose worker stopped. With 100 running, 30 expired,
-- among 12,000 runs: the claim's scan read 126 buffers (80 before) and
-- sorts 30 rows in memory; the by-id claim reads its runs by primary key
-- and is unchanged.
-- fillfactor stays at 100: with 90 all 1,000 renewals were HOT, against
-- 994, and it would leave a tenth of every page of the run history empty.
-- Lock impact: CREATE and DROP INDEX CONCURRENTLY take SHARE UPDATE
-- EXCLUSIVE (reads and writes go on) and wait for older transactions. The
-- migration runs outside a transaction, one statement at a time; each is
-- idempotent: after an interruption run `buzz-relay migrate` again (an
-- INVALID index left by an interrupted build is named by migrate with the
-- DROP to run). Between the two statements both indexes exist; the claim
-- works with either.
-- Deploy: no code names either index; relays of the previous version run
-- unchanged on it.
-- Roll back: the down part rebuilds the old index concurrently and drops
-- the new one.

CREATE INDEX CONCURRENTLY IF NOT EXISTS workflow_runs_running
    ON workflow_runs (created_at, id) WHERE status = 'running';

DROP INDEX CONCURRENTLY IF EXISTS workflow_runs_recovery;

---- create above / drop below ----
---- tern: disable-tx ----

CREATE INDEX CONCURRENTLY IF NOT EXISTS workflow_runs_recovery
    ON workflow_runs (lease_until, created_at, id) WHERE status = 'running';

DROP INDEX CONCURRENTLY IF EXISTS workflow_runs_running;
