-- 013: webhook-triggered runs are idempotent on the caller's key.
--
-- Why: a webhook caller that retries after a timeout must not start the
-- workflow twice. POST /hooks/{id} with an Idempotency-Key header stores
-- the key on the run it creates; the same key for the same workflow returns
-- that run instead of creating another. Runs from other triggers keep NULL.
-- Lock impact: ADD COLUMN without a default rewrites nothing, but its CHECK
-- takes ACCESS EXCLUSIVE on workflow_runs for one scan of the table (every
-- value is NULL, so nothing fails). The unique index is built without
-- CONCURRENTLY: workflow_runs is new in 012, so it is small wherever 013
-- runs right after it. On a large table, add the column with its CHECK
-- (exactly as below: IF NOT EXISTS skips the whole definition of a column
-- that exists) and build the index CONCURRENTLY by hand first; this
-- migration then keeps both.
-- Roll back: the down part drops the index and the column (keys are lost;
-- retried webhook calls then create new runs).

ALTER TABLE workflow_runs ADD COLUMN IF NOT EXISTS idempotency_key text NULL
    CONSTRAINT workflow_runs_idempotency_key_len CHECK (length(idempotency_key) BETWEEN 1 AND 255);

CREATE UNIQUE INDEX IF NOT EXISTS workflow_runs_idempotency ON workflow_runs (community_id, workflow_id, idempotency_key)
    WHERE idempotency_key IS NOT NULL;

---- create above / drop below ----

DROP INDEX workflow_runs_idempotency;
ALTER TABLE workflow_runs DROP COLUMN idempotency_key;
