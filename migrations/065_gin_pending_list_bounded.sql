-- 065: the search and tag indexes keep a pending list of at most 256 kB,
-- not the server's default 4 MB.
--
-- Why: a GIN index with fastupdate (the default) appends each insert's
-- entries to a pending list and merges the list into the index when it
-- outgrows gin_pending_list_limit, in whichever statement crosses it, or
-- when (auto)vacuum runs. Two costs grow with the list: the insert that
-- crosses the limit merges all of it before its own statement ends, and
-- every search or tag filter that reads the index scans the whole list
-- (each pending entry checked against the query) on top of the index.
-- Measured on a relay's cluster under 16 publishers (ms, per
-- EventInsertBatch statement of a group; buffers per stored row):
--   limit 4 MB    longest insert 147-207   32.1-32.4 buffers/row
--   limit 1 MB    longest insert 79        34.3
--   limit 512 kB  longest insert 54-69     34.0-34.3
--   limit 256 kB  longest insert 34        35.1
--   fastupdate off (no list at all): 140 buffers/row and a third fewer
--   events per second, so the list stays, only shorter.
-- A group writer's insert that merges the list holds every event of its
-- group (and the groups behind it) until the merge ends. A search for a
-- rare word with 400 pending pages (3.2 MB, right after a burst) read 457
-- index buffers instead of 61 with the list merged. With 256 kB a merge
-- costs about a sixteenth of the longest stall and a read scans at most 32
-- pending pages, for about a tenth more buffer hits per insert.
-- TestGINPendingListsStayShort holds the bound.
-- Lock impact: ALTER INDEX ... SET takes ACCESS EXCLUSIVE on the index
-- alone (not on events) and rewrites nothing, so it holds it for an
-- instant. Every statement on events plans with all of the table's
-- indexes locked, so the ALTER first waits for the transactions on events
-- already running, and the statements on events that arrive meanwhile
-- (reads and writes) queue behind it: lock_timeout bounds that to 2 s,
-- after which the migration fails, changes nothing, and can be run again.
-- A pending list longer than the new limit is merged by the next insert
-- or vacuum.
-- Roll back: the down part resets both indexes to the server's
-- gin_pending_list_limit.

SET LOCAL lock_timeout = '2s';

ALTER INDEX events_search_by_community SET (gin_pending_list_limit = 256);
ALTER INDEX events_by_tag_in_community SET (gin_pending_list_limit = 256);

---- create above / drop below ----

SET LOCAL lock_timeout = '2s';

ALTER INDEX events_search_by_community RESET (gin_pending_list_limit);
ALTER INDEX events_by_tag_in_community RESET (gin_pending_list_limit);
