---- tern: disable-tx ----
-- 037: the outbox poll finds a listener's pending rows by community, not in
-- one next_attempt_at order across communities.
--
-- Why: the poll's claim (queries/templates/outbox_claim.sql.tmpl) took a
-- listener's due rows first in, first out, whatever their community: a
-- flood of 1,000 mentions to one listener in one community delayed another
-- community's mention to it by 5.6-6.1 s, growing with the flood. The claim
-- now shares a listener's slots among the communities its due rows come
-- from. It walks operator_listener_outbox_pending_by_community: one descent
-- per (listener, community) with pending rows finds that community's
-- earliest due row, and the rows it takes are read from the front of their
-- community's range, so a claim reads about the rows it takes plus two
-- index entries per community, whatever one community's backlog.
-- operator_listener_outbox_due (next_attempt_at order across listeners and
-- communities) is read by nothing else, so it is dropped: one index fewer
-- to write per pending row.
-- Lock impact: CREATE INDEX CONCURRENTLY and DROP INDEX CONCURRENTLY take
-- SHARE UPDATE EXCLUSIVE on operator_listener_outbox: reads and writes go
-- on; each waits for transactions already running to finish. The table
-- holds at most 15 minutes of undelivered rows, so the build is short. An
-- interrupted build leaves an INVALID index, which `buzz-relay migrate`
-- names (with the DROP to run) before it migrates again.
-- Deploy: relay processes of the previous version still running after this
-- migration have no operator_listener_outbox_due and sort every due row of
-- their listeners on each poll; run it once they are gone, or expect slower
-- polls while they drain (the outbox is usually near empty).
-- Roll back: the down part builds operator_listener_outbox_due again and
-- drops the new index (CONCURRENTLY, the same locks). Migrate down before
-- starting the previous relay version.

CREATE INDEX CONCURRENTLY IF NOT EXISTS operator_listener_outbox_pending_by_community
    ON operator_listener_outbox (listener_pubkey, community_id, next_attempt_at, created_at, id) WHERE state = 'pending';
DROP INDEX CONCURRENTLY IF EXISTS operator_listener_outbox_due;

---- create above / drop below ----
---- tern: disable-tx ----

CREATE INDEX CONCURRENTLY IF NOT EXISTS operator_listener_outbox_due
    ON operator_listener_outbox (next_attempt_at, created_at, id) WHERE state = 'pending';
DROP INDEX CONCURRENTLY IF EXISTS operator_listener_outbox_pending_by_community;
