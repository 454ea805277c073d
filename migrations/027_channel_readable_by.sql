-- 027: who may read a channel, as one function the outbox statements share.
--
-- Why: a mention pages a target's listener only about an event the target
-- may read (an open channel, or a private one it is an active member of,
-- never a deleted channel). The outbox checked that only as it queued the
-- notification. A notification that then waited (a retry, a listener's
-- outage) was still sent after its message was hidden, its channel deleted
-- or its target removed from the private channel, telling that target's
-- listener the message's id, kind and time. The claim now asks the same
-- question again, of the rule here, so the two can never disagree.
-- A NULL channel (a community-wide event) is readable by everyone.
-- Lock impact: none on any table (CREATE FUNCTION only).
-- Roll back: the down part drops the function; the outbox statements of
-- this release call it, so roll the relay back first.

CREATE FUNCTION channel_readable_by(community uuid, channel uuid, reader bytea) RETURNS boolean
    LANGUAGE sql STABLE
AS $$
    SELECT channel IS NULL OR EXISTS (
        SELECT FROM channels c
        WHERE c.community_id = community AND c.id = channel AND c.deleted_at IS NULL
          AND (c.visibility = 'open' OR EXISTS (
              SELECT FROM channel_members m
              WHERE m.community_id = c.community_id AND m.channel_id = c.id
                AND m.pubkey = reader AND m.removed_at IS NULL)))
$$;

COMMENT ON FUNCTION channel_readable_by(uuid, uuid, bytea) IS
    'Whether reader may read channel of community now: NULL (no channel) or a live channel that is open or has reader as an active member.';

---- create above / drop below ----

DROP FUNCTION channel_readable_by(uuid, uuid, bytea);
