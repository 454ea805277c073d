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
-- Lock impact: reads only kind 5 rows, one community at a time through
-- events_by_kind_time, and the named events by id; ROW EXCLUSIVE on events
-- and event_deletion_targets (no writer waits for the tables). Its time
-- grows with the number of deletions' e tags, not with the events table
-- (1.8 s for 20,800 targets among a million events). Until it commits it
-- holds, per community, the community's write fence shared (as any write)
-- and a key-share lock on its row, so a community deletion starting to
-- fence meanwhile waits for it, and so does a kind 5 naming an id an old
-- deletion of its author named too: run it outside a community deletion.
-- Rows of a community being deleted are left to its deletion
-- (community_write_allowed).
-- Deploy: safe while relays run, with either version.
-- Roll back: nothing to undo here (the events hidden stay hidden, as their
-- author asked); 061's down part drops the table.

SET LOCAL lock_timeout = '5s';

INSERT INTO event_deletion_targets (community_id, target_id, author)
SELECT c.id, decode(tag->>1, 'hex'), deletion.pubkey
FROM communities AS c
CROSS JOIN LATERAL (
    SELECT pubkey, tags FROM events WHERE community_id = c.id AND kind = 5
) AS deletion
CROSS JOIN LATERAL jsonb_array_elements(deletion.tags) AS tag
WHERE community_write_allowed(c.id)
  AND jsonb_typeof(tag) = 'array' AND tag->>0 = 'e'
  AND jsonb_typeof(tag->1) = 'string' AND tag->>1 ~ '^[0-9a-f]{64}$'
ON CONFLICT DO NOTHING;

UPDATE events AS e
SET deleted_at = now()
FROM event_deletion_targets AS t
WHERE e.community_id = t.community_id AND e.id = t.target_id AND e.pubkey = t.author
  AND e.kind <> 5
  AND (e.channel_id IS NULL OR e.kind NOT IN (9000, 9001, 9002, 9005, 9007, 9008, 39000, 39001, 39002))
  AND e.deleted_at IS NULL
  AND community_write_allowed(e.community_id);

---- create above / drop below ----

-- Nothing to undo (see Roll back above); tern needs a statement.
SELECT 1;
