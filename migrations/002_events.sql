-- 002: the event log.
--
-- Why: every accepted, non-ephemeral Nostr event is one row here, scoped to its
-- community (the same signed event may be stored once per community). Reads
-- always lead with community_id, so every index does too.
--
-- Two rules live in the database so they hold whichever process writes:
--   * kinds 20000-29999 (ephemeral) and 22242 (NIP-42 AUTH) are never stored;
--   * replaceable (0, 3, 10000-19999) and addressable (30000-39999, per d tag)
--     events keep only the newest version per slot, ties going to the lowest id
--     (trigger events_keep_newest_version).
--
-- Partitioning by month (to drop old months cheaply) is not done yet: the primary key already
-- includes created_at so that a later migration can partition without changing
-- the key that ON CONFLICT uses.
-- Lock impact: new table only.
-- Roll back: the down part drops the table and its functions (destroys events).

-- Single-letter tags as 'name:value' strings, the shape '#x' filters query with
-- the && operator. Values over 1024 bytes are left out: GIN entries have a size
-- limit, and the filter parser refuses such values.
CREATE FUNCTION events_tag_index(tags jsonb) RETURNS text[]
    LANGUAGE sql IMMUTABLE PARALLEL SAFE STRICT
AS $$
    SELECT coalesce(array_agg(DISTINCT (tag->>0) || ':' || (tag->>1)), '{}')
    FROM jsonb_array_elements(tags) AS tag
    WHERE jsonb_typeof(tag) = 'array'
      AND (tag->>0) ~ '^[A-Za-z]$'
      AND octet_length(tag->>1) <= 1024
$$;

CREATE TABLE events (
    community_id uuid        NOT NULL REFERENCES communities (id),
    id           bytea       NOT NULL CONSTRAINT events_id_len CHECK (octet_length(id) = 32),
    pubkey       bytea       NOT NULL CONSTRAINT events_pubkey_len CHECK (octet_length(pubkey) = 32),
    created_at   timestamptz NOT NULL,
    kind         integer     NOT NULL CONSTRAINT events_kind_range CHECK (kind BETWEEN 0 AND 65535),
    tags         jsonb       NOT NULL CONSTRAINT events_tags_array CHECK (jsonb_typeof(tags) = 'array'),
    content      text        NOT NULL,
    sig          bytea       NOT NULL CONSTRAINT events_sig_len CHECK (octet_length(sig) = 64),
    received_at  timestamptz NOT NULL DEFAULT now(),
    -- NULL: a channel-less (community-global) event.
    channel_id   uuid        NULL,
    -- NIP-09 deletion is soft: the row stays for audit, reads hide it.
    deleted_at   timestamptz NULL,
    -- NIP-01 addressable identifier ('' when the event has no d tag); NULL for every other kind.
    d_tag        text        NULL,
    tag_index    text[]      NOT NULL GENERATED ALWAYS AS (events_tag_index(tags)) STORED,
    PRIMARY KEY (community_id, created_at, id),
    CONSTRAINT events_never_ephemeral CHECK (kind NOT BETWEEN 20000 AND 29999),
    CONSTRAINT events_d_tag_iff_addressable CHECK ((d_tag IS NOT NULL) = (kind BETWEEN 30000 AND 39999))
);

COMMENT ON TABLE events IS 'Accepted Nostr events, one row per (community, event). Ephemeral kinds never land here.';

CREATE INDEX events_by_id ON events (community_id, id);
CREATE INDEX events_by_kind ON events (community_id, kind, created_at DESC, id DESC);
CREATE INDEX events_by_author_kind ON events (community_id, pubkey, kind, created_at DESC, id DESC);
CREATE INDEX events_by_channel ON events (community_id, channel_id, created_at DESC, id DESC);
CREATE INDEX events_by_address ON events (community_id, pubkey, kind, d_tag, created_at DESC, id DESC)
    WHERE d_tag IS NOT NULL;
CREATE INDEX events_by_tag ON events USING gin (tag_index);

-- Serializes every writer of one replaceable/addressable slot (the
-- coordinate kind:pubkey:d) until the end of its transaction: new versions
-- and NIP-09 a-coordinate deletions alike.
CREATE FUNCTION events_lock_slot(community_id uuid, pubkey bytea, kind integer, d_tag text) RETURNS void
    LANGUAGE sql VOLATILE
AS $$
    SELECT pg_advisory_xact_lock(hashtextextended(
        'events-slot:' || community_id::text || ':' || encode(pubkey, 'hex') || ':' || kind::text || ':' || coalesce(d_tag, ''), 0))
$$;

-- Keeps one version per replaceable/addressable slot. Under the slot lock
-- two transactions cannot both see "no newer head" and both insert.
-- Returning NULL skips the insert; the caller sees zero rows and reports the
-- event as superseded (or a duplicate, when its id is already stored).
-- A version is also skipped when its author already deleted the coordinate
-- at or after its created_at (NIP-09 "a" tag): a late-arriving old version
-- must not resurrect a deleted address.
CREATE FUNCTION events_keep_newest_version() RETURNS trigger
    LANGUAGE plpgsql
AS $$
DECLARE
    head_created_at timestamptz;
    head_id bytea;
BEGIN
    PERFORM events_lock_slot(NEW.community_id, NEW.pubkey, NEW.kind, NEW.d_tag);

    IF EXISTS (
        SELECT FROM events
        WHERE community_id = NEW.community_id AND pubkey = NEW.pubkey AND kind = 5
          AND tag_index && ARRAY['a:' || NEW.kind::text || ':' || encode(NEW.pubkey, 'hex') || ':' || coalesce(NEW.d_tag, '')]
          AND created_at >= NEW.created_at
          AND deleted_at IS NULL
    ) THEN
        RETURN NULL;
    END IF;

    IF NEW.d_tag IS NULL THEN
        SELECT created_at, id INTO head_created_at, head_id
        FROM events
        WHERE community_id = NEW.community_id AND pubkey = NEW.pubkey AND kind = NEW.kind
        ORDER BY created_at DESC, id ASC
        LIMIT 1;
    ELSE
        SELECT created_at, id INTO head_created_at, head_id
        FROM events
        WHERE community_id = NEW.community_id AND pubkey = NEW.pubkey AND kind = NEW.kind AND d_tag = NEW.d_tag
        ORDER BY created_at DESC, id ASC
        LIMIT 1;
    END IF;

    IF head_id IS NOT NULL
       AND (head_created_at > NEW.created_at OR (head_created_at = NEW.created_at AND head_id <= NEW.id)) THEN
        RETURN NULL;
    END IF;

    DELETE FROM events
    WHERE community_id = NEW.community_id AND pubkey = NEW.pubkey AND kind = NEW.kind
      AND d_tag IS NOT DISTINCT FROM NEW.d_tag;
    RETURN NEW;
END
$$;

CREATE TRIGGER events_keep_newest_version
    BEFORE INSERT ON events
    FOR EACH ROW
    WHEN (NEW.kind IN (0, 3) OR NEW.kind BETWEEN 10000 AND 19999 OR NEW.kind BETWEEN 30000 AND 39999)
    EXECUTE FUNCTION events_keep_newest_version();

---- create above / drop below ----

DROP TABLE events;
DROP FUNCTION events_keep_newest_version();
DROP FUNCTION events_lock_slot(uuid, bytea, integer, text);
DROP FUNCTION events_tag_index(jsonb);
