-- 049: a hard DELETE of channel member rows counts on the channel row too
-- (channels.active_members and readers_version), as an insert or a soft
-- removal already does.
--
-- Why: the relay only soft-removes members, but an operator's psql session
-- may delete rows. Uncounted, such a delete left active_members too high
-- (BUZZ_MAX_CHANNEL_MEMBERS then refused joins to a channel with room) and
-- readers_version unchanged, so a relay process that had cached the
-- channel's readers went on sending the deleted member the channel's live
-- events until something else changed who may read it.
-- Cost: a statement-level trigger with a transition table: one UPDATE per
-- DELETE statement, one row per channel that lost an active member,
-- nothing per deleted row (a community deletion's purge batch of members
-- updates each of their channels once, just before deleting them).
-- Lock order: the delete locks member rows, then the trigger locks their
-- channels' rows; the relay's membership changes lock the channel first.
-- A psql delete racing a join on the same channel can therefore deadlock;
-- PostgreSQL cancels one of the two (run it again). Lock the channel first
-- (SELECT ... FROM channels ... FOR UPDATE) to avoid that.
-- Lock impact: CREATE TRIGGER takes SHARE ROW EXCLUSIVE on channel_members
-- for that instant (membership writes wait for it, reads do not), the
-- COMMENT SHARE UPDATE EXCLUSIVE on channels (nothing but DDL and VACUUM
-- waits for it); nothing is rewritten or backfilled. Counts already off from an earlier hard
-- delete stay off: the README's DBA section says how to recount.
-- Deploy: any order with relays; they never hard-delete members.
-- Roll back: the down part drops the trigger and its function. DROP
-- TRIGGER takes ACCESS EXCLUSIVE on channel_members for an instant: reads
-- of members wait for it too (at most lock_timeout, then it fails; run it
-- again).

SET LOCAL lock_timeout = '5s';

CREATE FUNCTION channel_members_count_hard_deletes() RETURNS trigger
    LANGUAGE plpgsql
AS $$
BEGIN
    UPDATE channels c
    SET readers_version = c.readers_version + 1, active_members = c.active_members - gone.active
    FROM (SELECT d.community_id, d.channel_id, count(*)::integer AS active
          FROM deleted_members d
          WHERE d.removed_at IS NULL
          GROUP BY d.community_id, d.channel_id) gone
    WHERE c.community_id = gone.community_id AND c.id = gone.channel_id;
    RETURN NULL;
END
$$;

CREATE TRIGGER channel_members_count_hard_deletes
    AFTER DELETE ON channel_members
    REFERENCING OLD TABLE AS deleted_members
    FOR EACH STATEMENT
    EXECUTE FUNCTION channel_members_count_hard_deletes();

COMMENT ON COLUMN channels.active_members IS
    'The channel''s active members (channel_members rows with removed_at NULL), counted by channel_members_count_readers_change and, for hard deletes, channel_members_count_hard_deletes; read under the channel''s row lock by every add, which BUZZ_MAX_CHANNEL_MEMBERS bounds.';

DO $$
BEGIN
    EXECUTE format('ALTER FUNCTION channel_members_count_hard_deletes() SET search_path = %I, pg_temp', current_schema());
END
$$;

---- create above / drop below ----

SET LOCAL lock_timeout = '5s';

DROP TRIGGER channel_members_count_hard_deletes ON channel_members;
DROP FUNCTION channel_members_count_hard_deletes();

COMMENT ON COLUMN channels.active_members IS
    'The channel''s active members (channel_members rows with removed_at NULL), counted by channel_members_count_readers_change; read under the channel''s row lock by every add, which BUZZ_MAX_CHANNEL_MEMBERS bounds. A hard DELETE of a member row is not counted.';
