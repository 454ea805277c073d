-- 026: the reactions hidden before 025 leave their rows too.
--
-- Why: 025's trigger removes a reaction's row when its kind 7 is hidden
-- from then on; a reaction a moderator hid before it still counts and
-- still refuses its author's next identical reaction. This pass removes
-- those rows, dated with the hiding. It runs in its own transaction, after
-- 025's trigger committed, so it never holds 025's lock on events, and a
-- reaction hidden meanwhile is the trigger's.
-- Communities being deleted are left alone (their write fence would refuse
-- the update; their rows go with them).
-- Lock impact: ROW EXCLUSIVE on reactions and a lock on each row it
-- changes, until it commits; events is only read. Event writes go on; a
-- reaction write to a row being changed waits for the commit. One pass
-- over the active reactions, an id lookup into events for each.
-- Roll back: nothing to undo (the down part is empty): the rows removed
-- counted hidden events, which is what the trigger removes them for.

UPDATE reactions r
SET removed_at = e.deleted_at
FROM events e
WHERE r.removed_at IS NULL AND r.reaction_event_id IS NOT NULL
  AND e.community_id = r.community_id AND e.id = r.reaction_event_id
  AND e.pubkey = r.pubkey AND e.kind = 7 AND e.deleted_at IS NOT NULL
  AND r.community_id IN (SELECT id FROM communities WHERE deletion_state = 'active');

---- create above / drop below ----

-- Nothing to undo; tern needs a statement to call the migration reversible.
SELECT 1;
