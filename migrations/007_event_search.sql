-- 007: NIP-50 full-text search over event content.
--
-- Why: search REQs ("search" filter field) are answered from PostgreSQL full
-- text: a generated tsvector ('simple' configuration: no stemming or stop
-- words, so any language and code identifiers match literally) with a GIN
-- index. Gift wraps and membership notifications are never indexed (their
-- content is encrypted or meaningless), nor are workflow kinds 30300/30622.
-- Lock impact: adding a STORED generated column rewrites events under an
-- ACCESS EXCLUSIVE lock, and the GIN index is built in the same transaction.
-- On a large table, schedule this migration in a maintenance window: on
-- PostgreSQL 15 adding a stored generated column always rewrites the table,
-- by hand or not.
-- Roll back: the down part drops the index and the column.

ALTER TABLE events ADD COLUMN search_tsv tsvector GENERATED ALWAYS AS (
    CASE WHEN kind IN (1059, 30300, 30622, 44100, 44101) THEN NULL
         ELSE to_tsvector('simple'::regconfig, content)
    END
) STORED;

CREATE INDEX events_search ON events USING gin (search_tsv);

---- create above / drop below ----

DROP INDEX events_search;
ALTER TABLE events DROP COLUMN search_tsv;
