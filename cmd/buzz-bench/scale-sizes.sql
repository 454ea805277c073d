-- Bytes per event of the events table (psql script for `make bench-scale`):
-- the heap (with its TOAST table and free-space/visibility maps) and each
-- index, from pg_relation_size, divided by the stored row count.
\set ON_ERROR_STOP on
WITH n AS (SELECT count(*)::numeric AS rows FROM events),
parts AS (
    SELECT 'heap (+toast, maps)' AS relation, 0 AS ord,
           pg_table_size('events') AS bytes
    UNION ALL
    SELECT i.indexrelid::regclass::text, 1, pg_relation_size(i.indexrelid)
    FROM pg_index i WHERE i.indrelid = 'events'::regclass
    UNION ALL
    SELECT 'all indexes', 2, pg_indexes_size('events')
    UNION ALL
    SELECT 'total', 3, pg_total_relation_size('events')
)
SELECT relation, pg_size_pretty(bytes) AS size,
       round(bytes / nullif(n.rows, 0)) AS bytes_per_event
FROM parts, n ORDER BY ord, relation;
