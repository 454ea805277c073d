-- 014: users.agent_owner_pubkey holds only owners proven by a signature.
--
-- Why: the column used to be copied from an "agent_owner" field of the
-- agent's own kind 0 profile, which anyone can write and any later profile
-- overwrote, yet it decides who may add an owner_only agent to channels.
-- From now on it is written only from an owner attestation (an "auth" tag
-- the owner signed for the agent key, on the agent's AUTH event or in the
-- x-auth-tag header of its HTTP requests), first wins, and is never
-- replaced by a different owner.
--
-- Existing values: every one of them is self-declared, so none is a verified
-- owner: they are cleared. Nothing needs them any more, so they are not kept
-- in a side column; the claim itself survives in the stored kind 0 event
-- content for anyone who wants to read it. Effect: an owner_only agent can
-- be added to channels by nobody until it authenticates once with its
-- owner's attestation.
--
-- What this adds:
--   users_agent_owner_fkey: the owner is a user of the same community.
--     ON DELETE SET NULL (agent_owner_pubkey) only: community_id is shared
--     with the primary key and must stay.
--   users_agent_owner_not_self: an agent cannot own itself.
--   users_agent_owner_first_wins (trigger): a recorded owner can be cleared
--     (by the FK, or by an operator) but never changed to a different owner
--     in one step. An operator correcting a wrong owner clears it first,
--     deliberately, then lets the agent authenticate again.
--   users_agent_owner: partial index for "which agents does this owner
--     have", NULLs (everyone who is not an agent) left out.
-- Lock impact: the UPDATE locks only rows that had a value. The ALTER TABLE
-- adds a CHECK, which takes ACCESS EXCLUSIVE on users (reads wait too) and
-- holds it, with the foreign key's scan and the index build, until the
-- migration commits; users has one row per person per community, and every
-- agent_owner_pubkey is NULL by then, so the scans are short. On a very
-- large users table, run this at a quiet time.
-- Roll back: the down part drops the index, trigger, function and
-- constraints. Cleared self-declared values do not come back.

UPDATE users SET agent_owner_pubkey = NULL WHERE agent_owner_pubkey IS NOT NULL;

ALTER TABLE users
    ADD CONSTRAINT users_agent_owner_not_self CHECK (agent_owner_pubkey <> pubkey),
    ADD CONSTRAINT users_agent_owner_fkey FOREIGN KEY (community_id, agent_owner_pubkey)
        REFERENCES users (community_id, pubkey) ON DELETE SET NULL (agent_owner_pubkey);

CREATE FUNCTION users_agent_owner_first_wins() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF OLD.agent_owner_pubkey IS NOT NULL AND NEW.agent_owner_pubkey IS NOT NULL
       AND NEW.agent_owner_pubkey <> OLD.agent_owner_pubkey THEN
        RAISE EXCEPTION 'agent % already has a recorded owner; it is never replaced', encode(OLD.pubkey, 'hex')
            USING ERRCODE = '23514', CONSTRAINT = 'users_agent_owner_first_wins';
    END IF;
    RETURN NEW;
END
$$;

CREATE TRIGGER users_agent_owner_first_wins
    BEFORE UPDATE OF agent_owner_pubkey ON users
    FOR EACH ROW EXECUTE FUNCTION users_agent_owner_first_wins();

CREATE INDEX users_agent_owner ON users (community_id, agent_owner_pubkey)
    WHERE agent_owner_pubkey IS NOT NULL;

---- create above / drop below ----

DROP INDEX users_agent_owner;
DROP TRIGGER users_agent_owner_first_wins ON users;
DROP FUNCTION users_agent_owner_first_wins();
ALTER TABLE users
    DROP CONSTRAINT users_agent_owner_fkey,
    DROP CONSTRAINT users_agent_owner_not_self;
