-- 011: the two rule triggers of 003 name the rule they enforce.
--
-- Why: the relay recognizes constraint violations by constraint name
-- (internal/dberr) and answers clients with a fixed text per rule, never the
-- server's message. A trigger that raises check_violation (23514) carries no
-- constraint name unless it sets one, so these two now report
-- channel_members_keep_an_owner and channels_community_id_immutable, the
-- names of their triggers. Behaviour is otherwise unchanged.
-- Lock impact: CREATE OR REPLACE FUNCTION takes no table lock; the triggers
-- keep pointing at the functions.
-- Roll back: the down part restores the bodies from 003 (violations then
-- carry no constraint name and clients get the generic text).

CREATE OR REPLACE FUNCTION channels_community_id_immutable() RETURNS trigger
    LANGUAGE plpgsql
AS $$
BEGIN
    IF NEW.community_id <> OLD.community_id THEN
        RAISE EXCEPTION 'channels.community_id is immutable'
            USING ERRCODE = '23514', CONSTRAINT = 'channels_community_id_immutable';
    END IF;
    RETURN NEW;
END
$$;

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

---- create above / drop below ----

CREATE OR REPLACE FUNCTION channels_community_id_immutable() RETURNS trigger
    LANGUAGE plpgsql
AS $$
BEGIN
    IF NEW.community_id <> OLD.community_id THEN
        RAISE EXCEPTION 'channels.community_id is immutable' USING ERRCODE = '23514';
    END IF;
    RETURN NEW;
END
$$;

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
        RAISE EXCEPTION 'channel % would have no owner', OLD.channel_id USING ERRCODE = '23514';
    END IF;
    RETURN NEW;
END
$$;
