-- 070: a member's added/removed notices (44100/44101) are dated strictly
-- after that member's previous one.
--
-- Why: a notice is relay-signed with no field of its own beyond its kind,
-- its p (the member) and h (the channel) tags and its created_at. Dated by
-- the clock's second, a member who joined, left and joined again within
-- one second got an "added" notice identical to the first, so the second
-- was dropped as a duplicate, and the member's history ended in "removed"
-- while they were active; two changes in one second tied, and a client
-- keeping the newest (lowest id on a tie) picked either. Each member's
-- row now keeps the date of its last notice (last_notice_at), and the next
-- one is dated at the clock's second or one second after it, whichever is
-- later, at most the relay's future limit ahead (ChannelMemberNoticeDate),
-- as the channel's lists are (EventSlotClear). The caller holds the
-- channel's row lock, so two changes of one member are dated in turn.
-- Existing rows start with NULL: their next notice is dated by the clock.
-- Lock impact: ADD COLUMN without a default is a catalog change only (no
-- rewrite, no scan) under a brief ACCESS EXCLUSIVE on channel_members,
-- waiting at most lock_timeout.
-- Roll back: the down part drops the column; notices go back to the
-- clock's second.

SET LOCAL lock_timeout = '5s';

ALTER TABLE channel_members ADD COLUMN last_notice_at timestamptz;

COMMENT ON COLUMN channel_members.last_notice_at IS 'created_at of the last added/removed notice (44100/44101) about this member: the next is dated at least one second later.';

---- create above / drop below ----

SET LOCAL lock_timeout = '5s';

ALTER TABLE channel_members DROP COLUMN IF EXISTS last_notice_at;
