-- 059: the sweep of media blobs no community references.
--
-- Why: a blob stays in the shared store after the last community's
-- sidecar of it goes (a delete only unbinds its community; a crash or a
-- failed removal leaves one too). A relay sweeps such blobs in batches.
-- media_blob_sweep is its claim: one row, leased by one relay process at
-- a time, which also keeps where the walk of the store stopped.
-- media_unreferenced_blobs holds the blobs the sweep found referenced by
-- no community and since when: one is removed only once it stayed so for
-- the grace period (BUZZ_MEDIA_SWEEP_GRACE), so a delete followed by a
-- quick re-upload of the same bytes does not remove and rewrite the blob.
-- Both tables are operator-global: a blob is shared by every community
-- that uploads its bytes, so neither row belongs to one community.
-- Lock impact: two new tables; nothing existing is touched.
-- Deploy: apply before relays of this version start; relays of the
-- previous version still remove a deleted blob themselves, which the
-- sweep tolerates (a marked blob found gone is forgotten).
-- Roll back: the down part drops both tables; roll the relays back first.
-- Their blobs left unreferenced then stay in the store (space only).

SET LOCAL lock_timeout = '5s';

CREATE TABLE media_blob_sweep (
    id              smallint    PRIMARY KEY CONSTRAINT media_blob_sweep_single_row CHECK (id = 1),
    claimed_by      uuid,
    claimed_until   timestamptz NOT NULL DEFAULT '-infinity',
    -- The last blob key the current pass over the store looked at, and
    -- when the pass began; '' and NULL before the first sweep.
    pass_cursor     text        NOT NULL DEFAULT '',
    pass_started_at timestamptz
);

COMMENT ON TABLE media_blob_sweep IS 'The claim of the media blob sweep (one relay process at a time) and where its pass over the store stands; one row.';

INSERT INTO media_blob_sweep (id) VALUES (1) ON CONFLICT DO NOTHING;

CREATE TABLE media_unreferenced_blobs (
    blob_key      text        PRIMARY KEY,
    first_seen_at timestamptz NOT NULL,
    last_seen_at  timestamptz NOT NULL
);

COMMENT ON TABLE media_unreferenced_blobs IS 'Blobs the media sweep found referenced by no community, from when; removed after BUZZ_MEDIA_SWEEP_GRACE.';

INSERT INTO _operator_global_tables (table_name, reason) VALUES
    ('media_blob_sweep', 'media store housekeeping: blobs are shared by every community'),
    ('media_unreferenced_blobs', 'media store housekeeping: blobs are shared by every community');

---- create above / drop below ----

SET LOCAL lock_timeout = '5s';

DELETE FROM _operator_global_tables WHERE table_name IN ('media_blob_sweep', 'media_unreferenced_blobs');
DROP TABLE media_unreferenced_blobs;
DROP TABLE media_blob_sweep;
