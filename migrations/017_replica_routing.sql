-- 017: what a read replica must prove before it serves a read.
--
-- Why: some reads may be served by a streaming standby, but only when the
-- standby session can prove it holds every row the answer needs. Two
-- pieces here make that provable:
--
-- 1. events_created_at_floor: a channel event (channel_id set) may not be
--    committed with a created_at older than buzz.created_at_floor seconds
--    before the moment its transaction commits. The check runs deferred, at
--    COMMIT, and reads clock_timestamp() (the time it runs) rather than
--    now() (the transaction's start): a transaction that stays open a long
--    time cannot slip an old row in behind a wall the relay has already
--    announced. With the floor, "every channel row with created_at <= W has
--    committed" becomes true once every transaction open when W + floor was
--    sampled has ended, which is what the heartbeat probe measures.
--    The floor is a session setting the relay's writer pool arms only when a
--    reader is configured; a session without it (pg_restore, a backfill)
--    is not checked, and routing must then be held closed (no reader URL).
--    The trigger also covers UPDATE OF created_at, channel_id: an update
--    can move a channel-less row into a channel or date a row backwards.
--
-- 2. replica_heartbeat: one row the relay's writer-side probe advances
--    (token + 1) after sampling the open transactions. A standby session
--    that reads token >= T sees everything committed before that token's
--    probe. Its one row serializes every relay process's probes, so tokens
--    are commit-ordered across processes. epoch changes when the relay sees
--    the token go backwards (a restore or a re-seeded database): readers
--    still on the old timeline then fail the epoch check and reads go to
--    the writer. The table is deployment topology, not tenant data.
--
-- Lock impact: CREATE CONSTRAINT TRIGGER takes a SHARE ROW EXCLUSIVE lock
-- on events for a moment (blocks writes, not reads); no rewrite, no scan.
-- replica_heartbeat is new.
-- Roll back: the down part drops the trigger, its function and the table.
-- Turn routing off first (unset BUZZ_READ_DATABASE_URL on every relay):
-- without the floor the covered proof no longer holds.

CREATE FUNCTION events_created_at_floor_guard() RETURNS trigger
    LANGUAGE plpgsql
AS $$
DECLARE
    setting    text := current_setting('buzz.created_at_floor', true);
    floor_secs bigint;
BEGIN
    -- Malformed: the session is not armed.
    IF setting !~ '^[0-9]{1,9}$' THEN
        RETURN NULL;
    END IF;
    floor_secs := setting::bigint;
    IF floor_secs > 0 AND NEW.created_at < clock_timestamp() - make_interval(secs => floor_secs) THEN
        RAISE EXCEPTION 'channel event created_at % is more than % seconds before commit time', NEW.created_at, floor_secs
            USING ERRCODE = '23514', CONSTRAINT = 'events_created_at_floor';
    END IF;
    RETURN NULL;
END
$$;

CREATE CONSTRAINT TRIGGER events_created_at_floor
    AFTER INSERT OR UPDATE OF created_at, channel_id ON events
    DEFERRABLE INITIALLY DEFERRED
    FOR EACH ROW
    -- Evaluated when the row is written: channel-less rows and rows of
    -- unarmed sessions (no reader configured, restores, backfills) queue
    -- no commit-time check at all.
    WHEN (NEW.channel_id IS NOT NULL AND coalesce(current_setting('buzz.created_at_floor', true), '') <> '')
    EXECUTE FUNCTION events_created_at_floor_guard();

CREATE TABLE replica_heartbeat (
    id    smallint PRIMARY KEY CONSTRAINT replica_heartbeat_single_row CHECK (id = 1),
    epoch uuid     NOT NULL DEFAULT gen_random_uuid(),
    token bigint   NOT NULL DEFAULT 0
);

COMMENT ON TABLE replica_heartbeat IS 'The freshness token the relay writes and read replicas prove against; one row.';

INSERT INTO replica_heartbeat (id) VALUES (1) ON CONFLICT DO NOTHING;

INSERT INTO _operator_global_tables (table_name, reason) VALUES
    ('replica_heartbeat', 'deployment topology: the read-replica freshness token, shared by every community');

---- create above / drop below ----

DELETE FROM _operator_global_tables WHERE table_name = 'replica_heartbeat';
DROP TABLE replica_heartbeat;
DROP TRIGGER events_created_at_floor ON events;
DROP FUNCTION events_created_at_floor_guard();
