-- 038: every change of who may read a channel counts on the channel row
-- (channels.readers_version), in the transaction that makes it.
--
-- Why: a relay process caches who may read a channel (internal/access) and
-- drops the answer when it hears of a membership change. A change committed
-- by another process is heard through Redis, one round trip later, or
-- seconds later when Redis is slow to carry it; meanwhile a member removed
-- elsewhere went on receiving, live, the channel's events this process
-- committed after the removal. An event's write reads the channel's access
-- row (ChannelAccess) anyway; with the version in it, the fan-out knows the
-- reader set it holds is older than the state the event was written under,
-- and reads it again. The counting is done by triggers so that it holds
-- whichever code path, or psql session, changes a membership, a visibility
-- or a deletion.
-- Cost: one UPDATE of the channel row per membership insert or removal
-- (the membership paths already hold that row's lock), and nothing on
-- messages.
-- Lock impact: ADD COLUMN with a constant default changes only the catalog
-- (ACCESS EXCLUSIVE on channels for that instant, no rewrite); CREATE
-- TRIGGER takes SHARE ROW EXCLUSIVE on channels and channel_members, which
-- waits for writers of those tables and blocks theirs for that instant.
-- Deploy: relay processes of the previous version ignore the column; their
-- writes still count through the triggers.
-- Roll back: the down part drops the triggers, their functions and the
-- column.

SET LOCAL lock_timeout = '5s';

ALTER TABLE channels ADD COLUMN readers_version bigint NOT NULL DEFAULT 0;

COMMENT ON COLUMN channels.readers_version IS
    'Counts the changes of who may read the channel (memberships added or removed, visibility, deletion); read with ChannelAccess by every channel write, so the fan-out can tell a cached reader set older than the write.';

CREATE FUNCTION channel_members_count_readers_change() RETURNS trigger
    LANGUAGE plpgsql
AS $$
BEGIN
    IF TG_OP = 'UPDATE' AND OLD.removed_at IS NOT DISTINCT FROM NEW.removed_at THEN
        RETURN NULL;
    END IF;
    UPDATE channels SET readers_version = readers_version + 1
    WHERE community_id = NEW.community_id AND id = NEW.channel_id;
    RETURN NULL;
END
$$;

CREATE TRIGGER channel_members_count_readers_change
    AFTER INSERT OR UPDATE OF removed_at ON channel_members
    FOR EACH ROW
    EXECUTE FUNCTION channel_members_count_readers_change();

CREATE FUNCTION channels_count_readers_change() RETURNS trigger
    LANGUAGE plpgsql
AS $$
BEGIN
    IF OLD.visibility IS DISTINCT FROM NEW.visibility OR OLD.deleted_at IS DISTINCT FROM NEW.deleted_at THEN
        NEW.readers_version := OLD.readers_version + 1;
    END IF;
    RETURN NEW;
END
$$;

CREATE TRIGGER channels_count_readers_change
    BEFORE UPDATE OF visibility, deleted_at ON channels
    FOR EACH ROW
    EXECUTE FUNCTION channels_count_readers_change();

DO $$
BEGIN
    EXECUTE format('ALTER FUNCTION channel_members_count_readers_change() SET search_path = %I, pg_temp', current_schema());
    EXECUTE format('ALTER FUNCTION channels_count_readers_change() SET search_path = %I, pg_temp', current_schema());
END
$$;

---- create above / drop below ----

SET LOCAL lock_timeout = '5s';

DROP TRIGGER channels_count_readers_change ON channels;
DROP FUNCTION channels_count_readers_change();
DROP TRIGGER channel_members_count_readers_change ON channel_members;
DROP FUNCTION channel_members_count_readers_change();
ALTER TABLE channels DROP COLUMN readers_version;
