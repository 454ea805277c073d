-- 029: the requester's own approval is refused on the approvals table itself.
--
-- Why: 028 put the "a second person approves" check in
-- community_deletion_requests_approve only, and said approvals go through
-- nothing else. They can: the stage guard moves a request to 'approved'
-- whenever an approval row of its exact inventory exists, and nothing
-- checked who that row names. A psql session (the shortcut 028 is meant
-- to catch) could INSERT the requester's own approval and UPDATE the stage
-- to 'approved', and an executor then claimed and deleted the community.
-- The check now lives in a row trigger on community_deletion_approvals,
-- so it holds whichever statement writes the row; it compares the names
-- as 028 does (trimmed, case-blind). Rows already stored are not checked.
-- The function keeps its own check, which gives the same message first.
-- Lock impact: CREATE TRIGGER takes SHARE ROW EXCLUSIVE on
-- community_deletion_approvals (a few rows, written only by approvals) for
-- the instant of the DDL; no scan, no rewrite.
-- Roll back: the down part drops the trigger and its function.

SET LOCAL lock_timeout = '5s';

CREATE FUNCTION community_deletion_approvals_not_requester() RETURNS trigger
    LANGUAGE plpgsql
AS $$
BEGIN
    IF EXISTS (SELECT FROM community_deletion_requests r
               WHERE r.id = NEW.request_id
                 AND lower(btrim(r.requested_by)) = lower(btrim(NEW.approved_by))) THEN
        RAISE EXCEPTION 'deletion request %: approved by % who requested it; a second person approves', NEW.request_id, NEW.approved_by
            USING ERRCODE = 'BZ002';
    END IF;
    RETURN NEW;
END
$$;

CREATE TRIGGER community_deletion_approvals_not_requester BEFORE INSERT ON community_deletion_approvals
    FOR EACH ROW EXECUTE FUNCTION community_deletion_approvals_not_requester();

---- create above / drop below ----

SET LOCAL lock_timeout = '5s';

DROP TRIGGER community_deletion_approvals_not_requester ON community_deletion_approvals;
DROP FUNCTION community_deletion_approvals_not_requester();
