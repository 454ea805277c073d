-- name: EventInsert :execrows
-- Zero rows affected means the event was not stored: either it is already
-- here (duplicate), or its author deleted its id (events_deleted_id_refused),
-- or the replaceable-slot trigger kept a newer version or found its deletion.
INSERT INTO events (community_id, id, pubkey, created_at, kind, tags, content, sig, channel_id, d_tag, expires_at)
VALUES (
    @community_id::uuid, @id::bytea, @pubkey::bytea, to_timestamp(@created_at::bigint),
    @kind::int, @tags::jsonb, @content::text, @sig::bytea,
    sqlc.narg('channel_id')::uuid, sqlc.narg('d_tag')::text, to_timestamp(sqlc.narg('expires_at')::bigint)
)
ON CONFLICT DO NOTHING;

-- name: EventExists :one
SELECT EXISTS (
    SELECT FROM events WHERE community_id = @community_id::uuid AND id = @id::bytea
);

-- name: EventsDeleteByIDs :execrows
-- NIP-09: an author may delete only their own events, and a deletion request
-- cannot itself be deleted, nor a channel's account of who did what
-- (@kept_kinds in a channel: its moderation events). Without the list no
-- channel event is hidden, so a caller that forgets it hides too little,
-- never an account.
UPDATE events
SET deleted_at = coalesce(sqlc.narg('now')::timestamptz, now())
WHERE community_id = @community_id::uuid
  AND id = ANY(@ids::bytea[])
  AND pubkey = @author::bytea
  AND kind <> 5
  AND (channel_id IS NULL OR NOT kind = ANY(@kept_kinds::int[]))
  AND deleted_at IS NULL;

-- name: EventSlotLock :exec
-- Taken by an a-coordinate deletion before it hides the slot's versions, so
-- a version being inserted concurrently is either hidden or refused.
SELECT events_lock_slot(@community_id::uuid, @pubkey::bytea, @kind::int, sqlc.narg('d_tag')::text);

-- name: EventsDeleteByAddress :execrows
-- NIP-09 'a' coordinate: hides every version of the author's slot created at
-- or before the deletion; a newer version stays visible.
UPDATE events
SET deleted_at = coalesce(sqlc.narg('now')::timestamptz, now())
WHERE community_id = @community_id::uuid
  AND pubkey = @author::bytea
  AND kind = @kind::int
  AND d_tag IS NOT DISTINCT FROM sqlc.narg('d_tag')::text
  AND created_at <= to_timestamp(@until::bigint)
  AND deleted_at IS NULL;

-- name: EventsDeleteInChannel :execrows
-- NIP-29 9005: a channel admin hides events of that channel, whoever wrote
-- them, except kept_kinds (the channel's lists and moderation records, its
-- account of who did what, which no moderator may rewrite; see
-- EventsInChannelKeptFromModeration).
UPDATE events SET deleted_at = coalesce(sqlc.narg('now')::timestamptz, now())
WHERE community_id = @community_id::uuid AND channel_id = @channel_id::uuid
  AND id = ANY(@ids::bytea[]) AND deleted_at IS NULL
  AND kind <> ALL(@kept_kinds::int[]);

-- name: EventsInChannelKeptFromModeration :one
-- Whether a 9005 names a live event of the channel of kept_kinds, which
-- EventsDeleteInChannel never hides, so the request is refused rather than
-- half done.
SELECT EXISTS (
    SELECT FROM events
    WHERE community_id = @community_id::uuid AND channel_id = @channel_id::uuid
      AND id = ANY(@ids::bytea[]) AND deleted_at IS NULL
      AND kind = ANY(@kept_kinds::int[])
);

-- name: EventReactionTarget :one
-- The event a reaction names: stored in this community, not deleted and
-- not expired (NIP-40, by @now, the relay's clock, as a read judges it: no
-- read serves it, so it is as unknown as a purged one); reader_is_party
-- says whether a p tag names the reactor or the reactor wrote it (who may
-- see a p-gated kind).
SELECT created_at, channel_id, kind,
       (tag_index && ARRAY['p:' || @reader_hex::text] OR pubkey = decode(@reader_hex::text, 'hex'))::boolean AS reader_is_party
FROM events
WHERE community_id = @community_id::uuid AND id = @id::bytea AND deleted_at IS NULL
  AND (expires_at IS NULL OR expires_at > @now::timestamptz)
LIMIT 1;

-- name: EventSlotClear :one
-- Removes the stored versions of one slot before the relay stores its own
-- new version there, and returns the new version's created_at: the relay's
-- second now, or one second after the newest version removed when that is
-- later, so every version is strictly newer than the one it replaces and a
-- client applying the lowest-id tie rule, or holding every version it was
-- sent, keeps the newest. Never later than latest (the relay's future limit
-- for clients): under changes sustained faster than one a second the lists
-- stop there and share a second again, the stored one still the newest
-- because it replaces the others outright. The caller holds the slot lock
-- (EventSlotLock), so the versions it reads are the ones it replaces.
WITH cleared AS (
    DELETE FROM events
    WHERE community_id = @community_id::uuid
      AND pubkey = @pubkey::bytea
      AND kind = @kind::int
      AND d_tag IS NOT DISTINCT FROM sqlc.narg('d_tag')::text
    RETURNING created_at
)
SELECT greatest(@now::bigint,
                least(coalesce(max(extract(epoch FROM created_at))::bigint + 1, @now::bigint), @latest::bigint))::bigint AS created_at
