---- tern: disable-tx ----
-- 006: idx_channels_id_live, the channel-id lookup index.
--
-- Why: two lookups deliberately carry no community_id predicate: they report
-- each channel's true owning community (the tracer's non-interference
-- check depends on that). Every other index on channels leads with
-- community_id, so without this one both lookups scan the table.
--   INCLUDE (community_id): both lookups select exactly (id, community_id), so
--     the index covers them (index-only scans).
--   WHERE deleted_at IS NULL: matches both predicates; soft-deleted history
--     stays out of the index.
--   Not UNIQUE: a channel id may exist in two communities; a unique index
--     would encode a false rule and could fail to build.
-- Lock impact: built CONCURRENTLY (no write lock on channels), so this
-- migration runs outside a transaction; IF NOT EXISTS makes a re-run after an
-- interrupted build, or an index an operator pre-built, a no-op. An
-- interrupted CONCURRENTLY build can leave an INVALID index: migrate then
-- refuses to start, naming it; drop it and re-run `buzz-relay migrate`.
-- Roll back: the down part drops it, also concurrently.

CREATE INDEX CONCURRENTLY IF NOT EXISTS idx_channels_id_live
    ON channels (id) INCLUDE (community_id)
    WHERE deleted_at IS NULL;

---- create above / drop below ----
---- tern: disable-tx ----

DROP INDEX CONCURRENTLY IF EXISTS idx_channels_id_live;
