-- 013: webhook-triggered runs are idempotent on the caller's key.
--
-- Why: a webhook caller that retries after a timeout must not start the
-- workflow twice. POST /hooks/{id} with an Idempotency-Key header stores
-- the key on the run it creates; the same key for the same workflow returns
-- that run instead of creating another. Runs from other triggers keep NULL.
-- Lock impact: ADD COLUMN without a default is a catalog-only change (brief
-- ACCESS EXCLUSIVE lock, no rewrite). The unique index is built without
-- CONCURRENTLY: workflow_runs is new in 012, so it is small wherever 013
-- runs right after it; on a large table, build it CONCURRENTLY first by hand.
-- Roll back: the down part drops the index and the column (keys are lost;
-- retried webhook calls then create new runs).

ALTER TABLE workflow_runs ADD COLUMN idempotency_key text NULL
    CONSTRAINT workflow_runs_idempotency_key_len CHECK (length(idempotency_key) BETWEEN 1 AND 255);

CREATE UNIQUE INDEX workflow_runs_idempotency ON workflow_runs (community_id, workflow_id, idempotency_key)
    WHERE idempotency_key IS NOT NULL;

---- create above / drop below ----

DROP INDEX workflow_runs_idempotency;
ALTER TABLE workflow_runs DROP COLUMN idempotency_key;
