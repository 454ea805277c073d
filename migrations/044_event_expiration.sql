-- 044: events carry their NIP-40 expiration.
--
-- Why: an event with an expiration tag must not be served once that time
-- has passed (NIP-40). The relay reads the tag when it stores the event and
-- writes the time here; every REQ, COUNT and search adds
-- "expires_at IS NULL OR expires_at > now()", and the relay purges expired
-- rows in bounded batches through the partial index below (see
-- docs/storage.md). Events stored before this migration have no expiration.
-- Lock impact: ADD COLUMN without a default changes the catalog only (no
-- rewrite), but takes ACCESS EXCLUSIVE on events for that instant: it waits
-- at most lock_timeout behind running transactions, then fails (run it
-- again). The partial index holds only rows with an expiration, so it is
-- built from one read of the table, but in the same transaction: on a large
-- table run it in a quiet moment.
-- Deploy: relays of the previous version insert NULL (no expiration) and
-- serve expired events as before; migrate before rolling out this version.
-- Roll back: the down part drops the index and the column; the events stay,
-- never expiring.

SET LOCAL lock_timeout = '5s';
ALTER TABLE events ADD COLUMN expires_at timestamptz;
CREATE INDEX events_expiring ON events (expires_at) WHERE expires_at IS NOT NULL;

---- create above / drop below ----

SET LOCAL lock_timeout = '5s';
DROP INDEX events_expiring;
ALTER TABLE events DROP COLUMN expires_at;