FROM cleared;

-- name: EventChannelsByAuthorIDs :many
-- The author's own events among ids that a deletion could hide, with their
-- channels (NULL: community-global): a kind 5 is stored where its targets
-- are, so it tells no one outside a private channel which ids it deleted.
-- live says whether one is not deleted yet: an author who can no longer
-- write in the channel may delete only what is still there, and name
-- nothing else.
SELECT id, channel_id, kind, (deleted_at IS NULL)::boolean AS live FROM events
WHERE community_id = @community_id::uuid
  AND id = ANY(@ids::bytea[])
  AND pubkey = @author::bytea
  AND kind <> 5;

-- name: EventChannelsByAddress :many
-- The channels of the stored versions of the author's slot (the
-- coordinate's counterpart of EventChannelsByAuthorIDs); has_live counts
-- only the versions a deletion dated until would hide.
SELECT channel_id, bool_or(deleted_at IS NULL AND created_at <= to_timestamp(@until::bigint))::boolean AS has_live
FROM events
WHERE community_id = @community_id::uuid
  AND pubkey = @author::bytea
  AND kind = @kind::int
  AND d_tag IS NOT DISTINCT FROM sqlc.narg('d_tag')::text
GROUP BY channel_id;

-- name: EventWorkflowDefinition :one
-- The exact signed definition a run is pinned to, in the workflow's
-- channel, if it is still stored (not deleted); expired: its NIP-40
-- expiration passed by @now (the purge has not deleted it yet).
SELECT id, pubkey, content, tags,
       coalesce(expires_at <= coalesce(sqlc.narg('now')::timestamptz, now()), false)::boolean AS expired
FROM events
WHERE community_id = @community_id::uuid AND id = @id::bytea AND kind = 30620
  AND channel_id = @channel_id::uuid AND deleted_at IS NULL;

-- name: EventKeysReceivedBetween :many
-- The keys of the events of communities received in [since, until), oldest
-- first, for a relay process that missed the other processes' live traffic
-- (events_by_received_at): deleted and expired ones (NIP-40, by @now, the
-- relay's clock) are left out, as a REQ would. Keys only: the process
-- reads the events a batch at a time (EventsByKey), since a gap may hold
-- thousands of events of up to 256 KB.
SELECT community_id, created_at, id, received_at
FROM events
WHERE received_at >= @since::timestamptz AND received_at < @until::timestamptz
  AND community_id = ANY(@communities::uuid[])
  AND deleted_at IS NULL
  AND (expires_at IS NULL OR expires_at > @now::timestamptz)
ORDER BY received_at, created_at, id
LIMIT @max_rows::int;

-- name: EventsByKey :many
-- The events of the keys given (EventKeysReceivedBetween), in its order,
-- an id lookup each; one deleted or expired since (by @now, the relay's
-- clock) is left out.
SELECT e.community_id, e.id, e.pubkey, e.created_at, e.kind, e.tags, e.content, e.sig, e.channel_id, e.received_at
FROM (SELECT unnest(@communities::uuid[]) AS community_id, unnest(@created_ats::timestamptz[]) AS created_at,
             unnest(@ids::bytea[]) AS id) k
JOIN events e ON e.community_id = k.community_id AND e.created_at = k.created_at AND e.id = k.id
WHERE e.deleted_at IS NULL
  AND (e.expires_at IS NULL OR e.expires_at > @now::timestamptz)
ORDER BY e.received_at, e.created_at, e.id;

-- name: EventsHideExpired :exec
-- NIP-40, before EventsPurgeExpired in its transaction: locks the batch
-- that statement then deletes (the same @max_rows soonest expired rows; a
-- transaction's own locks do not make it skip them) and hides the
-- reactions and profiles among them, so that the triggers of hiding
-- (reactions_remove_hidden, users_forget_hidden_profile) take what those
-- events wrote, as a NIP-09 deletion does; a DELETE fires neither. Other
-- kinds have no such trigger and are not rewritten; the scan stops at the
-- batch, however many expired rows of other kinds wait behind it.
UPDATE events SET deleted_at = coalesce(sqlc.narg('now')::timestamptz, now())
FROM (
    SELECT e.community_id, e.created_at, e.id, e.kind, e.deleted_at FROM events e
    WHERE e.expires_at <= coalesce(sqlc.narg('now')::timestamptz, now())
      AND community_write_allowed(e.community_id)
    ORDER BY e.expires_at
    LIMIT @max_rows::int
    FOR UPDATE SKIP LOCKED
) due
WHERE events.community_id = due.community_id AND events.created_at = due.created_at AND events.id = due.id
  AND due.kind IN (0, 7) AND due.deleted_at IS NULL;

-- name: EventsPurgeExpired :execrows
-- NIP-40: deletes at most @max_rows events whose expiration has passed,
-- soonest expired first, through the partial index events_expiring. Reads
-- already hide them; this only frees their rows. A fenced or quiescing
-- community's rows are left to its deletion (community_write_allowed), and
-- rows another transaction holds are skipped, not waited for.
DELETE FROM events
WHERE (community_id, created_at, id) IN (
    SELECT e.community_id, e.created_at, e.id FROM events e
    WHERE e.expires_at <= coalesce(sqlc.narg('now')::timestamptz, now())
      AND community_write_allowed(e.community_id)
    ORDER BY e.expires_at
    LIMIT @max_rows::int
    FOR UPDATE SKIP LOCKED
);
