-- name: StorageTaxonomySweepInsert :one
INSERT INTO storage_taxonomy_sweeps (started_at, listed_objects, unknown_object_count, unknown_key_sample)
SELECT least(@started_at::timestamptz, clock_timestamp()), @listed_objects::bigint, @unknown_object_count::bigint, @unknown_key_sample::jsonb
WHERE @started_at::timestamptz <= clock_timestamp() + interval '5 minutes'
RETURNING *;
