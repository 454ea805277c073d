---- tern: disable-tx ----
-- 019: smaller events indexes, and a newest-first plan that does not wait
-- for statistics.
--
-- Why: the time-ordered indexes were built newest-first (DESC). New events
-- arrive newest, so every insert landed at the left end of its key run,
-- where PostgreSQL splits a page in halves and the left half is never filled
-- again (only a split of the rightmost page packs it; with several kinds or
-- authors interleaved only the last run gains). The author index ended in
-- the 32-byte id, which makes every key unique, so PostgreSQL could never
-- store one key for many rows. An index on channel_id held every
-- channel-less row, and a (community_id, id) btree repeated the id next to
-- the primary key.
--
-- Index by index: the REQ filter shape that reads it, and bytes per event
-- before -> after on a fresh load of 200,000 kind 1/7 events with 200-byte
-- content, one p and one t tag (cmd/buzz-bench/scale-load.sql; first number
-- word content, 500 authors, 4 events a second; second number buzz-bench's
-- marker content, 16 authors, 40 events a second):
--   events_pkey (community_id, created_at, id), unchanged: ON CONFLICT
--     duplicate detection (an event's id fixes its created_at, so a
--     duplicate always collides here); since/until windows and filters
--     without kinds, authors or ids, read backward.     86 -> 86, 84 -> 84
--   events_by_id (community_id, id) -> events_by_id_hash, hash (id),
--     fillfactor 100: "ids" filters, reaction targets, deletions by id,
--     thread parents. A hash entry holds a 4-byte hash code, not the id;
--     the community is tested on the row. Not unique: the primary key
--     refuses duplicates.                               100 -> 30, 100 -> 30
--   events_by_kind (community_id, kind, created_at DESC, id DESC) ->
--     events_by_kind_time (same columns ascending): "kinds", newest first
--     by a backward scan that returns (created_at, id) order exactly, so a
--     limit stops it. It keeps the id: without it (44 and 15 bytes) a limit
--     must read every row of the last second, and a burst puts thousands of
--     events in one second (5,685 rows read for limit 100, 18-25 ms).
--                                                    172 -> 157, 173 -> 157
--   events_by_author_kind (community_id, pubkey, kind, created_at DESC, id DESC)
--     -> events_by_author_time (community_id, pubkey, kind, created_at):
--     "authors" (+ "kinds"), the replaceable-slot trigger's head lookup.
--     Without the id, one author's events of one kind and second share a
--     key and are stored once; the planner orders that one second's rows
--     by id (incremental sort).                        229 -> 145, 232 -> 104
--   events_by_channel (community_id, channel_id, created_at DESC, id DESC) ->
--     events_by_channel_time (same columns ascending)
--     WHERE channel_id IS NOT NULL: one channel's timeline ("#h" naming one
--     channel), channel deletions. Channel-less rows are never read
--     through it.                                         173 -> 0, 167 -> 0
--   events_by_tag, events_search, events_by_address: unchanged (30, 73, 0;
--     27, 91, 0).
-- Total: 2,033 -> 1,693 and 1,785 -> 1,405 bytes per event (indexes 862 ->
-- 522 and 874 -> 494; the heap, 1,171 and 911, is unchanged). Applied to
-- a table already holding its rows, the concurrent builds pack the new
-- indexes tighter than a load through them does. At a million events the
-- cost per event does not grow: 1,677 bytes per event at 1,000,000
-- (indexes 506) against 1,693 at 200,000.
--
-- Statistics after a burst: in a database that was never analyzed the
-- planner guesses that "community_id = $1 AND kind = 1" matches one row.
-- With the DESC index it costed a bitmap scan plus a sort of every kind-1
-- row (12.35) a hair below reading the index (12.47). kinds:[1] limit 100,
-- 26,000 events just loaded, no ANALYZE:
--   before: Limit -> Sort -> Bitmap Heap Scan on events
--             -> Bitmap Index Scan on events_by_kind
--           20,800 rows read and sorted, 38.8 ms
--   after:  Limit -> Index Scan Backward using events_by_kind_time
--           100 rows read, 0.27 ms
-- TestPlansWithoutStatistics (internal/eventstore) pins it. It is still a
-- cost comparison on a guess: through the relay, with its real scope
-- parameters, the guess fell the other way (41-99 ms at 20,000 events), so
-- the relay also runs ANALYZE itself when the table was never analyzed or
-- has doubled since (eventstore.AnalyzeWhenStale, every second). Autovacuum's
-- first ANALYZE comes when its launcher wakes (autovacuum_naptime, a server
-- setting, one minute by default); after that, this table is re-analyzed
-- once 2% of it (plus 500 rows) changed instead of 10%: every 20,500 new
-- rows at a million events instead of every 100,050, so the planner's idea
-- of how common a kind, an author or a word is stays current.
--
-- Lock impact, on a populated table: every index is built and dropped
-- CONCURRENTLY (SHARE UPDATE EXCLUSIVE: reads and writes go on; a build
-- scans the table twice and waits for transactions older than it), so this
-- migration runs outside a transaction (tern's disable-tx runs it one
-- statement at a time), and every statement is idempotent: after an
-- interruption run `buzz-relay migrate` again. A build interrupted half-way
-- leaves an INVALID index, which IF NOT EXISTS would keep: migrate refuses
-- to start while one exists and names the DROP INDEX CONCURRENTLY to run.
-- A manual ANALYZE events during a build deadlocks with it (PostgreSQL
-- cancels one); the relay's own statistics keeper gives up at once
-- instead of waiting for the lock. Until the old indexes are
-- dropped, inserts maintain both sets. ALTER TABLE ... SET (autovacuum ...)
-- takes SHARE UPDATE EXCLUSIVE for a moment. Nothing is rewritten.
-- Roll back: the down part rebuilds the old indexes concurrently, then
-- drops the new ones and the autovacuum settings.

