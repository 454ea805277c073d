-- 061: an event its author deleted by id before it arrived stays deleted.
--
-- Why: a kind 5 hides by id (e tag) only the events already stored. A
-- deletion naming an id not stored here was kept, but when the author's
-- event with that id arrived later (typically a client re-broadcasting an
-- old note from another relay after its author deleted it here) it was
-- stored and served. Deleted addresses already stay deleted
-- (events_keep_newest_version refuses every version at or before the
-- deletion); this does the same for ids.
--
-- event_deletion_targets holds, per community, each id a stored kind 5
-- names in an e tag, with the deletion's author. It is written by a trigger
-- when a kind 5 is inserted, and read by a BEFORE INSERT trigger on every
-- other event: a B-tree probe of the primary key on a table as small as
-- the e tags of the community's deletions. An event whose author deleted
-- its id is skipped (zero rows, as a superseded version is): it is never
-- stored, so nothing of it (mentions, reactions, outbox rows, fan-out)
-- happens. Another author naming the id changes nothing (the probe matches
-- the author). A deletion hidden by moderation still counts, as it does for
-- an address (migration 023); NIP-09 cannot hide a deletion.
--
-- Concurrency: a deletion and its target committing at the same moment on
-- two connections must not both miss the other (the insert finds no
-- target row yet, the deletion's hide finds no event yet). Both take one
-- advisory lock per (community, author): the insert shared, before its
-- probe; the deletion exclusive, in its insert when it names an id (before
-- recording them), before the statement that hides its targets. Whichever waits reads, in a later statement, what the
-- other committed. The key's text prefix is used by no other advisory key.
-- The trigger fires before events_keep_newest_version (triggers run in
-- name order), so a refused version of a replaceable slot deletes nothing.
--
-- Lock impact: CREATE TABLE (its foreign key takes SHARE ROW EXCLUSIVE on
-- communities for an instant) and two CREATE TRIGGER on events (SHARE ROW
-- EXCLUSIVE on events: writers wait for the migration's commit, which
-- scans nothing). The existing deletions' targets are filled in by 062,
-- which blocks no writer.
-- Deploy: safe while relays of the previous version run: the rule is in the
-- database, so their writes keep it too, and they answer a refused event as
-- superseded (zero rows), as they answer an older version of a slot.
-- Roll back: the down part drops the triggers, functions and table; events
-- are unchanged (deleted ids arriving afterwards are stored again). It
-- takes ACCESS EXCLUSIVE on events (DROP TRIGGER) and on communities
-- (dropping the foreign key drops its triggers there) until its commit:
-- every read and write of either waits for it, and for as long as it
-- queues behind a transaction holding one, at most lock_timeout (then it
-- fails; run it again). Run it when no long query reads events.

SET LOCAL lock_timeout = '5s';

CREATE TABLE event_deletion_targets (
    community_id uuid  NOT NULL REFERENCES communities (id),
    target_id    bytea NOT NULL CONSTRAINT event_deletion_targets_id_len CHECK (octet_length(target_id) = 32),
    author       bytea NOT NULL CONSTRAINT event_deletion_targets_author_len CHECK (octet_length(author) = 32),
    PRIMARY KEY (community_id, target_id, author)
);

COMMENT ON TABLE event_deletion_targets IS
    'Event ids a stored kind 5 names in an e tag, with its author: an event of that author with that id is never stored.';

SELECT attach_community_write_fence('event_deletion_targets');

CREATE FUNCTION events_refuse_deleted_id() RETURNS trigger
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

CREATE FUNCTION events_record_deletion_targets() RETURNS trigger
    LANGUAGE plpgsql
AS $$
DECLARE
    targets bytea[];
BEGIN
    SELECT array_agg(decode(tag->>1, 'hex')) INTO targets
    FROM jsonb_array_elements(NEW.tags) AS tag
    WHERE jsonb_typeof(tag) = 'array' AND tag->>0 = 'e'
      AND jsonb_typeof(tag->1) = 'string' AND tag->>1 ~ '^[0-9a-f]{64}$';
    -- Only a deletion naming an id waits for the author's inserts in
    -- flight (an a-only one has nothing to race). The lock comes before
    -- the rows: the author's deletions then record their targets one at a
    -- time. Recorded first, two deletions naming the same ids in another
    -- order, or a group holding the author's note and recording an id,
    -- deadlocked on each other's uncommitted rows.
    IF targets IS NULL THEN
        RETURN NULL;
    END IF;
    PERFORM pg_advisory_xact_lock(hashtextextended(
        'events-deletions:' || NEW.community_id::text || ':' || encode(NEW.pubkey, 'hex'), 0));
    INSERT INTO event_deletion_targets (community_id, target_id, author)
    SELECT NEW.community_id, target, NEW.pubkey FROM unnest(targets) AS target
    ON CONFLICT DO NOTHING;
    RETURN NULL;
END
$$;

DO $$
BEGIN
    EXECUTE format('ALTER FUNCTION events_refuse_deleted_id() SET search_path = %I, pg_temp', current_schema());
    EXECUTE format('ALTER FUNCTION events_record_deletion_targets() SET search_path = %I, pg_temp', current_schema());
END
$$;

-- A deletion is never itself deleted (NIP-09), so kind 5 skips the probe.
CREATE TRIGGER events_deleted_id_refused
    BEFORE INSERT ON events
    FOR EACH ROW
    WHEN (NEW.kind <> 5)
    EXECUTE FUNCTION events_refuse_deleted_id();

CREATE TRIGGER events_deletion_targets_recorded
    AFTER INSERT ON events
    FOR EACH ROW
    WHEN (NEW.kind = 5)
    EXECUTE FUNCTION events_record_deletion_targets();

---- create above / drop below ----

SET LOCAL lock_timeout = '5s';

DROP TRIGGER events_deletion_targets_recorded ON events;
DROP TRIGGER events_deleted_id_refused ON events;
DROP FUNCTION events_record_deletion_targets();
DROP FUNCTION events_refuse_deleted_id();
DROP TABLE event_deletion_targets;
