-- 022: close a community's live connections when its deletion starts
-- quiescing, and when it is archived.
--
-- Why: a community stops resolving (HTTP 404 for new connections) once it is
-- archived or its deletion begins quiescing, but only the fence announced
-- the closing, so sockets opened before kept going: an archived community
-- went on storing and serving events on them for as long as they stayed
-- connected, and a quiescing one (which refuses their stored writes) still
-- relayed their ephemeral events, which never touch the database or its
-- fence. A deletion never returns to active, so its closing is announced
-- from quiescing on; an archive can be undone, so it is announced with the
-- payload 'archived:<id>', which relays close without refusing the
-- community's later connections (unarchived, its host resolves again).
-- Lock impact: CREATE (OR REPLACE) TRIGGER takes SHARE ROW EXCLUSIVE on
-- communities until the migration commits: reads (every host lookup) go
-- on, writes to communities wait; it is small and rarely written.
-- lock_timeout bounds the wait behind a long transaction, so a busy table
-- fails the migration instead of queueing the relay's writes behind it.
-- Roll back: the down part restores 016's trigger and drops the archive
-- one (DROP TRIGGER takes ACCESS EXCLUSIVE on communities, blocking host
-- lookups for that instant, under the same lock_timeout); relays then
-- close archived communities' connections on their periodic sweep only
-- (it asks for archived ones too), and quiescing ones' at the fence.

SET LOCAL lock_timeout = '5s';

CREATE OR REPLACE TRIGGER communities_announce_closed
    AFTER UPDATE OF deletion_state ON communities
    FOR EACH ROW
    WHEN (NEW.deletion_state IN ('quiescing', 'fenced', 'tombstone') AND OLD.deletion_state IS DISTINCT FROM NEW.deletion_state)
    EXECUTE FUNCTION communities_announce_closed();

CREATE FUNCTION communities_announce_archived() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('buzz_community_closed', 'archived:' || NEW.id::text);
    RETURN NULL;
END
$$;

COMMENT ON FUNCTION communities_announce_archived() IS
    'Tells every relay listening on buzz_community_closed to close an archived community''s live connections.';

CREATE TRIGGER communities_announce_archived
    AFTER UPDATE OF archived_at ON communities
    FOR EACH ROW
    WHEN (OLD.archived_at IS NULL AND NEW.archived_at IS NOT NULL)
    EXECUTE FUNCTION communities_announce_archived();

---- create above / drop below ----

SET LOCAL lock_timeout = '5s';

DROP TRIGGER communities_announce_archived ON communities;
DROP FUNCTION communities_announce_archived();

CREATE OR REPLACE TRIGGER communities_announce_closed
    AFTER UPDATE OF deletion_state ON communities
    FOR EACH ROW
    WHEN (NEW.deletion_state IN ('fenced', 'tombstone') AND OLD.deletion_state IS DISTINCT FROM NEW.deletion_state)
    EXECUTE FUNCTION communities_announce_closed();
