-- 060: the media sweep tries the blobs it failed to remove after the others.
--
-- Why: the sweep removes its batch of due blobs oldest first (by when they
-- were first found unreferenced). A blob whose removal keeps failing (the
-- store refuses it) stays due and stays the oldest, so a batch's worth of
-- them was tried again on every sweep and no other blob was ever removed.
-- removal_failed_at keeps when a removal last failed: the due list takes
-- the blobs never tried first, then the failed ones by their oldest
-- failure, so each failing blob is still retried in turn.
-- NULL: no removal of it failed.
-- Lock impact: ADD COLUMN without a default changes only the catalog: an
-- ACCESS EXCLUSIVE lock on media_unreferenced_blobs for an instant, no
-- rewrite; it waits at most lock_timeout for the sweep's statements.
-- Deploy: apply before relays of this version start; relays of the
-- previous version ignore the column (and order by first sight, as before).
-- Roll back: the down part drops the column (the failures recorded are
-- lost); roll the relays back first, they write it.

SET LOCAL lock_timeout = '5s';

ALTER TABLE media_unreferenced_blobs ADD COLUMN removal_failed_at timestamptz NULL;

COMMENT ON COLUMN media_unreferenced_blobs.removal_failed_at IS 'When the sweep last failed to remove the blob (NULL: never); failed blobs are tried after the others.';

---- create above / drop below ----

SET LOCAL lock_timeout = '5s';

ALTER TABLE media_unreferenced_blobs DROP COLUMN removal_failed_at;
