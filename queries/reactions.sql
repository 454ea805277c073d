-- NIP-25 reactions: one active row per (target, reactor, emoji). The channel
-- comes from the target event, never from the client.

-- name: ReactionUpsert :execrows
-- Zero rows: the reactor already has this reaction active on the target (the
-- caller rolls back). A removed reaction is brought back by the new event.
INSERT INTO reactions (community_id, event_created_at, event_id, pubkey, emoji, channel_id, reaction_event_id)
VALUES (@community_id::uuid, @event_created_at::timestamptz, @event_id::bytea, @pubkey::bytea,
        @emoji::text, sqlc.narg('channel_id')::uuid, @reaction_event_id::bytea)
ON CONFLICT (community_id, event_created_at, event_id, pubkey, emoji) DO UPDATE
SET created_at = coalesce(sqlc.narg('now')::timestamptz, now()),
    removed_at = NULL,
    reaction_event_id = coalesce(EXCLUDED.reaction_event_id, reactions.reaction_event_id)
WHERE reactions.removed_at IS NOT NULL;

-- name: ReactionActiveEventID :one
-- The event of the reactor's active reaction with this emoji on the target
-- (NULL for a row written before reactions kept their event).
SELECT reaction_event_id FROM reactions
WHERE community_id = @community_id::uuid AND event_created_at = @event_created_at::timestamptz
  AND event_id = @event_id::bytea AND pubkey = @pubkey::bytea AND emoji = @emoji::text
  AND removed_at IS NULL;

-- A hidden reaction event (NIP-09 by its author, or a moderator's 9005)
-- takes its row with it: the trigger reactions_remove_hidden (migration 025)
-- removes it in the statement that hides the event.
