-- 023: a hidden deletion still keeps its address deleted.
--
-- Why: events_keep_newest_version refuses an older version of an address
-- (kind:pubkey:d) its author deleted with a NIP-09 "a" tag, but it looked
-- only at deletions not themselves hidden (deleted_at IS NULL). NIP-09
-- cannot hide a deletion, so that test mattered in one case only: a channel
-- moderator's 9005 hiding a member's kind 5 (kind 5 is not kept from
-- moderation; its text may need hiding). Hiding it lifted the protection,
-- and a client re-syncing a cached older version brought the deleted
-- content back. Moderation hides the deletion event from view; what it
-- deleted stays deleted. The slot's head lookup below already counted
-- hidden versions.
-- Lock impact: CREATE OR REPLACE FUNCTION locks only the function; events
-- is not locked, scanned or rewritten. Rows are unchanged.
-- Roll back: the down part restores the deleted_at test.

CREATE OR REPLACE FUNCTION events_keep_newest_version() RETURNS trigger
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

---- create above / drop below ----

CREATE OR REPLACE FUNCTION events_keep_newest_version() RETURNS trigger
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
