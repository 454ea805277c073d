-- 066: an expired version no longer keeps an older one out of its slot.
--
-- Why: events_keep_newest_version keeps one version per replaceable or
-- addressable slot and skips a version older than the slot's head. It
-- looked at the head whether or not it had expired (NIP-40). Every read
-- treats an expired event as gone the second it expires, but its row stays
-- until the purge deletes it (about once a minute): in between, an older
-- version arriving was answered "duplicate: ... a newer version of its
-- address is already stored" and dropped, while a REQ returned nothing for
-- the slot, and the same event sent again after the purge was stored. The
-- answer depended on when the purge last ran. Now a head whose expires_at
-- has passed is absent here too: the older version is stored and the
-- expired row deleted with the slot's other versions, as it is after the
-- purge. Expired is judged by the database's now(), the clock the purge
-- deletes by and every write's on the wall clock; a relay process reads by
-- its own (docs/storage.md), so at the very second of expiry the two may
-- differ by the hosts' clock skew.
-- A NIP-09 deletion of the address (kind 5 with an "a" tag) still refuses
-- an older version: deletions never expire (044).
-- Lock impact: CREATE OR REPLACE FUNCTION takes no lock on events; each
-- insert runs the new body from its next statement. Nothing is scanned or
-- rewritten; rows are unchanged. The head lookups use events_by_author_kind
-- and events_by_address as before, expires_at filtered on the rows found.
-- Deploy: a relay of the previous version runs against the new body
-- unchanged (the trigger is the database's).
-- Roll back: the down part restores 023's body exactly: an expired head
-- keeps older versions out again until it is purged.

SET LOCAL lock_timeout = '5s';

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

    -- A head that has expired is absent, as every read treats it, whether
    -- or not the purge has deleted its row yet: it keeps no older version
    -- out, and goes with the slot's other rows below.
    IF NEW.d_tag IS NULL THEN
        SELECT created_at, id INTO head_created_at, head_id
        FROM events
        WHERE community_id = NEW.community_id AND pubkey = NEW.pubkey AND kind = NEW.kind
          AND (expires_at IS NULL OR expires_at > now())
        ORDER BY created_at DESC, id ASC
        LIMIT 1;
    ELSE
        SELECT created_at, id INTO head_created_at, head_id
        FROM events
        WHERE community_id = NEW.community_id AND pubkey = NEW.pubkey AND kind = NEW.kind AND d_tag = NEW.d_tag
          AND (expires_at IS NULL OR expires_at > now())
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

-- CREATE OR REPLACE resets the function's settings: its search_path again.
DO $$
BEGIN
    EXECUTE format('ALTER FUNCTION events_keep_newest_version() SET search_path = %I, pg_temp', current_schema());
END
$$;

---- create above / drop below ----

SET LOCAL lock_timeout = '5s';

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

-- CREATE OR REPLACE resets the function's settings: its search_path again.
DO $$
BEGIN
    EXECUTE format('ALTER FUNCTION events_keep_newest_version() SET search_path = %I, pg_temp', current_schema());
END
$$;
