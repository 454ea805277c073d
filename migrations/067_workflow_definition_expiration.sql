-- 067: a workflow stops firing once its definition event expires (NIP-40).
--
-- Why: a kind 30620 definition may carry an expiration tag. The event
-- stopped being served when it passed, and the purge deleted its row, but
-- the workflows row pinned to it stayed active and enabled: messages,
-- schedule slots, webhook calls and the manual command kept creating runs,
-- first executing the expired definition, then (once purged) failing every
-- one with invalid_definition, forever: a schedule recorded a failed run
-- at every slot. The row now keeps its definition's expiration; every
-- trigger, the scheduler, the webhook and the per-channel bound compare it
-- with now, so an expired workflow fires nothing and no longer counts
-- against its channel's bound. A re-save pins a new event and sets the
-- column from it (NULL without an expiration tag).
-- Backfill: rows pinned to a stored event take its expires_at. Rows pinned
-- to an event no longer stored at all were purged after it expired (a
-- replacement re-pins the row, a NIP-09 deletion only marks the event):
-- every run of theirs already failed closed, so they expire now. Rows of a
-- community being deleted are left alone (its fence refuses writes; its
-- deletion removes them).
-- Lock impact: ADD COLUMN without a default changes the catalog only (no
-- rewrite) but takes ACCESS EXCLUSIVE on workflows, waiting at most
-- lock_timeout behind running transactions, then failing (run it again).
-- The lock is held to the end of the migration's one transaction, so
-- through the backfill too: every message, reaction and diff in a channel
-- (which reads workflows in its write transaction), the scheduler and the
-- webhooks wait for it. Measured (2 shared cores): 13 s for 200,000
-- workflows in 2,000 communities, 20,000 of them expiring, beside 2.2
-- million events; plan a quiet moment on a large database. The backfill
-- also takes each updated row's community write fence shared to its end
-- (one lock table entry per community: some ten thousand communities with
-- expiring definitions would fill the lock table, as 062 found).
-- Deploy: relays of the previous version write no expiration (an expiring
-- definition they store fires as before until re-saved); migrate first.
-- Roll back: the down part drops the column; expired workflows fire again.

SET LOCAL lock_timeout = '5s';

ALTER TABLE workflows ADD COLUMN definition_expires_at timestamptz;

COMMENT ON COLUMN workflows.definition_expires_at IS 'NIP-40 expiration of the pinned definition event; the workflow fires nothing from then on.';

UPDATE workflows w
SET definition_expires_at = e.expires_at
FROM events e
WHERE e.community_id = w.community_id AND e.id = w.definition_event_id
  AND e.expires_at IS NOT NULL
  AND community_write_allowed(w.community_id);

UPDATE workflows w
SET definition_expires_at = now()
WHERE w.definition_event_id IS NOT NULL AND w.definition_expires_at IS NULL
  AND NOT EXISTS (SELECT FROM events e WHERE e.community_id = w.community_id AND e.id = w.definition_event_id)
  AND community_write_allowed(w.community_id);

---- create above / drop below ----

SET LOCAL lock_timeout = '5s';

ALTER TABLE workflows DROP COLUMN IF EXISTS definition_expires_at;

