-- 031: the keep-an-owner check holds against a concurrent owner change.
--
-- Why: channel_members_keep_an_owner refuses the change that would leave a
-- live channel without an active owner by looking for another owner. Under
-- READ COMMITTED two transactions that each remove or demote one of the
-- last two owners both see the other owner (not yet changed, or changed
-- but not committed), both pass, and the channel ends with none. The relay
-- takes the channel's row lock before every membership change
-- (ChannelLockForUpdate), so it never raced; any other writer (a psql
-- session, a repair script) could. The check now takes that same row lock
-- (FOR NO KEY UPDATE: the relay's FOR UPDATE already covers it, and
-- foreign-key checks of new members are not blocked) before it looks, and
-- only when an active owner is losing the role: the second transaction
-- waits for the first, then sees its commit and is refused.
-- Lock impact: CREATE OR REPLACE FUNCTION takes no table lock; the
-- trigger keeps pointing at the function. At run time a change that
-- removes or demotes an owner locks its channel row until commit.
-- Roll back: the down part restores 011's body (the check without the
-- lock).

CREATE OR REPLACE FUNCTION channel_members_keep_an_owner() RETURNS trigger
    LANGUAGE plpgsql
AS $$
BEGIN
    IF OLD.role = 'owner' AND OLD.removed_at IS NULL
       AND (NEW.role <> 'owner' OR NEW.removed_at IS NOT NULL) THEN
        -- Serializes owner changes of one channel; each statement below
        -- reads what the transactions before this one committed.
        PERFORM FROM channels
        WHERE community_id = OLD.community_id AND id = OLD.channel_id
        FOR NO KEY UPDATE;
        IF NOT EXISTS (
               SELECT FROM channel_members
               WHERE community_id = OLD.community_id AND channel_id = OLD.channel_id
                 AND pubkey <> OLD.pubkey AND role = 'owner' AND removed_at IS NULL)
           AND EXISTS (
               SELECT FROM channels
               WHERE community_id = OLD.community_id AND id = OLD.channel_id AND deleted_at IS NULL)
        THEN
            RAISE EXCEPTION 'channel % would have no owner', OLD.channel_id
                USING ERRCODE = '23514', CONSTRAINT = 'channel_members_keep_an_owner';
        END IF;
    END IF;
    RETURN NEW;
END
$$;

---- create above / drop below ----

CREATE OR REPLACE FUNCTION channel_members_keep_an_owner() RETURNS trigger
    LANGUAGE plpgsql
AS $$
BEGIN
    IF OLD.role = 'owner' AND OLD.removed_at IS NULL
       AND (NEW.role <> 'owner' OR NEW.removed_at IS NOT NULL)
       AND NOT EXISTS (
           SELECT FROM channel_members
           WHERE community_id = OLD.community_id AND channel_id = OLD.channel_id
             AND pubkey <> OLD.pubkey AND role = 'owner' AND removed_at IS NULL)
       AND EXISTS (
           SELECT FROM channels
           WHERE community_id = OLD.community_id AND id = OLD.channel_id AND deleted_at IS NULL)
    THEN
        RAISE EXCEPTION 'channel % would have no owner', OLD.channel_id
            USING ERRCODE = '23514', CONSTRAINT = 'channel_members_keep_an_owner';
    END IF;
    RETURN NEW;
END
$$;
