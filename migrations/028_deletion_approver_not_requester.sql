-- 028: the person who requested a community deletion cannot approve it.
--
-- Why: deleting a community cannot be undone, and the runbook's safeguard
-- is a second person reading the inventory before approving it. Nothing
-- enforced that: the requester could approve their own request. The names
-- are what the operators type (--requested-by, --approved-by), so this
-- catches a slip or a shortcut, not an impostor; it compares them
-- trimmed and case-blind. Approvals only ever go through this function
-- (the stage guard refuses any other way to 'approved').
-- Lock impact: none on any table (CREATE OR REPLACE FUNCTION only).
-- Roll back: the down part restores the function without the check.

CREATE OR REPLACE FUNCTION community_deletion_requests_approve(request uuid, approver text, approval_note text, recomputed_digest bytea) RETURNS community_deletion_requests
    LANGUAGE plpgsql
AS $$
DECLARE
    r community_deletion_requests;
BEGIN
    SELECT * INTO r FROM community_deletion_requests WHERE id = request FOR UPDATE;
    IF NOT FOUND OR r.stage <> 'inventoried' OR r.blocked_at IS NOT NULL THEN
        RAISE EXCEPTION 'deletion request % is not waiting for approval', request USING ERRCODE = 'BZ002';
    END IF;
    IF lower(btrim(approver)) = lower(btrim(r.requested_by)) THEN
        RAISE EXCEPTION 'deletion request %: approved by % who requested it; a second person approves', request, approver USING ERRCODE = 'BZ002';
    END IF;
    IF r.inventory_digest <> recomputed_digest THEN
        RAISE EXCEPTION 'deletion request %: the inventory does not hash to its stored digest', request USING ERRCODE = 'BZ002';
    END IF;
    INSERT INTO community_deletion_approvals (request_id, community_id, inventory_digest, approved_by, note)
    VALUES (r.id, r.community_id, r.inventory_digest, approver, approval_note);
    UPDATE community_deletion_requests SET stage = 'approved', next_attempt_at = now()
    WHERE id = request
    RETURNING * INTO r;
    RETURN r;
END
$$;

---- create above / drop below ----

CREATE OR REPLACE FUNCTION community_deletion_requests_approve(request uuid, approver text, approval_note text, recomputed_digest bytea) RETURNS community_deletion_requests
    LANGUAGE plpgsql
AS $$
DECLARE
    r community_deletion_requests;
BEGIN
    SELECT * INTO r FROM community_deletion_requests WHERE id = request FOR UPDATE;
    IF NOT FOUND OR r.stage <> 'inventoried' OR r.blocked_at IS NOT NULL THEN
        RAISE EXCEPTION 'deletion request % is not waiting for approval', request USING ERRCODE = 'BZ002';
    END IF;
    IF r.inventory_digest <> recomputed_digest THEN
        RAISE EXCEPTION 'deletion request %: the inventory does not hash to its stored digest', request USING ERRCODE = 'BZ002';
    END IF;
    INSERT INTO community_deletion_approvals (request_id, community_id, inventory_digest, approved_by, note)
    VALUES (r.id, r.community_id, r.inventory_digest, approver, approval_note);
    UPDATE community_deletion_requests SET stage = 'approved', next_attempt_at = now()
    WHERE id = request
    RETURNING * INTO r;
    RETURN r;
END
$$;
