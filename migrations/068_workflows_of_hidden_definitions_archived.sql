-- 068: the workflows pinned to a definition hidden before 067 are archived.
--
-- Why: from 067 on, a kind 5 of the owner naming the pinned definition by
-- id, or a channel moderator's 9005 hiding it, archives the workflow in the
-- deletion's transaction. A definition hidden so before it stayed hidden
-- with its workflow active and enabled: every message, slot, webhook call
-- and command created a run that failed closed with invalid_definition (a
-- schedule one per slot, for good), as 067 says of the deleted ones it
-- fixed from then on. The archive is what the deletion does today (a
-- re-save activates the workflow again). A hidden event is never shown
-- again, so no such workflow could fire usefully.
-- Their runs waiting for an approval are left to the approval's timeout
-- (a decision is refused already: the definition is not stored for it).
-- Rows of a community being deleted are left to its deletion
-- (community_write_allowed).
-- Lock impact: ROW EXCLUSIVE on workflows (readers and other rows' writers
-- do not wait); the rows it archives are locked to its commit. It reads
-- the pinned workflows, one probe of events_by_id_hash each, and takes the
-- community's write fence shared only for the rows it archives. A lock it
-- waits for past 5 s fails the migration instead of queueing the
-- workflows' writers behind it; run it again.
-- Deploy: safe while relays run, with either version.
-- Roll back: nothing to undo (the down part changes nothing): an archived
-- workflow stays archived until its owner saves it again.

SET LOCAL lock_timeout = '5s';

UPDATE workflows w
SET status = 'archived', enabled = false, updated_at = now()
FROM events e
WHERE e.community_id = w.community_id AND e.id = w.definition_event_id
  AND e.deleted_at IS NOT NULL
  AND w.status <> 'archived'
  AND community_write_allowed(w.community_id);

---- create above / drop below ----

-- Nothing to undo (see Roll back above); tern needs a statement.
SELECT 1;
