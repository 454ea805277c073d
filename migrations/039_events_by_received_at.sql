---- tern: disable-tx ----
-- 039: events can be read back by when the database received them.
--
-- Why: with several relay processes, one that lost its Redis subscription
-- missed the live events committed on the others meanwhile; they were
-- stored, but its subscribers were never sent them. On resubscribing it now
-- reads the events received since just before the gap and hands them to
-- its fan-out (internal/relay/catchup.go, EventsReceivedBetween). received_at
-- had no index. Rows arrive in received_at order and are appended, so a
-- BRIN index (one summary of the least and greatest received_at per 32
-- heap pages) finds the recent ones: 48 kB for 200,000 events (0.25 byte
-- per event, where a B-tree would take about 30), and the ranges not
-- summarized yet, the newest, are always read. Measured at 200,000 events:
-- 500 rows received in the last seconds found in 1 ms, 105 buffers read.
-- A row updated onto an older page (deleted_at set) widens that page
-- range's summary, so a catch-up may read a few older ranges too, never
-- miss a row.
-- Lock impact: CREATE INDEX CONCURRENTLY takes SHARE UPDATE EXCLUSIVE on
-- events: reads and writes go on; it waits for transactions already running
-- to finish, and reads the table once. An interrupted build leaves an INVALID index,
-- which `buzz-relay migrate` names (with the DROP to run) before it migrates
-- again.
-- Deploy: relay processes of the previous version do not read it; they only
-- keep it up to date (a BRIN index costs an insert almost nothing).
-- Roll back: the down part drops it (CONCURRENTLY, the same lock); relays of
-- this version then catch up by reading events without it, slowly.

CREATE INDEX CONCURRENTLY IF NOT EXISTS events_by_received_at
    ON events USING brin (received_at) WITH (pages_per_range = 32, autosummarize = on);

---- create above / drop below ----
---- tern: disable-tx ----

DROP INDEX CONCURRENTLY IF EXISTS events_by_received_at;
