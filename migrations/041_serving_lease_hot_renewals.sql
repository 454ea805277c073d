---- tern: disable-tx ----
-- 041: a serving-write lease's renewal is a HOT update: no index entry, no
-- dead tuple vacuum must find.
--
-- Why: a media upload or delete holds a serving-write lease renewed every
-- ten seconds (internal/deletion/serving.go), and the renewal sets
-- lease_until, which community_serving_write_leases_by_community indexed
-- (community_id, lease_until). An update of an indexed column is never HOT:
-- every renewal wrote a new heap tuple on another page and a new entry in
-- both indexes, and left the old ones for vacuum. Measured on a dev
-- cluster, 20 leases renewed 20 times a second (200 uploads in flight at
-- the real cadence) for 150 s: 3,005 updates, none HOT; the heap grew from
-- 8 kB to 40 kB and the indexes from 32 kB to 160 kB, for 20 live rows.
-- The index is now (community_id) alone: the fence counts a community's
-- live leases through it (community_serving_write_leases_renew,
-- community_deletion_requests_fence), and it backs the foreign key.
-- lease_until is then read from the few rows of that community, and the
-- reaper's "lease_until < now()" reads the whole table: it holds only the
-- operations in flight (at most BUZZ_MEDIA_MAX_UPLOADS per relay process,
-- plus deletes), a page or two. fillfactor 50 keeps room on each page for
-- the next version of its rows, so a renewal stays on its page. After,
-- the same run: 3,139 updates, all HOT; heap 8 kB and indexes 32 kB
-- throughout, no vacuum needed (docs/storage.md, "Heartbeat tables"). The
-- replica probe's replica_heartbeat row (two updates a second per relay
-- process) needs nothing: its updates were already all HOT on one page.
-- Lock impact: CREATE and DROP INDEX CONCURRENTLY take SHARE UPDATE
-- EXCLUSIVE (reads and writes go on) and wait for older transactions;
-- ALTER TABLE ... SET (fillfactor) takes SHARE UPDATE EXCLUSIVE for an
-- instant and rewrites nothing (existing pages fill as before until their
-- rows move). The migration runs outside a transaction, one statement at a
-- time, so lock_timeout is set for the session and reset at the end; every
-- statement is idempotent: after an interruption run `buzz-relay migrate`
-- again (an INVALID index left by an interrupted build is named by migrate
-- with the DROP to run).
-- Deploy: no code reads the index by name; relays of the previous version
-- run unchanged on it.
-- Roll back: the down part rebuilds the old index concurrently, drops the
-- new one and resets the fillfactor.

CREATE INDEX CONCURRENTLY IF NOT EXISTS community_serving_write_leases_of_community
    ON community_serving_write_leases (community_id);

DROP INDEX CONCURRENTLY IF EXISTS community_serving_write_leases_by_community;

SET lock_timeout = '5s';

ALTER TABLE community_serving_write_leases SET (fillfactor = 50);

RESET lock_timeout;

---- create above / drop below ----
---- tern: disable-tx ----

CREATE INDEX CONCURRENTLY IF NOT EXISTS community_serving_write_leases_by_community
    ON community_serving_write_leases (community_id, lease_until);

DROP INDEX CONCURRENTLY IF EXISTS community_serving_write_leases_of_community;

SET lock_timeout = '5s';

ALTER TABLE community_serving_write_leases RESET (fillfactor);

RESET lock_timeout;
