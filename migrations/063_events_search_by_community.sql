---- tern: disable-tx ----
-- 063: the search and tag indexes lead with the community.
--
-- Why: events_search indexed search_tsv alone, so a search found the
-- matching rows of every community in the index and read each from the
-- heap to check its community_id. A member of one community searching a
-- word that only other communities' events hold (private channels
-- included) read all of those rows: 15,997 rows and 1,868 buffers, 22 ms,
-- against 0 rows and 0.45 ms for a word nobody wrote
-- (TestSearchReadsNoOtherCommunitysRows). Its time told whether, and
-- roughly how often, other communities wrote the word, and its cost grew
-- with their content. Indexed by (community_id, search_tsv), the index
-- itself intersects the community with the word: the same search reads 11
-- index buffers and no row of another community. Tag filters (#t, #p, #e
-- ...) read events_by_tag (tag_index) the same way and get the same
-- treatment (TestTagFilterReadsNoOtherCommunitysRows).
-- btree_gin gives uuid a GIN operator class; it ships with PostgreSQL's
-- contrib modules and is a trusted extension (PostgreSQL 13 and later), so
-- the database owner may create it without superuser.
-- Lock impact: CREATE EXTENSION takes no lock on events. CREATE and DROP
-- INDEX CONCURRENTLY take SHARE UPDATE EXCLUSIVE on events: reads and
-- writes go on; each waits for the transactions already running to
-- finish. The build reads the whole table: schedule it off-peak on a large
-- one. An interrupted build leaves an INVALID index, which
-- `buzz-relay migrate` names (with the DROP to run) before it migrates
-- again. Every statement is idempotent.
-- Roll back: the down part builds events_search and events_by_tag again,
-- drops the new indexes, then the extension, so the schema is 062's
-- again. An extension that was there before 063 (the up part keeps it)
-- is dropped too, and only by its owner or a superuser: for anyone else
-- the down stops at that last statement, after the indexes are back, and
-- every rerun stops there too; run it as the extension's owner, or drop
-- that statement and leave the extension.
-- Deploy note: relays of the previous version search through the new
-- index as well (same predicates); no order is needed.

CREATE EXTENSION IF NOT EXISTS btree_gin;

CREATE INDEX CONCURRENTLY IF NOT EXISTS events_search_by_community
    ON events USING gin (community_id, search_tsv);

DROP INDEX CONCURRENTLY IF EXISTS events_search;

CREATE INDEX CONCURRENTLY IF NOT EXISTS events_by_tag_in_community
    ON events USING gin (community_id, tag_index);

DROP INDEX CONCURRENTLY IF EXISTS events_by_tag;

---- create above / drop below ----
---- tern: disable-tx ----

CREATE INDEX CONCURRENTLY IF NOT EXISTS events_by_tag ON events USING gin (tag_index);

DROP INDEX CONCURRENTLY IF EXISTS events_by_tag_in_community;

CREATE INDEX CONCURRENTLY IF NOT EXISTS events_search ON events USING gin (search_tsv);

DROP INDEX CONCURRENTLY IF EXISTS events_search_by_community;

DROP EXTENSION IF EXISTS btree_gin;
