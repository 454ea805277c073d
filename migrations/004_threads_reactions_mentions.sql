-- 004: side rows written in the same transaction as their event.
--
-- thread_metadata: NIP-10 reply trees inside channels; counters are updated
--   with relative increments so concurrent replies never lose a count.
-- reactions: NIP-25 reactions, one active row per (target, reactor, emoji);
--   the channel comes from the target event, never from the client.
-- event_mentions: one row per valid p tag, for "mentions of me" reads and
--   mention delivery.
-- Lock impact: new tables only.
-- Roll back: the down part drops them; the events stay.

CREATE TABLE thread_metadata (
    community_id      uuid        NOT NULL,
    event_created_at  timestamptz NOT NULL,
    event_id          bytea       NOT NULL CONSTRAINT thread_metadata_event_id_len CHECK (octet_length(event_id) = 32),
    channel_id        uuid        NOT NULL,
    parent_event_id   bytea       NULL,
    parent_created_at timestamptz NULL,
    root_event_id     bytea       NULL,
    root_created_at   timestamptz NULL,
    depth             integer     NOT NULL DEFAULT 0 CONSTRAINT thread_metadata_depth_nonnegative CHECK (depth >= 0),
    reply_count       integer     NOT NULL DEFAULT 0 CONSTRAINT thread_metadata_reply_count_nonnegative CHECK (reply_count >= 0),
    descendant_count  integer     NOT NULL DEFAULT 0 CONSTRAINT thread_metadata_descendant_count_nonnegative CHECK (descendant_count >= 0),
    last_reply_at     timestamptz NULL,
    PRIMARY KEY (community_id, event_created_at, event_id),
    FOREIGN KEY (community_id, channel_id) REFERENCES channels (community_id, id) ON DELETE CASCADE,
    CONSTRAINT thread_metadata_parent_iff_depth CHECK ((parent_event_id IS NULL) = (depth = 0))
);

CREATE INDEX thread_metadata_by_event ON thread_metadata (community_id, event_id);
CREATE INDEX thread_metadata_by_parent ON thread_metadata (community_id, parent_event_id) WHERE parent_event_id IS NOT NULL;
CREATE INDEX thread_metadata_by_root ON thread_metadata (community_id, root_event_id) WHERE root_event_id IS NOT NULL;
CREATE INDEX thread_metadata_by_channel ON thread_metadata (community_id, channel_id, depth, event_created_at);

CREATE TABLE reactions (
    community_id      uuid        NOT NULL,
    event_created_at  timestamptz NOT NULL,
    event_id          bytea       NOT NULL CONSTRAINT reactions_event_id_len CHECK (octet_length(event_id) = 32),
    pubkey            bytea       NOT NULL CONSTRAINT reactions_pubkey_len CHECK (octet_length(pubkey) = 32),
    emoji             varchar(64) NOT NULL,
    channel_id        uuid        NULL,
    reaction_event_id bytea       NULL,
    created_at        timestamptz NOT NULL DEFAULT now(),
    removed_at        timestamptz NULL,
    PRIMARY KEY (community_id, event_created_at, event_id, pubkey, emoji)
);

CREATE UNIQUE INDEX reactions_by_reaction_event ON reactions (community_id, reaction_event_id) WHERE reaction_event_id IS NOT NULL;
CREATE INDEX reactions_by_target ON reactions (community_id, event_id) WHERE removed_at IS NULL;

CREATE TABLE event_mentions (
    community_id     uuid        NOT NULL,
    pubkey_hex       varchar(64) NOT NULL CONSTRAINT event_mentions_pubkey_hex CHECK (pubkey_hex ~ '^[0-9a-f]{64}$'),
    event_id         bytea       NOT NULL,
    event_created_at timestamptz NOT NULL,
    channel_id       uuid        NULL,
    event_kind       integer     NOT NULL,
    PRIMARY KEY (community_id, pubkey_hex, event_id)
);

CREATE INDEX event_mentions_recent ON event_mentions (community_id, pubkey_hex, event_created_at DESC);

---- create above / drop below ----

DROP TABLE event_mentions;
DROP TABLE reactions;
DROP TABLE thread_metadata;
