-- 033: bytes of media each community stores, against a quota.
--
-- Why: media uploads had no storage bound. Any key may upload (keys cost
-- nothing), each blob up to BUZZ_MEDIA_MAX_BYTES, so one community's
-- uploads could fill the store the relay shares with every community (and,
-- on the fs store, often the disk PostgreSQL writes to). The relay now
-- reserves a blob's size here before a community's first upload of it is
-- stored, in one conditional upsert that refuses to pass the quota (exact
-- under concurrent uploads on any number of relay processes), and gives it
-- back when the community's last reference to the blob is deleted.
-- Lock impact: CREATE TABLE and its write fence trigger only; no existing
-- table is locked beyond the foreign key's SHARE ROW EXCLUSIVE on
-- communities for an instant (the reason for the lock_timeout).
-- Roll back: the down part drops the table; nothing else reads it.

SET LOCAL lock_timeout = '5s';

CREATE TABLE media_usage (
    community_id uuid PRIMARY KEY REFERENCES communities (id),
    -- Bytes of the blobs the community references, each counted once per
    -- community however often it was uploaded there. Counted from this
    -- migration on: blobs uploaded before it are not in it.
    bytes        bigint NOT NULL DEFAULT 0 CONSTRAINT media_usage_bytes_nonnegative CHECK (bytes >= 0),
    updated_at   timestamptz NOT NULL DEFAULT now()
);

COMMENT ON TABLE media_usage IS
    'Bytes of media each community stores, reserved before a blob is stored and released when its last reference goes (BUZZ_MEDIA_COMMUNITY_QUOTA_BYTES).';

SELECT attach_community_write_fence('media_usage');

---- create above / drop below ----

SET LOCAL lock_timeout = '5s';

DROP TABLE media_usage;
