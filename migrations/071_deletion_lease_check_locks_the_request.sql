-- 071: the deletion lease check holds the request row for the rest of the
-- executor's transaction.
--
-- Why: community_deletion_requests_verify_lease read the request with a
-- plain SELECT, so the lease it verified could change hands before the
-- transaction that checked it wrote anything. An executor paused between
-- its check and its write (a suspended VM, a long GC pause, a stalled
-- network) past its lease let an heir claim the request, clear the
-- manifest chunks and start its own; the paused executor then woke and
-- inserted one chunk of its own listing among the heir's (the chunk guard
-- checks only the stage): a chunk number the heir had not reached yet
-- made the heir's insert of it fail, one it never reaches stayed in the
-- manifest unchecked. The check now takes FOR SHARE on the request row,
-- kept to the transaction's end, so the lease cannot change hands while a
-- step that verified it is still writing: the heir's claim (FOR UPDATE
-- SKIP LOCKED) passes the row over until the step commits or rolls back,
-- and then finds the generation the step wrote under. FOR SHARE and not
-- stronger: foreign-key checks of the request's checkpoints and chunks
-- (FOR KEY SHARE) do not wait for it, and the executor's own later
-- FOR UPDATE of the row, as its only locker, does not wait either.
-- Cost: an executor frozen inside a transaction (not between two) now
-- keeps its heir out until its session ends (a killed process, TCP
-- keepalive, idle_in_transaction_session_timeout where set), where the
-- heir took over at the lease's end before; a step transaction is short
-- (one chunk, one batch), so a live executor holds the row for
-- milliseconds. Its heartbeat waits for its own step to commit, as the
-- operator's block/unblock do.
-- Lock impact: CREATE OR REPLACE FUNCTION locks only the function; no
-- table is locked, scanned or rewritten. An executor step running across
-- the migration uses the new body from its next call.
-- Deploy: safe while executors run, with either version.
-- Roll back: the down part restores 018's body exactly (no row lock).

SET LOCAL lock_timeout = '5s';

CREATE OR REPLACE FUNCTION community_deletion_requests_verify_lease(request uuid, owner text, generation bigint, expected_stage text)
    RETURNS community_deletion_requests
    LANGUAGE plpgsql
    AS $$
DECLARE
    r community_deletion_requests;
BEGIN
    SELECT q.* INTO r FROM community_deletion_requests q
    JOIN community_deletion_approvals a
      ON a.request_id = q.id AND a.community_id = q.community_id AND a.inventory_digest = q.inventory_digest
    WHERE q.id = request AND q.lease_owner = owner AND q.lease_generation = generation
      AND q.lease_until >= now() AND q.blocked_at IS NULL AND q.stage = expected_stage
    FOR SHARE OF q;
    IF NOT FOUND THEN
        PERFORM community_deletion_raise_stale(request, generation, expected_stage);
    END IF;
    RETURN r;
END
$$;

---- create above / drop below ----

SET LOCAL lock_timeout = '5s';

CREATE OR REPLACE FUNCTION community_deletion_requests_verify_lease(request uuid, owner text, generation bigint, expected_stage text)
    RETURNS community_deletion_requests
    LANGUAGE plpgsql
    AS $$
DECLARE
    r community_deletion_requests;
BEGIN
    SELECT q.* INTO r FROM community_deletion_requests q
    JOIN community_deletion_approvals a
      ON a.request_id = q.id AND a.community_id = q.community_id AND a.inventory_digest = q.inventory_digest
    WHERE q.id = request AND q.lease_owner = owner AND q.lease_generation = generation
      AND q.lease_until >= now() AND q.blocked_at IS NULL AND q.stage = expected_stage;
    IF NOT FOUND THEN
        PERFORM community_deletion_raise_stale(request, generation, expected_stage);
    END IF;
    RETURN r;
END
$$;
