-- 055: one advisory-lock key per channel, ordering its writes with the
-- changes of who may read it.
--
-- Why: a channel write held its channel's row FOR KEY SHARE until commit
-- so that a membership or visibility change (which locks the row FOR
-- UPDATE) and a write in flight were ordered. Row locks are not queued
-- fairly: a new FOR KEY SHARE is granted at once beside the ones held,
-- ahead of a FOR UPDATE that waits for them, so a flood of messages into
-- an open channel kept its owner's removal or turn-private waiting until
-- it timed out. PostgreSQL's lock manager queues advisory locks: an
-- exclusive request that waits blocks the shared ones asked after it.
-- Every write check takes this key shared, in a statement before its
-- read (so the read's snapshot follows any change that held it); every
-- change of the channel's readers takes it exclusive before its row lock.
-- An advisory lock writes nothing to the table or the WAL and needs no
-- transaction id, so a refused write costs neither.
-- The key is a hash of a text prefix no other advisory key uses (see
-- community_deletion_lock_key, events_lock_slot); the media blob locks
-- use the two-integer key space, which never meets a bigint key.
-- Lock impact: CREATE FUNCTION only; no table is touched.
-- Deploy: apply before relays of this version start. While relays of the
-- previous version still run, their writes (row lock) and this version's
-- membership changes (row lock too) stay ordered; this version's writes
-- and the previous version's changes are not, until the rollout ends.
-- Roll back: the down part drops the function; roll the relays back first.
-- The README's hand delete of a member calls the function too: after a
-- roll back, drop its first SELECT.

SET LOCAL lock_timeout = '5s';

CREATE FUNCTION channels_write_lock_key(community uuid, channel uuid) RETURNS bigint
    LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
    AS $$ SELECT hashtextextended('buzz-channel-write:' || community::text || ':' || channel::text, 0) $$;

---- create above / drop below ----

SET LOCAL lock_timeout = '5s';

DROP FUNCTION channels_write_lock_key(uuid, uuid);
