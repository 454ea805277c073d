-- 051: the write fence names itself, so a relay tells "this community is
-- being deleted" apart from a lock wait cut short.
--
-- Why: the fence (assert_community_write_allowed, and the serving-write
-- lease's acquire and guard) raised a bare 55000. The relay mapped every
-- such failure to an internal error, "error: could not store the event; try
-- again" (HTTP 500, a webhook 503), so a client retried forever against a
-- community that is going away. Each fence refusal now carries CONSTRAINT
-- 'community_write_fence' (the name a client-facing rule gets everywhere
-- else, docs/errors.md); internal/dberr recognizes it and the relay answers
-- "blocked: this community is being deleted" (HTTP 410). The SQLSTATE stays
-- 55000: every caller and test that matches it (the deletion package, the
-- backfills of migrations 047 and 050, operators' scripts) stays right,
-- and a lock timeout (55P03) is still a lock timeout.
-- Only the three RAISEs change; the bodies are otherwise those of 018, and
-- assert_community_write_allowed keeps 032's search_path (CREATE OR REPLACE
-- drops a SET clause it does not repeat, so it is set again below).
-- Lock impact: CREATE OR REPLACE FUNCTION locks only the functions; no
-- table is locked, scanned or rewritten. A transaction already running
-- keeps the old text for its current statement.
-- Deploy: any order. An older relay reads the named error as it read the
-- unnamed one (an internal error); a newer relay on the old schema answers
-- the fence as before until this migration runs.
-- Roll back: the down part restores the unnamed RAISEs and the search_path.

SET LOCAL lock_timeout = '5s';

CREATE OR REPLACE FUNCTION assert_community_write_allowed(community uuid) RETURNS void
    LANGUAGE plpgsql
    AS $$
DECLARE
    state text;
    generation bigint;
    executor_community text;
    executor_generation text;
    executor_lease text;
    lease_id text;
BEGIN
    IF current_setting('transaction_isolation') <> 'read committed' THEN
        RAISE EXCEPTION 'community writes require READ COMMITTED isolation (this transaction is %)',
            current_setting('transaction_isolation') USING ERRCODE = '25000';
    END IF;
    IF community IS NULL THEN
        RETURN;
    END IF;
    -- Shared: writers do not wait for each other, only for a fence in
    -- progress; each statement below reads state committed after the wait.
    PERFORM pg_advisory_xact_lock_shared(community_deletion_lock_key(community));
    SELECT c.deletion_state, c.deletion_fence_generation INTO state, generation
    FROM communities c WHERE c.id = community;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'community write rejected: community % is missing', community USING ERRCODE = '55000', CONSTRAINT = 'community_write_fence';
    END IF;
    IF state = 'active' THEN
        RETURN;
    END IF;
    -- The deletion executor, presenting the current fence generation and a
    -- live lease of its request: a dead executor's late write carries an
    -- old lease generation and fails here.
    executor_community := current_setting('buzz.deletion_executor_community', true);
    executor_generation := current_setting('buzz.deletion_fence_generation', true);
    executor_lease := current_setting('buzz.deletion_lease_generation', true);
    IF executor_community = community::text
       AND executor_generation ~ '^[0-9]{1,18}$' AND executor_generation::bigint = generation
       AND executor_lease ~ '^[0-9]{1,18}$'
       AND EXISTS (SELECT FROM community_deletion_requests r
                   WHERE r.community_id = community
                     AND r.lease_generation = executor_lease::bigint
                     AND r.lease_until >= now()
                     AND r.blocked_at IS NULL) THEN
        RETURN;
    END IF;
    -- A serving write admitted before quiescing may finish its database
    -- step under its still-valid lease.
    IF state = 'quiescing' THEN
        lease_id := current_setting('buzz.serving_write_lease_id', true);
        IF lease_id ~ '^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$'
           AND EXISTS (SELECT FROM community_serving_write_leases l
                       WHERE l.id = lease_id::uuid AND l.community_id = community
                         AND l.fence_generation = generation AND l.lease_until >= now()) THEN
            RETURN;
        END IF;
    END IF;
    RAISE EXCEPTION 'community write fenced: community % is % (generation %)', community, state, generation
        USING ERRCODE = '55000', CONSTRAINT = 'community_write_fence';
END
$$;

CREATE OR REPLACE FUNCTION community_serving_write_leases_acquire(community uuid, op text, lease_owner text, lease_seconds double precision) RETURNS uuid
    LANGUAGE plpgsql
    AS $$
DECLARE
    lease uuid;
BEGIN
    PERFORM assert_community_write_allowed(community);
    INSERT INTO community_serving_write_leases (community_id, operation, owner, fence_generation, lease_until)
    SELECT c.id, op, lease_owner, c.deletion_fence_generation, now() + make_interval(secs => lease_seconds)
    FROM communities c WHERE c.id = community AND c.deletion_state = 'active' AND c.deleted_at IS NULL
    RETURNING id INTO lease;
    IF lease IS NULL THEN
        RAISE EXCEPTION 'community write fenced: community % accepts no new serving writes', community USING ERRCODE = '55000', CONSTRAINT = 'community_write_fence';
    END IF;
    RETURN lease;
END
$$;

CREATE OR REPLACE FUNCTION community_serving_write_leases_guard(lease uuid) RETURNS void
    LANGUAGE plpgsql
    AS $$
DECLARE
    community uuid;
BEGIN
    SELECT community_id INTO community FROM community_serving_write_leases WHERE id = lease;
    IF FOUND THEN
        PERFORM pg_advisory_xact_lock_shared(community_deletion_lock_key(community));
    END IF;
    IF NOT FOUND OR NOT EXISTS (
        SELECT FROM community_serving_write_leases l JOIN communities c ON c.id = l.community_id
        WHERE l.id = lease AND l.lease_until >= now() AND c.deletion_state IN ('active', 'quiescing')
          AND c.deleted_at IS NULL AND c.deletion_fence_generation = l.fence_generation) THEN
        RAISE EXCEPTION 'community write fenced: stale serving write lease %', lease USING ERRCODE = '55000', CONSTRAINT = 'community_write_fence';
    END IF;
    PERFORM set_config('buzz.serving_write_lease_id', lease::text, true);
END
$$;

DO $$
BEGIN
    EXECUTE format('ALTER FUNCTION assert_community_write_allowed(uuid) SET search_path = %I, pg_temp', current_schema());
END
$$;

---- create above / drop below ----

SET LOCAL lock_timeout = '5s';

CREATE OR REPLACE FUNCTION assert_community_write_allowed(community uuid) RETURNS void
    LANGUAGE plpgsql
    AS $$
DECLARE
    state text;
    generation bigint;
    executor_community text;
    executor_generation text;
    executor_lease text;
    lease_id text;
BEGIN
    IF current_setting('transaction_isolation') <> 'read committed' THEN
        RAISE EXCEPTION 'community writes require READ COMMITTED isolation (this transaction is %)',
            current_setting('transaction_isolation') USING ERRCODE = '25000';
    END IF;
    IF community IS NULL THEN
        RETURN;
    END IF;
    -- Shared: writers do not wait for each other, only for a fence in
    -- progress; each statement below reads state committed after the wait.
    PERFORM pg_advisory_xact_lock_shared(community_deletion_lock_key(community));
    SELECT c.deletion_state, c.deletion_fence_generation INTO state, generation
    FROM communities c WHERE c.id = community;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'community write rejected: community % is missing', community USING ERRCODE = '55000';
    END IF;
    IF state = 'active' THEN
        RETURN;
    END IF;
    -- The deletion executor, presenting the current fence generation and a
    -- live lease of its request: a dead executor's late write carries an
    -- old lease generation and fails here.
    executor_community := current_setting('buzz.deletion_executor_community', true);
    executor_generation := current_setting('buzz.deletion_fence_generation', true);
    executor_lease := current_setting('buzz.deletion_lease_generation', true);
    IF executor_community = community::text
       AND executor_generation ~ '^[0-9]{1,18}$' AND executor_generation::bigint = generation
       AND executor_lease ~ '^[0-9]{1,18}$'
       AND EXISTS (SELECT FROM community_deletion_requests r
                   WHERE r.community_id = community
                     AND r.lease_generation = executor_lease::bigint
                     AND r.lease_until >= now()
                     AND r.blocked_at IS NULL) THEN
        RETURN;
    END IF;
    -- A serving write admitted before quiescing may finish its database
    -- step under its still-valid lease.
    IF state = 'quiescing' THEN
        lease_id := current_setting('buzz.serving_write_lease_id', true);
        IF lease_id ~ '^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$'
           AND EXISTS (SELECT FROM community_serving_write_leases l
                       WHERE l.id = lease_id::uuid AND l.community_id = community
                         AND l.fence_generation = generation AND l.lease_until >= now()) THEN
            RETURN;
        END IF;
    END IF;
    RAISE EXCEPTION 'community write fenced: community % is % (generation %)', community, state, generation
        USING ERRCODE = '55000';
END
$$;

CREATE OR REPLACE FUNCTION community_serving_write_leases_acquire(community uuid, op text, lease_owner text, lease_seconds double precision) RETURNS uuid
    LANGUAGE plpgsql
    AS $$
DECLARE
    lease uuid;
BEGIN
    PERFORM assert_community_write_allowed(community);
    INSERT INTO community_serving_write_leases (community_id, operation, owner, fence_generation, lease_until)
    SELECT c.id, op, lease_owner, c.deletion_fence_generation, now() + make_interval(secs => lease_seconds)
    FROM communities c WHERE c.id = community AND c.deletion_state = 'active' AND c.deleted_at IS NULL
    RETURNING id INTO lease;
    IF lease IS NULL THEN
        RAISE EXCEPTION 'community write fenced: community % accepts no new serving writes', community USING ERRCODE = '55000';
    END IF;
    RETURN lease;
END
$$;

CREATE OR REPLACE FUNCTION community_serving_write_leases_guard(lease uuid) RETURNS void
    LANGUAGE plpgsql
    AS $$
DECLARE
    community uuid;
BEGIN
    SELECT community_id INTO community FROM community_serving_write_leases WHERE id = lease;
    IF FOUND THEN
        PERFORM pg_advisory_xact_lock_shared(community_deletion_lock_key(community));
    END IF;
    IF NOT FOUND OR NOT EXISTS (
        SELECT FROM community_serving_write_leases l JOIN communities c ON c.id = l.community_id
        WHERE l.id = lease AND l.lease_until >= now() AND c.deletion_state IN ('active', 'quiescing')
          AND c.deleted_at IS NULL AND c.deletion_fence_generation = l.fence_generation) THEN
        RAISE EXCEPTION 'community write fenced: stale serving write lease %', lease USING ERRCODE = '55000';
    END IF;
    PERFORM set_config('buzz.serving_write_lease_id', lease::text, true);
END
$$;

DO $$
BEGIN
    EXECUTE format('ALTER FUNCTION assert_community_write_allowed(uuid) SET search_path = %I, pg_temp', current_schema());
END
$$;
