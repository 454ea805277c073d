---- tern: disable-tx ----
-- 062: the ids named by the deletions stored before 061.
--
-- Why: 061 records the e tag targets of each kind 5 inserted from then on;
-- the deletions already stored name ids too, and an event of their author
-- with such an id, arriving later, must be refused like the others. A
-- deletion inserted while this runs is recorded by 061's trigger (the
-- conflict is skipped), so none is missed. The events that already came
-- back (stored after their author's deletion named them) are hidden, by
-- the rule a deletion hides by id with (EventsDeleteByIDs: not a kind 5,
-- not a channel's moderation event).
-- One transaction per (community, author) of stored deletions, which takes
-- the community's write fence shared and the author's deletion lock
-- exclusive (as a deletion's insert does) before it records the author's
-- targets and hides what came back: an event of the author with such an
-- id, inserted meanwhile, either committed first (the hide, a later
-- statement, sees it) or probes after this commit and is refused. Run in
-- one transaction, the fence's shared lock per community filled the
-- shared lock table on a database of some ten thousand communities ("out
-- of shared memory"), a deletion of any community waited for the whole
-- backfill, and such an event inserted while it ran was stored and served.
-- Lock impact: ROW EXCLUSIVE on events and event_deletion_targets (no
-- writer waits for the tables). The author's inserts into the community
-- wait for that author's transaction only: it reads their deletions
-- through events_by_author_time and the ids they name by id (never the
-- community's other authors' targets). Time grows with the number of
-- deletions and their e tags, not with the events table; the loop's first
-- read goes through the communities, one index probe of
-- events_by_kind_time each. Measured (2 shared cores): on 2 million events
-- in 10,000 communities under write traffic, 36 s for 55,000 targets of
-- some 1,500 (community, author) pairs, writers' worst latency 0.25 s; one
-- community of 8,000 deleting authors naming 80,000 ids, 10 s (59 s when
-- each author's hide read the community's whole target list). Rows of a community being deleted
-- are left to its deletion (community_write_allowed). A failure part way
-- leaves the authors done so far done; the migration runs again from the
-- start and skips what it recorded.
-- Deploy: safe while relays run, with either version.
-- Roll back: nothing to undo here (the events hidden stay hidden, as their
-- author asked); 061's down part drops the table.

SET lock_timeout = '5s';

DO $$
DECLARE
    community uuid;
    deleter bytea;
    targets bytea[];
BEGIN
    FOR community IN SELECT c.id FROM communities c ORDER BY c.id LOOP
        FOR deleter IN
            SELECT DISTINCT e.pubkey FROM events e WHERE e.community_id = community AND e.kind = 5
        LOOP
            IF community_write_allowed(community) THEN
                PERFORM pg_advisory_xact_lock(hashtextextended(
                    'events-deletions:' || community::text || ':' || encode(deleter, 'hex'), 0));
                -- The ids this author's deletions name, read from them
                -- (events_by_author_time), not from the community's
                -- targets, which hold every author's.
                targets := ARRAY(
                    SELECT DISTINCT decode(tag->>1, 'hex')
                    FROM events AS deletion
                    CROSS JOIN LATERAL jsonb_array_elements(deletion.tags) AS tag
                    WHERE deletion.community_id = community AND deletion.pubkey = deleter AND deletion.kind = 5
                      AND jsonb_typeof(tag) = 'array' AND tag->>0 = 'e'
                      AND jsonb_typeof(tag->1) = 'string' AND tag->>1 ~ '^[0-9a-f]{64}$');
                INSERT INTO event_deletion_targets (community_id, target_id, author)
                SELECT community, target, deleter FROM unnest(targets) AS target
                ON CONFLICT DO NOTHING;
                -- Joined, not = ANY (targets): a generic plan rechecks a
                -- hash index's rows against the whole array, quadratic in
                -- an author's ids.
                UPDATE events AS e
                SET deleted_at = now()
                FROM unnest(targets) AS target(id)
                WHERE e.id = target.id AND e.community_id = community AND e.pubkey = deleter
                  AND e.kind <> 5
                  AND (e.channel_id IS NULL OR e.kind NOT IN (9000, 9001, 9002, 9005, 9007, 9008, 39000, 39001, 39002))
                  AND e.deleted_at IS NULL;
            END IF;
            -- Ends the community's fence lock, the author's lock and the
            -- row locks before the next author.
            COMMIT;
        END LOOP;
    END LOOP;
END
$$;

---- create above / drop below ----

-- Nothing to undo (see Roll back above); tern needs a statement.
SELECT 1;
