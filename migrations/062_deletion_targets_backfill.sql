-- 062: the ids named by the deletions stored before 061.
--
-- Why: 061 records the e tag targets of each kind 5 inserted from then on;
-- the deletions already stored name ids too, and an event of their author
-- with such an id, arriving later, must be refused like the others. A
-- deletion inserted while this runs is recorded by 061's trigger (the
-- conflict is skipped), so none is missed.
-- Lock impact: reads only kind 5 rows, one community at a time through
-- events_by_kind_time; ACCESS SHARE on events (no writer waits) and ROW
-- EXCLUSIVE on event_deletion_targets, whose rows are new. Its time grows
-- with the number of deletions' e tags, not with the events table. Rows of
-- a community being deleted are left to its deletion
-- (community_write_allowed).
-- Deploy: safe while relays run, with either version.
-- Roll back: nothing to undo here; 061's down part drops the table.

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

---- create above / drop below ----

-- Nothing to undo (see Roll back above); tern needs a statement.
SELECT 1;
