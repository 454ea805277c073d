-- 025: a hidden reaction event takes its reaction with it.
--
-- Why: reactions holds one active row per (target, reactor, emoji), and a
-- reaction event refused as a duplicate of an active row is not stored. A
-- reactor's own NIP-09 deletion removed the row (Go, next to the statement
-- that hid the event), but a moderator's 9005 hid the kind 7 and left its
-- row active: the hidden reaction still counted, and its author's next
-- identical reaction was refused as "duplicate: reaction already exists"
-- (not stored, no reaction_added workflow). Whichever statement hides a
-- kind 7, the row it made is now removed in the same statement, at the
-- hiding time, so no path can forget it. Only a row still naming that
-- event is touched: a row revived by a newer reaction event names the new
-- one.
-- Lock impact: CREATE TRIGGER takes SHARE ROW EXCLUSIVE on events: it waits
-- for transactions writing events to finish and holds new writes for that
-- instant (the migration's own lock_timeout bounds the wait). The UPDATE
-- below then removes the rows of reactions hidden before this migration:
-- one pass over the active reactions (an index probe into events each),
-- locking only the rows it changes. Communities being deleted are left
-- alone (their write fence would refuse it; their rows go with them).
-- Roll back: the down part drops the trigger and its function; the rows
-- removed stay removed (they count hidden events, which is what they were).

CREATE FUNCTION reactions_remove_hidden() RETURNS trigger
    LANGUAGE plpgsql
AS $$
BEGIN
    UPDATE reactions
    SET removed_at = NEW.deleted_at
    WHERE community_id = NEW.community_id AND reaction_event_id = NEW.id
      AND pubkey = NEW.pubkey AND removed_at IS NULL;
    RETURN NULL;
END
$$;

COMMENT ON FUNCTION reactions_remove_hidden() IS
    'Removes the reactions row made by a kind 7 event once that event is hidden (deleted_at set), whoever hid it.';

CREATE TRIGGER reactions_remove_hidden
    AFTER UPDATE OF deleted_at ON events
    FOR EACH ROW
    WHEN (NEW.kind = 7 AND OLD.deleted_at IS NULL AND NEW.deleted_at IS NOT NULL)
    EXECUTE FUNCTION reactions_remove_hidden();

UPDATE reactions r
SET removed_at = e.deleted_at
FROM events e
WHERE r.removed_at IS NULL AND r.reaction_event_id IS NOT NULL
  AND e.community_id = r.community_id AND e.id = r.reaction_event_id
  AND e.pubkey = r.pubkey AND e.kind = 7 AND e.deleted_at IS NOT NULL
  AND r.community_id IN (SELECT id FROM communities WHERE deletion_state = 'active');

---- create above / drop below ----

DROP TRIGGER reactions_remove_hidden ON events;
DROP FUNCTION reactions_remove_hidden();
