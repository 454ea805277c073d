-- Bulk-loads synthetic events for `make bench-scale` (psql script).
--
-- Variables: host (the community's host, created if missing), n (how many
-- events), start (the first created_at, unix seconds; default one year
-- ago), authors (default 500), per_second (events per second, default 4),
-- content ('words', the default, or 'marker': buzz-bench's own published
-- content, a "<run>/<stream>/<seq> " marker padded with x to 200 bytes).
--
-- The rows are synthetic: ids, pubkeys and signatures are pseudo-random
-- bytes of the right length (md5 of the row number), so signatures are NOT
-- valid and ids are not the hash of the content. They are loaded by one
-- INSERT ... SELECT over generate_series, through every trigger and index
-- of the live schema, in ascending created_at order like live traffic.
-- Reads never verify what they return, so read and search timings are real.
--
-- Shape, per row i:
--   kind      1 for four rows in five, 7 (reaction) for the fifth
--   pubkey    one of :authors authors (500)
--   created_at start + i/:per_second seconds (four events per second)
--   tags      one p tag (another author) and one t tag (one of 50 topics)
--   content   about 200 bytes of words: 'lorem' in 90% of rows, one of
--             twenty 'common<k>' words (5% each), one of a thousand
--             'rare<k>' words (0.1% each), four filler words from a list
--             of 64 and a fixed tail, so search has common, mid and rare terms.
\set ON_ERROR_STOP on
\if :{?start}
\else
\set start 0
\endif
\if :{?authors}
\else
\set authors 500
\endif
\if :{?per_second}
\else
\set per_second 4
\endif
\if :{?content}
\else
\set content words
\endif

INSERT INTO communities (host) VALUES (:'host') ON CONFLICT DO NOTHING;

-- Four filler words per row, picked by hashing the row number: varied
-- enough that the search index is realistic, reproducible run to run.
CREATE TEMP TABLE scale_words AS
SELECT array_agg(w ORDER BY ord) AS words FROM unnest(ARRAY[
    'alpha', 'bravo', 'charlie', 'delta', 'echo', 'foxtrot', 'golf', 'hotel',
    'india', 'juliet', 'kilo', 'lima', 'mike', 'november', 'oscar', 'papa',
    'quebec', 'romeo', 'sierra', 'tango', 'uniform', 'victor', 'whiskey', 'xray',
    'yankee', 'zulu', 'consectetur', 'adipiscing', 'elit', 'eiusmod', 'tempor', 'incididunt',
    'labore', 'dolore', 'magna', 'aliqua', 'veniam', 'nostrud', 'exercitation', 'ullamco',
    'laboris', 'nisi', 'aliquip', 'commodo', 'consequat', 'duis', 'aute', 'irure',
    'reprehenderit', 'voluptate', 'velit', 'esse', 'cillum', 'fugiat', 'nulla', 'pariatur',
    'excepteur', 'sint', 'occaecat', 'cupidatat', 'proident', 'sunt', 'culpa', 'officia'
]) WITH ORDINALITY AS t (w, ord);

INSERT INTO events (community_id, id, pubkey, created_at, kind, tags, content, sig)
SELECT c.id,
       decode(md5('id' || i) || md5('id2' || i), 'hex'),
       decode(md5('pk' || (i % :authors)) || md5('pk2' || (i % :authors)), 'hex'),
       to_timestamp(CASE WHEN :start > 0 THEN :start ELSE extract(epoch FROM now())::bigint - 365 * 86400 END + i / :per_second),
       CASE WHEN i % 5 = 4 THEN 7 ELSE 1 END,
       jsonb_build_array(
           jsonb_build_array('p', md5('pk' || ((i * 7) % :authors)) || md5('pk2' || ((i * 7) % :authors))),
           jsonb_build_array('t', 'topic' || (i % 50))),
       CASE WHEN :'content' = 'marker' THEN rpad('scale/' || (i % :authors) || '/' || i || ' ', 200, 'x') ELSE
       CASE WHEN i % 10 = 0 THEN '' ELSE 'lorem ipsum dolor sit amet ' END
         || 'common' || (i % 20) || ' rare' || (i % 1000) || ' '
         || (SELECT string_agg(sw.words[1 + (('x' || substr(md5(i::text || ':' || k), 1, 8))::bit(32)::int & 63)], ' ')
             FROM generate_series(1, 4) AS k)
         || ' consectetur adipiscing elit sed do eiusmod tempor incididunt ut labore et dolore magna aliqua ut enim ad minim veniam quis nostrud' END,
       decode(md5('sig' || i) || md5('sig2' || i) || md5('sig3' || i) || md5('sig4' || i), 'hex')
FROM generate_series(1, :n) AS i, communities c, scale_words sw
WHERE c.host = :'host';
