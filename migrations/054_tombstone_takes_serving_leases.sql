-- 054: a community's tombstone takes its serving-write leases with it.
--
-- Why: community_serving_write_leases names a community (its id, the
-- operation, the relay that held it) but is none of the scoped tables the
-- purge empties. A relay killed mid-upload leaves its lease behind; the
-- fence waits only for live leases, so the deletion went on once it
-- lapsed, and reported itself complete with the row still there, left to
-- a relay's reaper that may never run again (the deployment's own
-- community deleted, its relays retired). No lease can be taken or
-- renewed once a community is fenced (acquire wants it active, renew
-- active or quiescing), so the tombstone's transaction deletes every one
-- left. Communities already tombstoned lose theirs here too.
-- Lock impact: CREATE OR REPLACE FUNCTION locks only the function. The
-- DELETE takes ROW EXCLUSIVE on community_serving_write_leases (writers go
-- on); the backfill reads the small table once.
-- Deploy: any order. An executor of any version calls the same function.
-- Roll back: the down part restores migration 018's function; deleted
-- leases stay deleted (they had lapsed: nothing holds them).

SET LOCAL lock_timeout = '5s';

CREATE OR REPLACE FUNCTION community_deletion_requests_tombstone(request uuid, owner text, generation bigint, detail jsonb) RETURNS void
    LANGUAGE plpgsql
    AS $$
DECLARE
    r community_deletion_requests;
BEGIN
    r := community_deletion_requests_enter_executor(request, owner, generation, 'bindings_removed');
    PERFORM community_deletion_assert_postgres_absent(r.community_id);
    UPDATE communities SET deletion_state = 'tombstone', deleted_at = coalesce(deleted_at, now()),
                           archived_at = coalesce(archived_at, now()), signing_key = NULL
    WHERE id = r.community_id AND deletion_state = 'fenced' AND deletion_fence_generation = r.fence_generation;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'community % is not fenced at generation %', r.community_id, r.fence_generation USING ERRCODE = 'BZ002';
    END IF;
    -- Leases of operations that died: none can be live or taken now.
    DELETE FROM community_serving_write_leases WHERE community_id = r.community_id;
    PERFORM community_deletion_requests_advance(request, owner, generation, 'bindings_removed', NULL);
    PERFORM community_deletion_checkpoints_upsert(request, 'bindings_removed', 'postgres_tombstone_committed', 'completed',
                                          generation, detail, NULL);
END
$$;

DELETE FROM community_serving_write_leases l
USING communities c
WHERE c.id = l.community_id AND c.deletion_state = 'tombstone';

---- create above / drop below ----

CREATE OR REPLACE FUNCTION community_deletion_requests_tombstone(request uuid, owner text, generation bigint, detail jsonb) RETURNS void
    LANGUAGE plpgsql
    AS $$
DECLARE
    r community_deletion_requests;
BEGIN
    r := community_deletion_requests_enter_executor(request, owner, generation, 'bindings_removed');
    PERFORM community_deletion_assert_postgres_absent(r.community_id);
    UPDATE communities SET deletion_state = 'tombstone', deleted_at = coalesce(deleted_at, now()),
                           archived_at = coalesce(archived_at, now()), signing_key = NULL
    WHERE id = r.community_id AND deletion_state = 'fenced' AND deletion_fence_generation = r.fence_generation;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'community % is not fenced at generation %', r.community_id, r.fence_generation USING ERRCODE = 'BZ002';
    END IF;
    PERFORM community_deletion_requests_advance(request, owner, generation, 'bindings_removed', NULL);
    PERFORM community_deletion_checkpoints_upsert(request, 'bindings_removed', 'postgres_tombstone_committed', 'completed',
                                          generation, detail, NULL);
END
$$;
