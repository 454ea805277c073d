-- 069: a channel's moderation events never expire.
--
-- Why: a channel's moderation events (9000-9002, 9005, 9007, 9008, and the
-- relay's 39000-39002 lists, in a channel; ingest.KindsKeptFromModeration)
-- are its lasting account of who did what: no 9005 hides them, and their
-- author's own kind 5 is refused, so that an admin who removed members
-- cannot hide that they did. A NIP-40 expiration tag hid them all the
-- same: the relay stored its expires_at (042), every read left the event
-- out once that passed, and the purge deleted its row, while what it did
-- (a removal, a grant, a hidden message, a channel deleted) stayed done.
-- Such an event is now refused by the constraint
-- events_moderation_never_expires (SQLSTATE 23514), which the relay answers
-- OK false "invalid: ..."; the statement fails, so nothing of the event is
-- stored or applied, and under the group writer only its savepoint rolls
-- back. Other kinds, a member's messages and joins among them, may still
-- expire. TestModerationExpiryRefusalNamesTheKindsKeptFromModeration holds
-- the constraint's kinds equal to the Go list.
-- Existing rows: the moderation events stored with an expiration keep
-- their row and lose the expiration (the UPDATE below, through the partial
-- index events_expiring), as 044 did for deletions; one whose expiration
-- passed but that the purge had not reached yet is served again, one
-- already purged is gone. The constraint is NOT VALID, as
-- events_deletion_coordinates_canonical (010) is: rows of a community
-- being deleted are left to its deletion, so a validation could fail on
-- them; `ALTER TABLE events VALIDATE CONSTRAINT
-- events_moderation_never_expires` reports whether any remain.
-- Order: the constraint comes first. It waits for the inserts in flight
-- (a relay of the previous version may be storing such an event) and then
-- refuses new ones, so the UPDATE after it sees every row there is to
-- clear; an UPDATE first missed an insert that committed after its
-- snapshot, and the NOT VALID constraint let that row keep its expiration
-- (TestModerationExpiryMigrationClearsAnInsertInFlight).
-- Lock impact: ADD CONSTRAINT ... NOT VALID takes ACCESS EXCLUSIVE on
-- events, scans nothing, and holds it to the commit, so reads and writes
-- of events wait for the UPDATE: an index scan of the rows holding an
-- expiration (events_expiring) that rewrites only the moderation events
-- among them (few: sent with an expiration), no table rewrite; over
-- 1,000,000 events of which 200,000 expire, the migration took 0.7-1.2 s
-- on a shared 2-core box. (Taking SHARE ROW EXCLUSIVE first would let
-- reads through, but a transaction that read events and then writes them
-- would deadlock with the lock's upgrade.) The lock
-- waits at most lock_timeout, so a long transaction on events fails this
-- migration rather than queueing every writer behind it. Each insert then
-- checks one expression without a function call (no per-statement parse;
-- see 020).
-- Deploy: a relay of the previous version answers the refusal as an
-- unnamed rule, "invalid: the database refused the write (rule
-- events_moderation_never_expires)": still OK false, still not applied.
-- Roll back: the down part drops the constraint; the expirations cleared
-- are not restored, and those events stay, as their channel's account.

SET LOCAL lock_timeout = '5s';

ALTER TABLE events ADD CONSTRAINT events_moderation_never_expires
    CHECK (expires_at IS NULL OR channel_id IS NULL
           OR kind NOT IN (9000, 9001, 9002, 9005, 9007, 9008, 39000, 39001, 39002)) NOT VALID;

UPDATE events SET expires_at = NULL
WHERE expires_at IS NOT NULL AND channel_id IS NOT NULL
  AND kind IN (9000, 9001, 9002, 9005, 9007, 9008, 39000, 39001, 39002)
  AND community_write_allowed(community_id);

---- create above / drop below ----

SET LOCAL lock_timeout = '5s';

ALTER TABLE events DROP CONSTRAINT IF EXISTS events_moderation_never_expires;
