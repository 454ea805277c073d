-- 024: a deleted profile's fields leave users too.
--
-- Why: users mirrors each member's newest kind 0 profile (display name,
-- about, picture, NIP-05). A NIP-09 deletion hid the kind 0 event but left
-- the mirror as it was, so the deleted display name still answered agent
-- owner lookups and still woke its member by @name in workflow messages.
-- When the profile a users row mirrors is hidden, its profile fields are
-- cleared, whichever statement hid it. The row stays: channel_add_policy
-- (a member's own protection, changed only by a profile that names it) and
-- a proven agent owner are not profile text. metadata_event_id keeps
-- naming the hidden version, so an older version still cannot take its
-- place (the slot trigger refuses it anyway).
-- Lock impact: CREATE TRIGGER takes SHARE ROW EXCLUSIVE on events until
-- the migration commits (nothing else follows it): it waits for
-- transactions writing events to finish, and writes wait for it; reads go
-- on. lock_timeout bounds the wait, so a long transaction fails the
-- migration instead of queueing every event write behind it. Nothing is
-- scanned or rewritten; rows hidden before keep their mirror (clear them
-- with the UPDATE in the function below if that matters).
-- Roll back: the down part drops the trigger (ACCESS EXCLUSIVE on events
-- for that instant, reads too, under the same lock_timeout) and its
-- function.

SET LOCAL lock_timeout = '5s';

CREATE FUNCTION users_forget_hidden_profile() RETURNS trigger
    LANGUAGE plpgsql
AS $$
BEGIN
    UPDATE users
    SET display_name = NULL, about = NULL, avatar_url = NULL, nip05_handle = NULL, updated_at = now()
    WHERE community_id = NEW.community_id AND pubkey = NEW.pubkey AND metadata_event_id = NEW.id;
    RETURN NULL;
END
$$;

COMMENT ON FUNCTION users_forget_hidden_profile() IS
    'Clears the users profile fields mirrored from a kind 0 event once that event is hidden (deleted_at set).';

CREATE TRIGGER users_forget_hidden_profile
    AFTER UPDATE OF deleted_at ON events
    FOR EACH ROW
    WHEN (NEW.kind = 0 AND OLD.deleted_at IS NULL AND NEW.deleted_at IS NOT NULL)
    EXECUTE FUNCTION users_forget_hidden_profile();

---- create above / drop below ----

SET LOCAL lock_timeout = '5s';

DROP TRIGGER users_forget_hidden_profile ON events;
DROP FUNCTION users_forget_hidden_profile();
