-- 016: announce a community's closing to every relay.
--
-- Why: once a community's deletion fences it, no write of its can land, and
-- its live connections must close on every relay process, not only on the
-- one the operator happens to talk to. Every relay shares this database and
-- listens on the channel buzz_community_closed; this trigger sends the
-- community's id there when its deletion_state reaches fenced or tombstone,
-- whichever process or psql session made the change. NOTIFY is delivered on
-- commit only, so a fence that rolls back announces nothing.
-- Lock impact: CREATE TRIGGER takes a SHARE ROW EXCLUSIVE lock on
-- communities for an instant; communities is small and rarely written.
-- Roll back: the down part drops the trigger; relays then close a fenced
-- community's connections on their periodic sweep only.

CREATE FUNCTION communities_announce_closed() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('buzz_community_closed', NEW.id::text);
    RETURN NULL;
END
$$;

COMMENT ON FUNCTION communities_announce_closed() IS
    'Tells every relay listening on buzz_community_closed to close the community''s live connections.';

CREATE TRIGGER communities_announce_closed
    AFTER UPDATE OF deletion_state ON communities
    FOR EACH ROW
    WHEN (NEW.deletion_state IN ('fenced', 'tombstone') AND OLD.deletion_state IS DISTINCT FROM NEW.deletion_state)
    EXECUTE FUNCTION communities_announce_closed();

---- create above / drop below ----

DROP TRIGGER IF EXISTS communities_announce_closed ON communities;
DROP FUNCTION IF EXISTS communities_announce_closed();
