-- name: EventMentionsInsert :execrows
-- One row per mentioned pubkey (the caller passes distinct lowercase 64-hex
-- values, at most 5,000 per statement), in the event's transaction.
-- Every p tag gets a row, readable by the mentioned pubkey or not (the
-- event's channel is kept): a read of a pubkey's mentions must filter them
-- by the channels it may read at read time, as REQ does.
INSERT INTO event_mentions (community_id, pubkey_hex, event_id, event_created_at, channel_id, event_kind)
SELECT @community_id::uuid, p.pubkey_hex, @event_id::bytea, to_timestamp(@event_created_at::bigint),
       sqlc.narg('channel_id')::uuid, @event_kind::int
FROM unnest(@pubkeys::text[]) AS p (pubkey_hex)
ON CONFLICT DO NOTHING;
