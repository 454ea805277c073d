-- 056: the channel moderation events a kind 5 hid are shown again, and the
-- roles lists (39003) clients published are removed.
--
-- Why: a channel's moderation events (9000-9002, 9005, 9007, 9008) are its
-- account of who did what. Their author's kind 5 is now refused for them,
-- and EventsDeleteByIDs leaves them out, but one stored before that still
-- hides what it named: an admin who removed members and then deleted the
-- removal kept it hidden. The events a kind 5 of their author names are
-- shown again; the kind 5 itself stays (it may name other events, and
-- NIP-09 asks relays to keep deletion requests). Moderation events stored
-- without a channel are ordinary events there and stay as they are.
-- A 39003 is refused from clients now, since NIP-29 clients read it beside
-- the relay's lists by the channel's d tag, where a client's passes for
-- the relay's. The relay signs its lists with the community's key, but it
-- has never written a 39003, so every stored one is a client's and goes.
-- Rows it leaves (mentions, reactions naming it) match no event and no
-- read returns them, as after the expiration purge.
-- Lock impact: one transaction per community that holds such rows, each
-- with ROW EXCLUSIVE on events and a row lock on each row it changes or
-- deletes until its commit; reads and writes go on beside it, except a
-- write to one of those rows, which waits for the commit. No rewrite, no
-- index build. Each community is fenced in its own transaction
-- (community_write_allowed takes a lock per community until commit, so one
-- transaction over every community would fill the shared lock table on a
-- database of some ten thousand communities); rows of a community being
-- deleted are left to its deletion. The loop's first read scans the events
-- table once (no index leads with kind); each community's statements then
-- read through events_by_kind_time (community, kind). A failure part way
-- leaves the communities done so far done; the migration runs again from
-- the start and finds nothing left in them.
-- Deploy: relays of the previous version still accept those kind 5s and
-- 39003s; migrate, roll out, then run this file's DO block again by hand
-- (psql, outside a transaction) if one was stored in between: it is
-- idempotent.
-- Roll back: nothing is undone (the down part is empty): hiding the
-- moderation events again would restore the hole the refusal closed, and
-- the roles lists removed were never the relay's.

---- tern: disable-tx ----

SET lock_timeout = '5s';

DO $$
DECLARE
    community uuid;
BEGIN
    FOR community IN
        SELECT DISTINCT e.community_id FROM events e
        WHERE e.kind = 39003
           OR (e.kind IN (9000, 9001, 9002, 9005, 9007, 9008)
               AND e.channel_id IS NOT NULL AND e.deleted_at IS NOT NULL)
    LOOP
        IF community_write_allowed(community) THEN
            UPDATE events e SET deleted_at = NULL
            WHERE e.community_id = community
              AND e.kind IN (9000, 9001, 9002, 9005, 9007, 9008)
              AND e.channel_id IS NOT NULL
              AND e.deleted_at IS NOT NULL
              AND EXISTS (
                  SELECT FROM events d
                  WHERE d.community_id = e.community_id AND d.pubkey = e.pubkey AND d.kind = 5
                    AND d.tag_index && ARRAY['e:' || encode(e.id, 'hex')]
              );
            DELETE FROM events e WHERE e.community_id = community AND e.kind = 39003;
        END IF;
        -- Ends the community's fence lock and row locks before the next.
        COMMIT;
    END LOOP;
END
$$;

---- create above / drop below ----

-- Nothing to undo (see Roll back above); tern needs a statement.
SELECT 1;
