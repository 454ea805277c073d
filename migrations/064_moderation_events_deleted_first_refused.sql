-- 064: a channel moderation event whose id its author deleted before it
-- arrived is refused with an error the moderator's client can read, not
-- answered as a success.
--
-- Why: 061 skips an event whose author's kind 5 named its id before it
-- arrived, and the relay answers it as superseded (OK true "duplicate:
-- ..."). For a channel's moderation events (9000-9002, 9005, 9007, 9008 and
-- the 39000-39002 lists, in a channel) that told a moderator's client the
-- removal, grant or channel deletion it sent had succeeded while it did
-- nothing. Storing and applying it instead would override the author's
-- retraction: a moderator who signed a removal and deleted it before it
-- reached this relay would have it applied whenever anyone replayed it,
-- while the kind 5 stayed served naming it. So it is refused as before,
-- but with an exception naming the rule
-- events_moderation_deleted_before_arrival (SQLSTATE 23514), which the
-- relay answers OK false "blocked: ...". The statement fails, so nothing of
-- the event is stored or applied; under the group writer only that event's
-- savepoint rolls back. Every other kind is still skipped (answered as
-- superseded, unchanged). The kinds are ingest.KindsKeptFromModeration
-- (TestDeletedIDRefusalNamesTheKindsKeptFromModeration holds the two
-- lists equal).
-- Lock impact: CREATE OR REPLACE FUNCTION takes no lock on events; each
-- insert runs the new body from its next statement. Nothing is scanned.
-- Deploy: a relay of the previous version answers the refusal as an
-- unnamed rule, "invalid: the database refused the write (rule
-- events_moderation_deleted_before_arrival)": still OK false, still not
-- applied.
-- Roll back: the down part restores 061's body exactly: such a moderation
-- event is skipped again and answered as superseded. Nothing is stored by
-- this migration, so nothing is left behind.

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
        -- A moderation event skipped silently would be answered as a
        -- success its client relies on; it gets an error it can show.
        IF NEW.channel_id IS NOT NULL AND NEW.kind IN (9000, 9001, 9002, 9005, 9007, 9008, 39000, 39001, 39002) THEN
            RAISE EXCEPTION 'its author deleted event % before it arrived', encode(NEW.id, 'hex')
                USING ERRCODE = '23514', CONSTRAINT = 'events_moderation_deleted_before_arrival';
        END IF;
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
