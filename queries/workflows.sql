-- Workflow definitions materialized from kind 30620 events.

-- name: WorkflowGet :one
-- definition_expired: the pinned definition's NIP-40 expiration passed by
-- @now; such a workflow fires nothing.
SELECT owner_pubkey, channel_id, status, enabled, definition_event_id,
       coalesce(definition ->> '_webhook_secret', '')::text AS webhook_secret,
       coalesce(definition -> 'trigger' ->> 'on', '')::text AS trigger_on,
       coalesce(definition_expires_at <= coalesce(sqlc.narg('now')::timestamptz, now()), false)::boolean AS definition_expired
FROM workflows
WHERE community_id = @community_id::uuid AND id = @id::uuid;

-- name: WorkflowUpsert :one
-- Materializes a kind 30620 definition. A re-save updates the row only when
-- the same owner saves it for the same channel: the WHERE makes a racing
-- save by someone else return no row (refused), whatever the earlier read
-- saw. A re-save enables the workflow again (the signer is a channel member
-- at save time) and pins the new event, with the NIP-40 expiration its row
-- was stored with (NULL: none), read back so that the two cannot differ.
INSERT INTO workflows (community_id, id, name, owner_pubkey, channel_id, definition, definition_hash,
                       definition_event_id, definition_expires_at, status, enabled, created_at, updated_at)
VALUES (@community_id::uuid, @id::uuid, @name::text, @owner_pubkey::bytea, sqlc.narg('channel_id')::uuid,
        @definition::jsonb, @definition_hash::bytea, @definition_event_id::bytea,
        (SELECT e.expires_at FROM events e WHERE e.community_id = @community_id::uuid AND e.id = @definition_event_id::bytea),
        'active', true,
        coalesce(sqlc.narg('now')::timestamptz, now()), coalesce(sqlc.narg('now')::timestamptz, now()))
ON CONFLICT (community_id, id) DO UPDATE
SET name = EXCLUDED.name,
    definition = EXCLUDED.definition,
    definition_hash = EXCLUDED.definition_hash,
    definition_event_id = EXCLUDED.definition_event_id,
    definition_expires_at = EXCLUDED.definition_expires_at,
    status = 'active',
    enabled = true,
    updated_at = EXCLUDED.updated_at
WHERE workflows.owner_pubkey = EXCLUDED.owner_pubkey
  AND workflows.channel_id IS NOT DISTINCT FROM EXCLUDED.channel_id
RETURNING id;

-- name: WorkflowArchive :execrows
-- A kind 5 deletion of the definition's coordinate by its owner: the
-- workflow stops firing. The row stays for its run history.
UPDATE workflows
SET status = 'archived', enabled = false, updated_at = coalesce(sqlc.narg('now')::timestamptz, now())
WHERE community_id = @community_id::uuid AND id = @id::uuid AND owner_pubkey = @owner_pubkey::bytea
  AND status <> 'archived';