CREATE INDEX CONCURRENTLY IF NOT EXISTS events_by_id_hash ON events USING hash (id) WITH (fillfactor = 100);

CREATE INDEX CONCURRENTLY IF NOT EXISTS events_by_kind_time ON events (community_id, kind, created_at, id);

CREATE INDEX CONCURRENTLY IF NOT EXISTS events_by_author_time ON events (community_id, pubkey, kind, created_at);

CREATE INDEX CONCURRENTLY IF NOT EXISTS events_by_channel_time ON events (community_id, channel_id, created_at, id)
    WHERE channel_id IS NOT NULL;

DROP INDEX CONCURRENTLY IF EXISTS events_by_id;

DROP INDEX CONCURRENTLY IF EXISTS events_by_kind;

DROP INDEX CONCURRENTLY IF EXISTS events_by_author_kind;

DROP INDEX CONCURRENTLY IF EXISTS events_by_channel;

ALTER TABLE events SET (autovacuum_analyze_scale_factor = 0.02, autovacuum_analyze_threshold = 500);

---- create above / drop below ----
---- tern: disable-tx ----

ALTER TABLE events RESET (autovacuum_analyze_scale_factor, autovacuum_analyze_threshold);

CREATE INDEX CONCURRENTLY IF NOT EXISTS events_by_id ON events (community_id, id);

CREATE INDEX CONCURRENTLY IF NOT EXISTS events_by_kind ON events (community_id, kind, created_at DESC, id DESC);

CREATE INDEX CONCURRENTLY IF NOT EXISTS events_by_author_kind ON events (community_id, pubkey, kind, created_at DESC, id DESC);

CREATE INDEX CONCURRENTLY IF NOT EXISTS events_by_channel ON events (community_id, channel_id, created_at DESC, id DESC);

DROP INDEX CONCURRENTLY IF EXISTS events_by_id_hash;

DROP INDEX CONCURRENTLY IF EXISTS events_by_kind_time;

DROP INDEX CONCURRENTLY IF EXISTS events_by_author_time;

DROP INDEX CONCURRENTLY IF EXISTS events_by_channel_time;
