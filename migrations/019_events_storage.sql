---- tern: disable-tx ----
-- 019: a smaller events table, and plans that do not depend on fresh statistics.
--
-- Why: every event cost about 1,880 bytes (heap + indexes) on a fresh load
-- of 200,000 kind 1/7 events (about 160-byte content, one p and one t tag):
-- the heap carried two derived copies of data it already holds (tag_index,
-- the tag array, and search_tsv, the full-text vector), the time-ordered
-- indexes were built newest-first (DESC) so that every insert landed on
-- their LEFTMOST leaf, where PostgreSQL splits pages 50/50 and never packs
-- them (only rightmost splits leave pages full), an index on channel_id held
-- every channel-less row, and a (community_id, id) btree repeated the id
-- next to the primary key. This migration keeps every read shape on an
-- index and drops the rest.
--
-- Index by index (bytes per event on that 200,000-event load, before -> after;
-- "shape" is the REQ filter that reads it):
--   events_pkey (community_id, created_at, id), unchanged: ON CONFLICT
--     duplicate detection (an id fixes its created_at, so a duplicate always
--     collides here); since/until windows and filters with no kinds, authors
--     or ids, read backward for newest first.                     86 -> 86
--   events_by_id (community_id, id) btree -> events_by_id_hash, hash (id):
--     "ids" filters, reactions' target lookups, deletions by id. A hash
--     entry holds a 4-byte hash code, not the 32-byte id; the community is
--     checked on the heap row (an id stored in two communities is two rows).
--     Not unique: duplicates are refused by the primary key.    100 -> 28
--   events_by_kind (community_id, kind, created_at DESC, id DESC) ->
--     events_by_kind_time (community_id, kind, created_at, id): "kinds"
--     filters, newest first by a backward scan. Ascending keys make every
--     insert a rightmost insert: pages are packed (fillfactor 90).
--                                                                172 -> 85
--   events_by_author_kind (community_id, pubkey, kind, created_at DESC, id DESC)
--     -> events_by_author_time (same columns ascending): "authors" (+ "kinds")
--     filters, and the replaceable-slot trigger's head lookup.   229 -> 137
--   events_by_channel (community_id, channel_id, created_at DESC, id DESC) ->
--     events_by_channel_time (ascending) WHERE channel_id IS NOT NULL:
--     one channel's timeline ("#h" with one channel). Channel-less rows
--     are never read through it; they no longer sit in it.        173 -> 0
--   events_by_tag gin (tag_index) -> events_by_tag_values
--     gin (events_tag_index(tags)): "#x" tag filters, the p-gate of gift
--     wraps and membership notifications. The tag array is computed by the
--     index (and by the few queries that test it on a row) instead of being
--     stored in every heap row.                                   30 -> 30
--   events_search gin (search_tsv) -> events_search_content
--     gin (to_tsvector('simple', content)) WHERE kind NOT IN (...): NIP-50
--     "search". Same kinds left out as before (encrypted or meaningless
--     content). Queries must spell the expression and the kind list exactly
--     as below for the planner to match the index (internal/eventstore).
--                                                                 66 -> 66
--   events_by_address: unchanged (addressable kinds only, rare).
-- Heap: tag_index (about 110 bytes a row) and search_tsv (about 200-350)
-- are dropped. Total on that load: 1,879 -> see docs/storage.md.
--
-- Statistics after a burst: on a table that was never analyzed the planner
-- guesses that "community_id = $1 AND kind = 1" matches one row, and with
-- the old DESC index it costed "bitmap scan + sort every kind-1 row" a hair
-- below "read the index newest first": 26-50 ms for kinds:[1] limit 100 in
-- the first minute after a burst into a fresh database, until autovacuum's
-- first ANALYZE (its launcher wakes once a minute, autovacuum_naptime, a
-- server setting no migration can change), then 2 ms. With the ascending
-- index scanned backward the same one-row guess costs the ordered scan
-- lower (8.44 against 12.35), so the right plan no longer waits for
-- statistics:
--   before (no statistics): Limit -> Sort -> Bitmap Heap Scan on events
--     -> Bitmap Index Scan on events_by_kind   (20,800 rows sorted, 38 ms)
--   after (no statistics):  Limit -> Index Scan Backward using
--     events_by_kind_time                       (100 rows read, 0.3 ms)
-- internal/eventstore's TestPlansWithoutStatistics pins this. Once the
-- table is large, autovacuum re-analyzes it after 2% of it changed (plus
-- 500 rows) instead of 10%: at a million events, every 20,500 new rows
-- instead of every 100,050, so the planner's idea of how common a kind, an
-- author or a search word is stays current.
--
-- Lock impact, on a populated table: every index is built and dropped
-- CONCURRENTLY (SHARE UPDATE EXCLUSIVE: reads and writes go on; each build
-- scans the table twice and waits for older transactions), so this
-- migration runs outside a transaction, and every statement is idempotent
-- (IF [NOT] EXISTS, CREATE OR REPLACE): after an interruption re-run
-- `buzz-relay migrate`; a CONCURRENTLY build interrupted half-way leaves an
-- INVALID index, drop it first. The trigger function is replaced in place.
-- ALTER TABLE ... SET (autovacuum ...) takes SHARE UPDATE EXCLUSIVE for a
-- moment. DROP COLUMN takes ACCESS EXCLUSIVE for a moment only: it marks
-- the columns dropped and rewrites nothing, so the space they hold comes
-- back only as rows are rewritten (updates, VACUUM FULL, pg_repack, or a
-- dump and restore); new rows are small at once.
-- Roll-out: the relay of this version reads the new index expressions; a
-- relay of an earlier version still running after the DROP COLUMN fails
-- its tag and search reads (column does not exist). Stop old relays before
-- migrating, or accept those errors for the length of the roll-out.
-- Roll back: the down part re-adds both generated columns (a full table
-- rewrite under ACCESS EXCLUSIVE: schedule it), rebuilds the old indexes
-- concurrently and drops the new ones.

