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
-- Lock impact: ROW EXCLUSIVE on events and a row lock on each row changed
-- or deleted, held until commit; reads and writes go on beside it, except
-- a write to one of those rows, which waits for the commit. No rewrite, no
-- index build. Each community is fenced once (community_write_allowed);
-- rows of a community being deleted are left to its deletion. Both
-- statements may read the whole events table, once each (no index leads
-- with kind), but change only the few rows they name, so they run
-- unbatched: the rows locked are what they change, not what they read.
-- Deploy: relays of the previous version still accept those kind 5s and
-- 39003s; migrate, roll out, then run both statements again by hand if one
-- was stored in between (they are idempotent).
-- Roll back: nothing is undone (the down part is empty): hiding the
-- moderation events again would restore the hole the refusal closed, and
-- the roles lists removed were never the relay's.

SET LOCAL lock_timeout = '5s';

WITH writable AS MATERIALIZED (
    SELECT id FROM communities WHERE community_write_allowed(id)
)
UPDATE events e SET deleted_at = NULL
FROM writable w
WHERE e.community_id = w.id
  AND e.kind IN (9000, 9001, 9002, 9005, 9007, 9008)
  AND e.channel_id IS NOT NULL
  AND e.deleted_at IS NOT NULL
  AND EXISTS (
      SELECT FROM events d
      WHERE d.community_id = e.community_id AND d.pubkey = e.pubkey AND d.kind = 5
        AND d.tag_index && ARRAY['e:' || encode(e.id, 'hex')]
  );

WITH writable AS MATERIALIZED (
    SELECT id FROM communities WHERE community_write_allowed(id)
)
DELETE FROM events e
USING writable w
WHERE e.community_id = w.id AND e.kind = 39003;

---- create above / drop below ----

-- Nothing to undo (see Roll back above); tern needs a statement.
SELECT 1;
