-- NIP-25 reactions: one active row per (target, reactor, emoji). The channel
-- comes from the target event, never from the client.

-- name: ReactionTarget :one
-- The event a reaction names: stored in this community and not deleted;
-- addressed_to_reader says whether a p tag names the reactor (p-gated kinds).
SELECT created_at, channel_id, kind, (tag_index && ARRAY['p:' || @reader_hex::text])::boolean AS addressed_to_reader
FROM events
WHERE community_id = @community_id::uuid AND id = @id::bytea AND deleted_at IS NULL
LIMIT 1;

-- name: ReactionUpsert :execrows
-- Zero rows: the reactor already has this reaction active on the target (the
-- caller rolls back). A removed reaction is brought back by the new event.
INSERT INTO reactions (community_id, event_created_at, event_id, pubkey, emoji, channel_id, reaction_event_id)
VALUES (@community_id::uuid, @event_created_at::timestamptz, @event_id::bytea, @pubkey::bytea,
        @emoji::text, sqlc.narg('channel_id')::uuid, @reaction_event_id::bytea)
ON CONFLICT (community_id, event_created_at, event_id, pubkey, emoji) DO UPDATE
SET created_at = now(),
    removed_at = NULL,
    reaction_event_id = coalesce(EXCLUDED.reaction_event_id, reactions.reaction_event_id)
WHERE reactions.removed_at IS NOT NULL;

-- name: ReactionsRemoveByEvents :execrows
-- NIP-09: a deletion by the reactor removes the reactions its e tags name.
UPDATE reactions
SET removed_at = coalesce(sqlc.narg('now')::timestamptz, now())
WHERE community_id = @community_id::uuid
  AND reaction_event_id = ANY(@reaction_event_ids::bytea[])
  AND pubkey = @author::bytea
  AND removed_at IS NULL;