-- name: WorkflowsArchiveByDefinitionEvent :many
-- A kind 5 of the owner naming a workflow's pinned definition event by id
-- (an e tag), or a channel moderator's 9005 hiding it, deleted the version
-- the workflow is pinned to: the workflow stops firing, as when its
-- coordinate is deleted. Run after the deletion, in its transaction, with
-- the deletion's own rules: a kind 5 passes its @author (only their events
-- count), a 9005 its @moderated_channel (only that channel's), the other
-- NULL. Hidden alone does not do: an event hidden earlier (a deletion by id
-- stored before these side rows existed left its workflow active) would
-- let anyone's kind 5 naming it, or a moderator's of any channel, archive
-- the workflow. The ids are looked up in events first (one hash probe
-- each), so a deletion of messages reads no workflow.
UPDATE workflows w
SET status = 'archived', enabled = false, updated_at = coalesce(sqlc.narg('now')::timestamptz, now())
FROM events e
WHERE e.community_id = @community_id::uuid AND e.id = ANY(@event_ids::bytea[])
  AND e.kind = 30620 AND e.deleted_at IS NOT NULL
  AND (e.pubkey = sqlc.narg('author')::bytea OR e.channel_id = sqlc.narg('moderated_channel')::uuid)
  AND w.community_id = e.community_id AND w.definition_event_id = e.id
  AND w.status <> 'archived'
RETURNING w.id;

-- name: WorkflowsTriggerable :many
-- The workflows an event in a channel may trigger: active, enabled, and
-- pinned to a signed definition event that has not expired (a row without
-- one fires nothing until its owner saves it again). Only the definition's trigger and
-- enabled flag, all that decides whether one fires: every message, reaction
-- and diff of the channel runs this in its write transaction, and whole
-- definitions (up to an event's size each, 20 in a channel) were sent and
-- decoded for every one of them.
SELECT id, definition_event_id,
       (definition -> 'trigger')::jsonb AS trigger,
       coalesce(definition -> 'enabled' = 'true'::jsonb, false)::boolean AS definition_enabled
FROM workflows
WHERE community_id = @community_id::uuid AND channel_id = @channel_id::uuid
  AND status = 'active' AND enabled AND definition_event_id IS NOT NULL
  AND (definition_expires_at IS NULL OR definition_expires_at > coalesce(sqlc.narg('now')::timestamptz, now()))
ORDER BY id;

-- name: WorkflowsActiveInChannel :one
-- The channel's workflows that fire, other than the one being saved: what
-- the per-channel bound counts (an expired definition fires nothing, so it
-- takes no place). Run it after ChannelLockForWorkflows.
SELECT count(*)::int
FROM workflows
WHERE community_id = @community_id::uuid AND channel_id = @channel_id::uuid
  AND status = 'active' AND enabled AND id <> @except_id::uuid
  AND (definition_expires_at IS NULL OR definition_expires_at > coalesce(sqlc.narg('now')::timestamptz, now()));

-- name: WorkflowsScheduled :many
-- Every workflow the scheduler fires, in every community: active, enabled,
-- pinned to a signed definition, with a schedule trigger. updated_at is when
-- the definition was last saved: no slot before it fires. Only the
-- definition's trigger and enabled flag are read: the query runs every second
-- on every relay process, and whole definitions (up to the size of an event,
-- each) were sent for every scheduled workflow at every tick. The partial
-- index workflows_scheduled (migration 052) holds exactly the rows of the
-- first WHERE line, so the workflows of other triggers, which any member may
-- save without bound across channels, are never read; keep the two alike.
-- now is the database's time (or the stubbed one), which the tick's slots
-- are due by, as updated_at and every run's times are: a relay whose clock
-- ran ahead fired slots early, before a re-save or a disabling the owner
-- made in time.
SELECT community_id, id, channel_id, definition_event_id, updated_at,
       (definition -> 'trigger')::jsonb AS trigger,
       coalesce(definition -> 'enabled' = 'true'::jsonb, false)::boolean AS definition_enabled,
       coalesce(sqlc.narg('now')::timestamptz, now())::timestamptz AS now
FROM workflows
WHERE enabled AND status = 'active' AND definition_event_id IS NOT NULL
  AND definition -> 'trigger' ->> 'on' = 'schedule'
  -- Nor one whose definition expired (NIP-40): checked on the index's rows,
  -- since now is no part of an index predicate.
  AND (definition_expires_at IS NULL OR definition_expires_at > coalesce(sqlc.narg('now')::timestamptz, now()))
  -- A community being deleted (its writes are refused) or archived (not
  -- served) fires nothing.
  AND EXISTS (SELECT FROM communities c WHERE c.id = workflows.community_id
              AND c.deletion_state = 'active' AND c.archived_at IS NULL)
  -- Nor does one of a deleted or archived channel: every run would fail,
  -- one per slot for good, in a history nobody may read any more.
  AND EXISTS (SELECT FROM channels ch WHERE ch.community_id = workflows.community_id
              AND ch.id = workflows.channel_id AND ch.deleted_at IS NULL AND ch.archived_at IS NULL)
ORDER BY community_id, id;

-- name: WorkflowLockForRuns :execrows
-- Serializes run creation per workflow until the caller's transaction
-- ends, so that the unfinished-run count in WorkflowRunCreate cannot be
-- raced past the bound. FOR NO KEY UPDATE does not conflict with the
-- FOR KEY SHARE that foreign keys to the row take (runs, approvals and
-- slot claims inserted meanwhile), nor with readers. Zero rows: the
-- workflow is gone.
SELECT 1 FROM workflows
WHERE community_id = @community_id::uuid AND id = @id::uuid
FOR NO KEY UPDATE;

-- name: WorkflowLockForApprovalRequest :one
-- A request_approval step reads its workflow FOR SHARE, held to the end of
-- the step's transaction: an archive, a re-save or a disable (each an
-- UPDATE of the row) either committed before, and the step sees it and
-- fails the run, or waits until the step committed and then withdraws the
-- approval it stored. (A decision locks its approval instead:
-- WorkflowApprovalLockForDecision.)
SELECT status, enabled, definition_event_id
FROM workflows
WHERE community_id = @community_id::uuid AND id = @id::uuid
FOR SHARE;
