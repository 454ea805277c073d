---- tern: disable-tx ----
-- 042: events carry their NIP-40 expiration.
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
-- again). The partial index holds only rows with an expiration; it is built
-- CONCURRENTLY (SHARE UPDATE EXCLUSIVE: reads and writes go on, one read of
-- the table), so the file runs outside a transaction, one statement at a
-- time, each idempotent: after an interruption run `buzz-relay migrate`
-- again (an INVALID index left by an interrupted build is named by migrate
-- with the DROP to run).
-- Deploy: relays of the previous version insert NULL (no expiration) and
-- serve expired events as before; migrate before rolling out this version.
-- Roll back: the down part drops the index and the column; the events stay,
-- never expiring.

SET lock_timeout = '5s';

ALTER TABLE events ADD COLUMN IF NOT EXISTS expires_at timestamptz;

-- Not RESET: that would bring back the migrator role's lock_timeout, and
-- a concurrent build cancelled by it leaves its index INVALID.
SET lock_timeout = 0;

CREATE INDEX CONCURRENTLY IF NOT EXISTS events_expiring ON events (expires_at) WHERE expires_at IS NOT NULL;

---- create above / drop below ----
---- tern: disable-tx ----

DROP INDEX CONCURRENTLY IF EXISTS events_expiring;

SET lock_timeout = '5s';

ALTER TABLE events DROP COLUMN IF EXISTS expires_at;

RESET lock_timeout;
