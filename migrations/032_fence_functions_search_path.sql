-- 032: the write fence and the tombstone guard read the real tables, never
-- a session's temporary ones.
--
-- Why: assert_community_write_allowed, community_write_allowed and
-- communities_tombstone_guard name communities, community_deletion_requests
-- and community_serving_write_leases without a schema, and PostgreSQL
-- looks a name up in the session's temporary schema first unless the
-- search_path places pg_temp later. Any role that may write a tenant table
-- also may create temporary tables (TEMP is granted to PUBLIC): after
--   CREATE TEMP TABLE communities AS
--       SELECT id, 'active'::text AS deletion_state, deletion_fence_generation FROM public.communities;
-- the fence read "active" for every community and let that session write
-- rows into a fenced or tombstoned community (reproduced with a role that
-- holds only SELECT/INSERT/UPDATE/DELETE). A temporary
-- community_deletion_requests holding a made-up live lease let the
-- tombstone guard take a forged executor's word and move a tombstone back
-- to active. The deletion request's own guards read tables the same way:
-- a temporary community_deletion_approvals let a session move a request to
-- 'approved' with no approval (wedging it: no executor can claim it, no
-- approval can follow), a temporary community_deletion_manifest_keys let it
-- pass 'bindings_removed' with chunks undeleted, and a temporary
-- community_deletion_requests defeated 029's requester check. Each of these
-- functions now runs with its own schema first and pg_temp last, so their
-- tables resolve to the schema's.
-- Functions are not looked up in pg_temp, so only relations needed this.
-- Cost: a function with a SET clause sets and restores search_path on
-- every call, about 1-2 us per fenced row written on the dev box (the
-- control-table guards run only on deletion steps).
-- Lock impact: ALTER FUNCTION locks only the functions; no table is
-- locked, scanned or rewritten.
-- Roll back: the down part resets the six settings.

DO $$
BEGIN
    EXECUTE format('ALTER FUNCTION assert_community_write_allowed(uuid) SET search_path = %I, pg_temp', current_schema());
    EXECUTE format('ALTER FUNCTION community_write_allowed(uuid) SET search_path = %I, pg_temp', current_schema());
    EXECUTE format('ALTER FUNCTION communities_tombstone_guard() SET search_path = %I, pg_temp', current_schema());
    EXECUTE format('ALTER FUNCTION community_deletion_requests_guard() SET search_path = %I, pg_temp', current_schema());
    EXECUTE format('ALTER FUNCTION community_deletion_manifest_keys_guard() SET search_path = %I, pg_temp', current_schema());
    EXECUTE format('ALTER FUNCTION community_deletion_approvals_not_requester() SET search_path = %I, pg_temp', current_schema());
END
$$;

---- create above / drop below ----

ALTER FUNCTION community_deletion_approvals_not_requester() RESET search_path;
ALTER FUNCTION community_deletion_manifest_keys_guard() RESET search_path;
ALTER FUNCTION community_deletion_requests_guard() RESET search_path;
ALTER FUNCTION communities_tombstone_guard() RESET search_path;
ALTER FUNCTION community_write_allowed(uuid) RESET search_path;
ALTER FUNCTION assert_community_write_allowed(uuid) RESET search_path;
