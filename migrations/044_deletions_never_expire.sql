-- 044: deletion requests (kind 5) never expire.
--
-- Why: NIP-09 asks relays to keep deletion requests indefinitely, and the
-- relay refuses an older version of a deleted address by finding the
-- deletion. Since 042 a deletion's expiration tag was stored like any
-- other, so the purge deleted the deletion once it passed, and the versions
-- it had deleted could be sent again. The relay no longer stores a
-- deletion's expiration (docs/storage.md); this clears the ones stored.
-- Lock impact: one UPDATE of the kind 5 rows holding an expiration, found
-- through events_expiring (only events with an expiration are in it): ROW
-- EXCLUSIVE on events, a row lock on each such row, no rewrite; it waits
-- at most lock_timeout for those rows. Rows of a community being deleted
-- are left to its deletion (community_write_allowed).
-- Deploy: a relay of the previous version still stores a deletion's
-- expiration; migrate, roll out, then run this UPDATE again by hand if a
-- deletion with an expiration was stored in between (it is idempotent).
-- Roll back: nothing is undone; the expirations cleared are not restored,
-- and those deletions stay, as NIP-09 asks.

SET LOCAL lock_timeout = '5s';

UPDATE events SET expires_at = NULL
WHERE kind = 5 AND expires_at IS NOT NULL AND community_write_allowed(community_id);

---- create above / drop below ----

-- Nothing to undo (see Roll back above); tern needs a statement.
SELECT 1;
