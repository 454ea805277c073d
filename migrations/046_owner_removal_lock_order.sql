-- 046: an owner's removal locks their workflows in id order.
--
-- Why: a message in a channel locks the channel's workflows one by one in
-- id order (WorkflowLockForRuns) before creating runs. The trigger that
-- disables a removed member's workflows (workflows_disable_on_owner_removal)
-- locked them in the order its UPDATE met them, the table's physical order:
-- a removal holding the second workflow and waiting for the first, while a
-- message held the first and waited for the second, was a deadlock, and
-- PostgreSQL failed one of the two (the client told to send it again). The
-- trigger now takes the same locks in id order first
-- (TestOwnerRemovalLocksWorkflowsInIDOrder).
-- Lock impact: CREATE OR REPLACE FUNCTION and ALTER FUNCTION lock only the
-- function; no table is locked, scanned or rewritten.
-- Deploy: any order; relays name no part of it.
-- Roll back: the down part restores the previous body (search_path pinned
-- as migration 035 left it).

CREATE OR REPLACE FUNCTION workflows_disable_on_owner_removal() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
BEGIN
    -- Locked in id order first, as a message locks them: a removal and a
    -- message then queue one behind the other, and neither holds a
    -- workflow the other waits for.
    PERFORM 1 FROM workflows
    WHERE community_id = NEW.community_id AND channel_id = NEW.channel_id
      AND owner_pubkey = NEW.pubkey AND enabled
    ORDER BY id
    FOR NO KEY UPDATE;
    UPDATE workflows
    SET enabled = false, updated_at = now()
    WHERE community_id = NEW.community_id AND channel_id = NEW.channel_id
      AND owner_pubkey = NEW.pubkey AND enabled;
    RETURN NULL;
END
$$;

DO $$
BEGIN
    EXECUTE format('ALTER FUNCTION workflows_disable_on_owner_removal() SET search_path = %I, pg_temp', current_schema());
END
$$;

---- create above / drop below ----

CREATE OR REPLACE FUNCTION workflows_disable_on_owner_removal() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
BEGIN
    UPDATE workflows
    SET enabled = false, updated_at = now()
    WHERE community_id = NEW.community_id AND channel_id = NEW.channel_id
      AND owner_pubkey = NEW.pubkey AND enabled;
    RETURN NULL;
END
$$;

DO $$
BEGIN
    EXECUTE format('ALTER FUNCTION workflows_disable_on_owner_removal() SET search_path = %I, pg_temp', current_schema());
END
$$;
