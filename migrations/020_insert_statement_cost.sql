-- 020: the events row's own functions in PL/pgSQL, so an INSERT statement no
-- longer parses SQL text.
--
-- Why: PostgreSQL prepares a table's generated-column and CHECK expressions
-- afresh for every INSERT statement. Where such an expression calls a
-- LANGUAGE sql function, preparing it tries to inline the function, which
-- means parsing its body, and a body with FROM cannot be inlined, so the
-- parse is thrown away; the first call then parses and plans the body again
-- (and the plan lives only as long as the statement). Two functions of the
-- events row were such: events_tag_index (generated column tag_index) and
-- events_deletion_coordinates_canonical (CHECK
-- events_deletion_coordinates_canonical, which still costs its parse on a
-- kind 1 row though it only runs for kind 5). A PL/pgSQL function is
-- compiled once per session and never inlined.
--
-- Measured on the 2-core dev box, one client, synchronous_commit off,
-- multi-row INSERTs of synthetic events (pgbench -M prepared), per statement:
--   1 row:   381-396 us -> 216-226 us
--   4 rows:  669-670 us -> ~500 us
--   32 rows: 2,915-2,931 us -> ~2,750-2,820 us
-- Through the relay: one publisher's OK p50 0.86-1.20 ms -> 0.76-0.77 ms;
-- 16 publishers, PostgreSQL CPU per event 216-238 us -> 192-199 us.
--
-- events_tag_index returns exactly what it returned before (the distinct
-- 'name:value' strings, sorted), so rows stored before keep matching and
-- nothing is rewritten. For tags that are not an array, where the SQL
-- function failed with "cannot extract elements from an object", it returns
-- no entries, so the CHECK events_tags_array refuses the row by its name.
-- A short tag list (the usual event) is walked in a loop of plain
-- expressions; a long one is sorted by the query the SQL function ran, so
-- an event with thousands of tags costs n log n, not n^2.
-- internal/migrate checks both against the old SQL on generated tag lists,
-- and that no CHECK, generated column, index or trigger condition calls a
-- LANGUAGE sql function again.
--
-- Lock impact: CREATE OR REPLACE FUNCTION locks only the functions; events
-- is not locked, scanned or rewritten.
-- Roll back: the down part restores the LANGUAGE sql bodies.

CREATE OR REPLACE FUNCTION events_tag_index(tags jsonb) RETURNS text[]
    LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE STRICT
AS $$
DECLARE
    tag     jsonb;
    entry   text;
    entries text[] := '{}';
    n       int;
    pos     int;
BEGIN
    IF jsonb_typeof(tags) <> 'array' THEN
        RETURN '{}'; -- for CHECK events_tags_array to refuse by name
    END IF;
    n := jsonb_array_length(tags);
    IF n > 16 THEN
        RETURN (SELECT coalesce(array_agg(DISTINCT (t->>0) || ':' || (t->>1)), '{}')
                FROM jsonb_array_elements(tags) AS t
                WHERE jsonb_typeof(t) = 'array'
                  AND (t->>0) ~ '^[A-Za-z]$'
                  AND octet_length(t->>1) <= 1024);
    END IF;
    FOR i IN 0 .. n - 1 LOOP
        tag := tags -> i;
        CONTINUE WHEN jsonb_typeof(tag) <> 'array';
        CONTINUE WHEN NOT coalesce((tag->>0) ~ '^[A-Za-z]$' AND octet_length(tag->>1) <= 1024, false);
        entry := (tag->>0) || ':' || (tag->>1);
        CONTINUE WHEN entry = ANY (entries);
        -- Keep the array sorted as it goes, the order array_agg(DISTINCT) gives.
        pos := coalesce(array_length(entries, 1), 0) + 1;
        WHILE pos > 1 AND entries[pos - 1] > entry LOOP
            pos := pos - 1;
        END LOOP;
        entries := entries[1:pos - 1] || entry || entries[pos:];
    END LOOP;
    RETURN entries;
END
$$;

CREATE OR REPLACE FUNCTION events_deletion_coordinates_canonical(tags jsonb) RETURNS boolean
    LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE STRICT
AS $$
BEGIN
    RETURN (SELECT coalesce(bool_and(coalesce(nostr_coordinate_is_canonical(tag->>1), false)), true)
            FROM jsonb_array_elements(tags) AS tag
            WHERE jsonb_typeof(tag) = 'array' AND jsonb_array_length(tag) >= 2 AND tag->>0 = 'a');
END
$$;

---- create above / drop below ----

CREATE OR REPLACE FUNCTION events_tag_index(tags jsonb) RETURNS text[]
    LANGUAGE sql IMMUTABLE PARALLEL SAFE STRICT
AS $$
    SELECT coalesce(array_agg(DISTINCT (tag->>0) || ':' || (tag->>1)), '{}')
    FROM jsonb_array_elements(tags) AS tag
    WHERE jsonb_typeof(tag) = 'array'
      AND (tag->>0) ~ '^[A-Za-z]$'
      AND octet_length(tag->>1) <= 1024
$$;

CREATE OR REPLACE FUNCTION events_deletion_coordinates_canonical(tags jsonb) RETURNS boolean
    LANGUAGE sql IMMUTABLE PARALLEL SAFE STRICT
AS $$
    SELECT coalesce(bool_and(coalesce(nostr_coordinate_is_canonical(tag->>1), false)), true)
    FROM jsonb_array_elements(tags) AS tag
    WHERE jsonb_typeof(tag) = 'array' AND jsonb_array_length(tag) >= 2 AND tag->>0 = 'a'
$$;
