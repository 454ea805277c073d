-- 010: one spelling per replaceable/addressable coordinate in kind 5 deletions.
--
-- Why: the trigger events_keep_newest_version keeps an older version of a
-- deleted slot out by looking for the literal tag value
-- 'a:<kind>:<pubkey>:<d>' in the author's kind 5 events. A deletion spelled
-- any other way ('10002:<pk>' without the trailing colon, '030023:...',
-- '+30023:...', an upper-case pubkey) hid the current version but not the
-- older ones published afterwards. The relay now refuses such deletions
-- (internal/nostr ParseCoordinate); this constraint holds the same rule in the
-- database for every writer: an a tag of a kind 5 event is
-- '<kind>:<pubkey>:<d>' with the kind in plain decimal (no sign, no leading
-- zero) and replaceable or addressable, the pubkey in lowercase hex, the d
-- part empty for a replaceable kind, and at most 1024 bytes (longer tag
-- values are not in tag_index, where the trigger looks).
-- Existing rows: NOT VALID, so rows stored before are not checked (a loosely
-- spelled deletion already stored keeps hiding what it hid). Run
-- `ALTER TABLE events VALIDATE CONSTRAINT events_deletion_coordinates_canonical`
-- to find out whether any exist (it fails naming the constraint if so).
-- Lock impact: ADD CONSTRAINT ... NOT VALID takes a brief ACCESS EXCLUSIVE
-- lock on events and scans nothing.
-- Roll back: the down part drops the constraint and the two functions; the
-- relay still refuses loose spellings on its own.

CREATE FUNCTION nostr_coordinate_is_canonical(coordinate text) RETURNS boolean
    LANGUAGE sql IMMUTABLE PARALLEL SAFE STRICT
AS $$
    SELECT octet_length(coordinate) <= 1024 AND coalesce(
        CASE WHEN coordinate ~ '^(0|[1-9][0-9]{0,4}):[0-9a-f]{64}:' THEN
            CASE
                WHEN split_part(coordinate, ':', 1)::int IN (0, 3)
                  OR split_part(coordinate, ':', 1)::int BETWEEN 10000 AND 19999
                    THEN coordinate ~ '^[0-9]+:[0-9a-f]{64}:$'
                ELSE split_part(coordinate, ':', 1)::int BETWEEN 30000 AND 39999
            END
        END, false)
$$;

COMMENT ON FUNCTION nostr_coordinate_is_canonical(text) IS
    'The one accepted spelling of an a-tag coordinate: <kind>:<lowercase hex pubkey>:<d>, see migration 010.';

CREATE FUNCTION events_deletion_coordinates_canonical(tags jsonb) RETURNS boolean
    LANGUAGE sql IMMUTABLE PARALLEL SAFE STRICT
AS $$
    SELECT coalesce(bool_and(coalesce(nostr_coordinate_is_canonical(tag->>1), false)), true)
    FROM jsonb_array_elements(tags) AS tag
    WHERE jsonb_typeof(tag) = 'array' AND jsonb_array_length(tag) >= 2 AND tag->>0 = 'a'
$$;

ALTER TABLE events ADD CONSTRAINT events_deletion_coordinates_canonical
    CHECK (kind <> 5 OR events_deletion_coordinates_canonical(tags)) NOT VALID;

---- create above / drop below ----

ALTER TABLE events DROP CONSTRAINT events_deletion_coordinates_canonical;
DROP FUNCTION events_deletion_coordinates_canonical(jsonb);
DROP FUNCTION nostr_coordinate_is_canonical(text);
