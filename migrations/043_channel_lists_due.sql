-- 043: a large channel's membership changes mark its lists due instead of
-- rewriting them (channel_lists_due).
--
-- Why: every join, leave, add or removal wrote the channel's relay-signed
-- admins and members lists (39001, 39002) whole in its own transaction:
-- O(members) per change, 110-300 ms of a group writer's time and a 1.3 MB
-- row at 8,000 members, and anyone may join or leave an open channel. Above
-- a size bound (internal/ingest, DefaultListFoldMembers) a change now only
-- marks the channel here, in its transaction; a relay process claims due
-- marks (FOR UPDATE SKIP LOCKED) and writes each channel's lists once per
-- interval. The mark commits with the change, so a process killed before
-- writing the lists leaves it for another; the claim holds the row until
-- the lists commit, so two processes never write one channel's lists at
-- once.
-- Lock impact: CREATE TABLE and its write fence trigger only; the foreign
-- key takes SHARE ROW EXCLUSIVE on communities for an instant (the reason
-- for the lock_timeout).
-- Deploy: run it before the new version. Processes of the previous version
-- neither mark nor claim: they go on writing every list in the change's
-- transaction, which stays correct beside the new ones (each list is
-- written under the channel's row lock, dated after the one it replaces).
-- Roll back: the down part drops the table; a mark dropped with it leaves
-- that channel's lists behind its membership until its next change, which
-- the previous version writes whole.

SET LOCAL lock_timeout = '5s';

CREATE TABLE channel_lists_due (
    community_id uuid NOT NULL REFERENCES communities (id),
    channel_id   uuid NOT NULL,
    -- Not before then: a mark's first change sets it one interval ahead, and
    -- the changes after it join the same write.
    due_at       timestamptz NOT NULL,
    PRIMARY KEY (community_id, channel_id)
);

COMMENT ON TABLE channel_lists_due IS
    'Large channels whose admins and members lists (39001, 39002) are behind their membership: written by whichever relay process claims the row once due_at passes.';

SELECT attach_community_write_fence('channel_lists_due');

---- create above / drop below ----

SET LOCAL lock_timeout = '5s';

DROP TABLE channel_lists_due;