CREATE INDEX CONCURRENTLY IF NOT EXISTS events_by_id_hash ON events USING hash (id) WITH (fillfactor = 100);

CREATE INDEX CONCURRENTLY IF NOT EXISTS events_by_kind_time ON events (community_id, kind, created_at);

CREATE INDEX CONCURRENTLY IF NOT EXISTS events_by_author_time ON events (community_id, pubkey, kind, created_at);

CREATE INDEX CONCURRENTLY IF NOT EXISTS events_by_channel_time ON events (community_id, channel_id, created_at)
    WHERE channel_id IS NOT NULL;

CREATE INDEX CONCURRENTLY IF NOT EXISTS events_by_tag_values ON events USING gin (events_tag_index(tags)) WITH (fastupdate = off);

CREATE INDEX CONCURRENTLY IF NOT EXISTS events_search_content ON events USING gin (to_tsvector('simple'::regconfig, content))
    WHERE kind NOT IN (1059, 30300, 30622, 44100, 44101);

-- The replaceable-slot trigger, reading the tag array from the index
-- expression rather than the dropped column (otherwise unchanged).
CREATE OR REPLACE FUNCTION events_keep_newest_version() RETURNS trigger
    LANGUAGE plpgsql
AS $$
DECLARE
    head_created_at timestamptz;
    head_id bytea;
BEGIN
    PERFORM events_lock_slot(NEW.community_id, NEW.pubkey, NEW.kind, NEW.d_tag);

    IF EXISTS (
        SELECT FROM events
        WHERE community_id = NEW.community_id AND pubkey = NEW.pubkey AND kind = 5
          AND events_tag_index(tags) && ARRAY['a:' || NEW.kind::text || ':' || encode(NEW.pubkey, 'hex') || ':' || coalesce(NEW.d_tag, '')]
          AND created_at >= NEW.created_at
          AND deleted_at IS NULL
    ) THEN
        RETURN NULL;
    END IF;

    IF NEW.d_tag IS NULL THEN
        SELECT created_at, id INTO head_created_at, head_id
        FROM events
        WHERE community_id = NEW.community_id AND pubkey = NEW.pubkey AND kind = NEW.kind
        ORDER BY created_at DESC, id ASC
        LIMIT 1;
    ELSE
        SELECT created_at, id INTO head_created_at, head_id
        FROM events
        WHERE community_id = NEW.community_id AND pubkey = NEW.pubkey AND kind = NEW.kind AND d_tag = NEW.d_tag
        ORDER BY created_at DESC, id ASC
        LIMIT 1;
    END IF;

    IF head_id IS NOT NULL
       AND (head_created_at > NEW.created_at OR (head_created_at = NEW.created_at AND head_id <= NEW.id)) THEN
        RETURN NULL;
    END IF;

    DELETE FROM events
    WHERE community_id = NEW.community_id AND pubkey = NEW.pubkey AND kind = NEW.kind
      AND d_tag IS NOT DISTINCT FROM NEW.d_tag;
    RETURN NEW;
END
$$;

DROP INDEX CONCURRENTLY IF EXISTS events_by_id;

