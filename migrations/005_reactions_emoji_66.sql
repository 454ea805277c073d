-- 005: reactions.emoji widens from 64 to 66 characters.
--
-- Why: a custom emoji reaction is stored with its colon wrapper, and a
-- shortcode may be 64 characters, so ":<64 chars>:" is 66. Plain
-- reactions stay limited to 64 characters by the relay.
-- Lock impact: widening a varchar is a catalog-only change in PostgreSQL (no
-- table rewrite, no index rebuild), but it takes a brief ACCESS EXCLUSIVE lock
-- on reactions.
-- Roll back: the down part narrows it again, which fails while any stored
-- reaction is longer than 64 characters (delete or shorten those first).

ALTER TABLE reactions ALTER COLUMN emoji TYPE varchar(66);

---- create above / drop below ----

ALTER TABLE reactions ALTER COLUMN emoji TYPE varchar(64);
