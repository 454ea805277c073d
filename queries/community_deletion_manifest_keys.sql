-- name: DeletionManifestChunkInsert :exec
INSERT INTO community_deletion_manifest_keys (request_id, chunk_no, prefix, key_class, keys)
VALUES (@request_id::uuid, @chunk_no::bigint, @prefix::text, @key_class::text, @keys::jsonb);

-- name: DeletionManifestChunksClear :execrows
-- Leftovers of an interrupted manifest build (allowed only before the freeze).
DELETE FROM community_deletion_manifest_keys WHERE request_id = @request_id::uuid;

-- name: DeletionManifestChunk :one
SELECT * FROM community_deletion_manifest_keys WHERE request_id = @request_id::uuid AND chunk_no = @chunk_no::bigint;

-- name: DeletionManifestNextUndeleted :one
-- The community's own keys (sidecars, upload records) before its shared
-- blob candidates: a blob is kept while another community has a sidecar
-- for it, and that community, releasing it at the same time, keeps it
-- while ours exists. Dropping ours first means whichever side checks last
-- finds no reference and deletes the blob.
SELECT * FROM community_deletion_manifest_keys
WHERE request_id = @request_id::uuid AND deleted_at IS NULL
ORDER BY key_class = 'shared_blob', chunk_no LIMIT 1;

-- name: DeletionManifestProgress :one
SELECT count(*)::bigint AS chunks, count(deleted_at)::bigint AS deleted_chunks,
       coalesce(sum(jsonb_array_length(keys)), 0)::bigint AS keys,
       coalesce(sum(jsonb_array_length(keys)) FILTER (WHERE deleted_at IS NOT NULL), 0)::bigint AS deleted_keys
FROM community_deletion_manifest_keys WHERE request_id = @request_id::uuid;

-- name: DeletionManifestChunkStamp :exec
SELECT community_deletion_manifest_keys_stamp(@id::uuid, @owner::text, @generation::bigint, @chunk_no::bigint, @detail::jsonb);
