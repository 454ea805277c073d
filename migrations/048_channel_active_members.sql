-- 048: a channel counts its active members on its row
-- (channels.active_members), kept by the trigger that counts its readers
-- changes.
--
-- Why: BUZZ_MAX_CHANNEL_MEMBERS refuses an add to a channel that already
-- has that many active members. Counted at each add under the channel's
-- row lock, the members cost the group writer about 0.18 µs each: a join
-- into a channel of 99,000 took 20.8 ms of it instead of 3.8
-- (BenchmarkJoinNearMemberLimit), and a refused join as much. Kept on the
-- row that every membership change already locks and updates (migration
-- 038's readers_version), the count costs nothing more per change; the
-- choice whether a change writes the channel's lists or marks them due
-- reads it too.
-- A hard DELETE of member rows is not counted: only a community's purge
-- deletes them, with their channels (a row-level count would update the
-- channel's row once per deleted member in every purge batch).
-- Lock impact: ADD COLUMN takes ACCESS EXCLUSIVE on channels until the
-- migration commits, so every channel read and write waits for the
-- backfill: one pass over channel_members and an update of each channel
-- row that has active members (a few seconds for millions of members).
-- That lock is also what makes the backfill exact: every membership change
-- reads or locks its channel's row first, so none runs while it counts.
-- A community being deleted (quiescing or fenced: never active again) is
-- not counted; its write fence refuses the update, and its deletion only
-- purges its channels. The check takes a shared advisory lock per channel
-- row updated, as the fence itself would.
-- Deploy: apply before relays of this version start (they read the column);
-- relays of the previous version ignore it, and their membership writes
-- keep it right through the trigger.
-- Roll back: the down part restores the trigger function's previous body
-- and drops the column.

SET LOCAL lock_timeout = '5s';

ALTER TABLE channels ADD COLUMN active_members integer NOT NULL DEFAULT 0;

COMMENT ON COLUMN channels.active_members IS
    'The channel''s active members (channel_members rows with removed_at NULL), counted by channel_members_count_readers_change; read under the channel''s row lock by every add, which BUZZ_MAX_CHANNEL_MEMBERS bounds. A hard DELETE of a member row is not counted.';

UPDATE channels c SET active_members = m.n
FROM (SELECT community_id, channel_id, count(*)::integer AS n
      FROM channel_members WHERE removed_at IS NULL
      GROUP BY community_id, channel_id) m
WHERE c.community_id = m.community_id AND c.id = m.channel_id
  -- A community being deleted refuses every write to its channels (the
  -- fence would stop the migration): its channels stay at zero, and it
  -- never writes again; its deletion purges them.
  AND community_write_allowed(c.community_id);

CREATE OR REPLACE FUNCTION channel_members_count_readers_change() RETURNS trigger
    LANGUAGE plpgsql
AS $$
DECLARE
    joined integer := 0;
BEGIN
    IF TG_OP = 'UPDATE' AND OLD.removed_at IS NOT DISTINCT FROM NEW.removed_at THEN
        RETURN NULL;
    END IF;
    IF NEW.removed_at IS NULL THEN
        joined := 1;
    ELSIF TG_OP = 'UPDATE' AND OLD.removed_at IS NULL THEN
        joined := -1;
    END IF;
    UPDATE channels
    SET readers_version = readers_version + 1, active_members = active_members + joined
    WHERE community_id = NEW.community_id AND id = NEW.channel_id;
    RETURN NULL;
END
$$;

DO $$
BEGIN
    EXECUTE format('ALTER FUNCTION channel_members_count_readers_change() SET search_path = %I, pg_temp', current_schema());
END
$$;

---- create above / drop below ----

SET LOCAL lock_timeout = '5s';

CREATE OR REPLACE FUNCTION channel_members_count_readers_change() RETURNS trigger
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

DO $$
BEGIN
    EXECUTE format('ALTER FUNCTION channel_members_count_readers_change() SET search_path = %I, pg_temp', current_schema());
END
$$;

ALTER TABLE channels DROP COLUMN active_members;