DROP INDEX CONCURRENTLY IF EXISTS events_by_kind;

DROP INDEX CONCURRENTLY IF EXISTS events_by_author_kind;

DROP INDEX CONCURRENTLY IF EXISTS events_by_channel;

DROP INDEX CONCURRENTLY IF EXISTS events_by_tag;

DROP INDEX CONCURRENTLY IF EXISTS events_search;

ALTER TABLE events DROP COLUMN IF EXISTS search_tsv, DROP COLUMN IF EXISTS tag_index;

ALTER TABLE events SET (autovacuum_analyze_scale_factor = 0.02, autovacuum_analyze_threshold = 500);

ALTER INDEX events_pkey SET (fillfactor = 100);

---- create above / drop below ----
---- tern: disable-tx ----

ALTER TABLE events RESET (autovacuum_analyze_scale_factor, autovacuum_analyze_threshold);

ALTER INDEX events_pkey RESET (fillfactor);

ALTER TABLE events ADD COLUMN IF NOT EXISTS tag_index text[] NOT NULL GENERATED ALWAYS AS (events_tag_index(tags)) STORED;

ALTER TABLE events ADD COLUMN IF NOT EXISTS search_tsv tsvector GENERATED ALWAYS AS (
    CASE WHEN kind IN (1059, 30300, 30622, 44100, 44101) THEN NULL
         ELSE to_tsvector('simple'::regconfig, content)
    END
) STORED;

CREATE INDEX CONCURRENTLY IF NOT EXISTS events_by_id ON events (community_id, id);

CREATE INDEX CONCURRENTLY IF NOT EXISTS events_by_kind ON events (community_id, kind, created_at DESC, id DESC);

CREATE INDEX CONCURRENTLY IF NOT EXISTS events_by_author_kind ON events (community_id, pubkey, kind, created_at DESC, id DESC);

CREATE INDEX CONCURRENTLY IF NOT EXISTS events_by_channel ON events (community_id, channel_id, created_at DESC, id DESC);

CREATE INDEX CONCURRENTLY IF NOT EXISTS events_by_tag ON events USING gin (tag_index);

CREATE INDEX CONCURRENTLY IF NOT EXISTS events_search ON events USING gin (search_tsv);

CREATE OR REPLACE FUNCTION events_keep_newest_version() RETURNS trigger
    LANGUAGE plpgsql
AS $$
DECLARE
    head_created_at timestamptz;
    head_id bytea;
BEGIN
    PERFORM events_lock_slot(NEW.community_id, NEW.pubkey, NEW.kind, NEW.d_tag);

    IF EXISTS (
        SELECT FROM events
        WHERE community_id = NEW.community_id AND pubkey = NEW.pubkey AND kind = 5
          AND tag_index && ARRAY['a:' || NEW.kind::text || ':' || encode(NEW.pubkey, 'hex') || ':' || coalesce(NEW.d_tag, '')]
          AND created_at >= NEW.created_at
          AND deleted_at IS NULL
    ) THEN
        RETURN NULL;
    END IF;

    IF NEW.d_tag IS NULL THEN
        SELECT created_at, id INTO head_created_at, head_id
        FROM events
        WHERE community_id = NEW.community_id AND pubkey = NEW.pubkey AND kind = NEW.kind
        ORDER BY created_at DESC, id ASC
        LIMIT 1;
    ELSE
        SELECT created_at, id INTO head_created_at, head_id
        FROM events
        WHERE community_id = NEW.community_id AND pubkey = NEW.pubkey AND kind = NEW.kind AND d_tag = NEW.d_tag
        ORDER BY created_at DESC, id ASC
        LIMIT 1;
    END IF;

    IF head_id IS NOT NULL
       AND (head_created_at > NEW.created_at OR (head_created_at = NEW.created_at AND head_id <= NEW.id)) THEN
        RETURN NULL;
    END IF;

    DELETE FROM events
    WHERE community_id = NEW.community_id AND pubkey = NEW.pubkey AND kind = NEW.kind
      AND d_tag IS NOT DISTINCT FROM NEW.d_tag;
    RETURN NEW;
END
$$;

DROP INDEX CONCURRENTLY IF EXISTS events_by_id_hash;

DROP INDEX CONCURRENTLY IF EXISTS events_by_kind_time;

DROP INDEX CONCURRENTLY IF EXISTS events_by_author_time;

DROP INDEX CONCURRENTLY IF EXISTS events_by_channel_time;

DROP INDEX CONCURRENTLY IF EXISTS events_by_tag_values;

DROP INDEX CONCURRENTLY IF EXISTS events_search_content;
