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
-- Lock impact: CREATE TRIGGER takes SHARE ROW EXCLUSIVE on events until
-- the migration commits (nothing else follows it): it waits for
-- transactions writing events to finish, and writes wait for it; reads go
-- on. lock_timeout bounds the wait, so a long transaction fails the
-- migration instead of queueing every event write behind it. The rows of
-- reactions hidden before this migration are removed by 026, in its own
-- transaction, so that pass never holds this lock.
-- Roll back: the down part drops the trigger (ACCESS EXCLUSIVE on events
-- for that instant, reads too, under the same lock_timeout) and its
-- function.

SET LOCAL lock_timeout = '5s';

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

---- create above / drop below ----

SET LOCAL lock_timeout = '5s';

DROP TRIGGER reactions_remove_hidden ON events;
DROP FUNCTION reactions_remove_hidden();
