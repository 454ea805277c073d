-- 064: a channel moderation event whose id its author deleted first is
-- stored, visible, when it arrives.
--
-- Why: 061 refuses an event whose author's kind 5 named its id before it
-- arrived, and answers it as superseded (OK true). A channel's moderation
-- events (9000-9002, 9005, 9007, 9008 and the 39000-39002 lists, in a
-- channel) are its account of who did what, which their author's kind 5
-- never hides once they are stored (EventsDeleteByIDs leaves them out, and
-- a deletion naming one is refused whole). Refused on arrival, the same
-- deletion did what it cannot do to a stored one, and a moderator's
-- removal or grant told "OK" had no effect at all. They skip the refusal
-- now, as they skip the hiding: stored and applied like any other. Every
-- other kind is refused as before.
-- Lock impact: CREATE OR REPLACE FUNCTION takes no lock on events; each
-- insert runs the new body from its next statement. Nothing is scanned.
-- Deploy: safe while relays of either version run: the rule is in the
-- database, and both answer a stored moderation event alike.
-- Roll back: the down part restores 061's body; moderation events stored
-- meanwhile stay stored and visible.

SET LOCAL lock_timeout = '5s';

CREATE OR REPLACE FUNCTION events_refuse_deleted_id() RETURNS trigger
    LANGUAGE plpgsql
AS $$
BEGIN
    -- The kinds EventsDeleteByIDs never hides in a channel: no deletion
    -- refuses them either, so they need not wait for one.
    IF NEW.channel_id IS NOT NULL AND NEW.kind IN (9000, 9001, 9002, 9005, 9007, 9008, 39000, 39001, 39002) THEN
        RETURN NEW;
    END IF;
    PERFORM pg_advisory_xact_lock_shared(hashtextextended(
        'events-deletions:' || NEW.community_id::text || ':' || encode(NEW.pubkey, 'hex'), 0));
    IF EXISTS (
        SELECT FROM event_deletion_targets
        WHERE community_id = NEW.community_id AND target_id = NEW.id AND author = NEW.pubkey
    ) THEN
        RETURN NULL;
    END IF;
    RETURN NEW;
END
$$;

-- CREATE OR REPLACE resets the function's settings: its search_path again.
DO $$
BEGIN
    EXECUTE format('ALTER FUNCTION events_refuse_deleted_id() SET search_path = %I, pg_temp', current_schema());
END
$$;

---- create above / drop below ----

SET LOCAL lock_timeout = '5s';

CREATE OR REPLACE FUNCTION events_refuse_deleted_id() RETURNS trigger
    LANGUAGE plpgsql
AS $$
BEGIN
    PERFORM pg_advisory_xact_lock_shared(hashtextextended(
        'events-deletions:' || NEW.community_id::text || ':' || encode(NEW.pubkey, 'hex'), 0));
    IF EXISTS (
        SELECT FROM event_deletion_targets
        WHERE community_id = NEW.community_id AND target_id = NEW.id AND author = NEW.pubkey
    ) THEN
        RETURN NULL;
    END IF;
    RETURN NEW;
END
$$;

-- CREATE OR REPLACE resets the function's settings: its search_path again.
DO $$
BEGIN
    EXECUTE format('ALTER FUNCTION events_refuse_deleted_id() SET search_path = %I, pg_temp', current_schema());
END
$$;
