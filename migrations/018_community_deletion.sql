-- 018: whole-community deletion: the write fence, the request stage machine,
-- executor leases and the evidence an operator reviews afterwards.
--
-- Why: deleting a community is irreversible and spans three stores
-- (PostgreSQL, the media object store, Redis). The rules that keep it safe
-- live here, in the database, so they hold whichever process writes (any
-- relay pod, a worker, buzz-admin, a psql session):
--   * a row trigger on every community-scoped table (every table with a
--     community_id column, found from the catalog) refuses writes to a
--     community that is no longer active; ordinary writers take a shared
--     transaction advisory lock on the community before reading its state,
--     the fence takes it exclusively, so the fence waits for every open
--     writer and no writer can read "active" after the fence commits;
--   * a deletion request walks a fixed list of stages, one step at a time,
--     only behind an approval bound to one exact inventory digest;
--   * the executor works under an expiring lease with a generation; a dead
--     executor's late write carries an old generation and is refused;
--   * the community row becomes a permanent tombstone that keeps its host
--     reserved.
-- Lock impact: ALTER TABLE communities ADD COLUMN with a constant default is
-- a catalog-only change (ACCESS EXCLUSIVE for an instant). CREATE TRIGGER
-- takes SHARE ROW EXCLUSIVE on every community-scoped table, blocking their
-- writes for the instant of the DDL; lock_timeout bounds the wait so a busy
-- table makes the migration fail instead of queueing every writer behind it.
-- The whole migration is one transaction: every table gets its fence or none
-- does.
-- Roll back: the down part drops the control tables (destroying deletion
-- evidence), the fence triggers and functions, and the generation column. It
-- refuses to run while any community is not active: a half-deleted
-- community must not silently become writable again.

SET LOCAL lock_timeout = '5s';

ALTER TABLE communities
    ADD COLUMN deletion_fence_generation bigint NOT NULL DEFAULT 0
        CONSTRAINT communities_deletion_fence_generation_nonnegative CHECK (deletion_fence_generation >= 0);

COMMENT ON COLUMN communities.deletion_fence_generation IS
    'Bumped when a deletion fences the community; only the executor presenting this generation may write to a fenced community.';

-- One advisory-lock key per community, shared by ordinary writers (shared
-- mode) and the deletion fence (exclusive mode).
CREATE FUNCTION community_deletion_lock_key(community uuid) RETURNS bigint
    LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
    AS $$ SELECT hashtextextended('buzz-community-deletion:' || community::text, 0) $$;

-- The deletion control tables carry community_id but must stay writable
-- while their community is fenced: they record the deletion itself.
CREATE FUNCTION community_write_fence_excluded_table(table_name text) RETURNS boolean
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    AS $$ SELECT table_name IN ('community_deletion_requests', 'community_deletion_approvals',
                                 'community_deletion_checkpoints', 'community_deletion_manifest_keys',
                                 'community_serving_write_leases', 'community_deletion_executor_heartbeats',
                                 'storage_taxonomy_sweeps') $$;

CREATE TABLE community_deletion_requests (
    id              uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    -- One request per community, ever: a tombstone is never deleted twice
    -- and a finished request stays as evidence.
    community_id    uuid NOT NULL UNIQUE REFERENCES communities (id),
    community_host  text NOT NULL,
    stage           text NOT NULL DEFAULT 'submitted'
                    CONSTRAINT community_deletion_requests_stage_known CHECK (stage IN (
                        'submitted', 'inventoried', 'approved', 'fenced', 'drained', 'bindings_removed',
                        'postgres_purged', 'cache_purged', 'logically_verified', 'retention_pending')),
    requested_by    text NOT NULL CONSTRAINT community_deletion_requests_requested_by_set CHECK (btrim(requested_by) <> ''),
    reason          text,
    inventory_manifest  jsonb,
    inventory_digest    bytea CONSTRAINT community_deletion_requests_digest_len CHECK (octet_length(inventory_digest) = 32),
    inventory_frozen_at timestamptz,
    destructive_manifest jsonb,
    destructive_frozen_at timestamptz,
    fence_generation bigint CONSTRAINT community_deletion_requests_fence_generation_positive CHECK (fence_generation > 0),
    lease_owner     text,
    lease_generation bigint NOT NULL DEFAULT 0 CONSTRAINT community_deletion_requests_lease_generation_nonnegative CHECK (lease_generation >= 0),
    lease_until     timestamptz,
    attempts        integer NOT NULL DEFAULT 0,
    retry_count     integer NOT NULL DEFAULT 0,
    retry_stage     text,
    next_attempt_at timestamptz NOT NULL DEFAULT now(),
    last_error      text,
    last_error_at   timestamptz,
    blocked_at      timestamptz,
    blocked_reason  text,
    created_at      timestamptz NOT NULL DEFAULT now(),
    updated_at      timestamptz NOT NULL DEFAULT now(),
    completed_at    timestamptz,
    CONSTRAINT community_deletion_requests_inventory_frozen CHECK (
        (inventory_frozen_at IS NULL) = (inventory_digest IS NULL)
        AND (inventory_frozen_at IS NULL) = (inventory_manifest IS NULL)),
    CONSTRAINT community_deletion_requests_destructive_frozen CHECK (
        (destructive_frozen_at IS NULL) = (destructive_manifest IS NULL)),
    CONSTRAINT community_deletion_requests_lease_shape CHECK ((lease_owner IS NULL) = (lease_until IS NULL)),
    CONSTRAINT community_deletion_requests_blocked_shape CHECK ((blocked_at IS NULL) = (blocked_reason IS NULL)),
    -- The target of the approval's foreign key: an approval names the digest it approved.
    CONSTRAINT community_deletion_requests_digest_binding UNIQUE (id, community_id, inventory_digest)
);

COMMENT ON TABLE community_deletion_requests IS
    'Whole-community deletions, one per community; rows are never deleted (evidence).';

CREATE INDEX community_deletion_requests_runnable ON community_deletion_requests (next_attempt_at, created_at)
    WHERE blocked_at IS NULL AND stage IN ('approved', 'fenced', 'drained', 'bindings_removed',
                                           'postgres_purged', 'cache_purged', 'logically_verified');
CREATE INDEX community_deletion_requests_leased ON community_deletion_requests (lease_until)
    WHERE lease_owner IS NOT NULL;

CREATE TABLE community_deletion_approvals (
    request_id       uuid PRIMARY KEY,
    community_id     uuid NOT NULL,
    inventory_digest bytea NOT NULL CONSTRAINT community_deletion_approvals_digest_len CHECK (octet_length(inventory_digest) = 32),
    approved_by      text NOT NULL CONSTRAINT community_deletion_approvals_approved_by_set CHECK (btrim(approved_by) <> ''),
    note             text,
    approved_at      timestamptz NOT NULL DEFAULT now(),
    -- An approval exists only for the exact inventory it names.
    CONSTRAINT community_deletion_approvals_binding FOREIGN KEY (request_id, community_id, inventory_digest)
        REFERENCES community_deletion_requests (id, community_id, inventory_digest) ON DELETE RESTRICT
);

CREATE TABLE community_deletion_checkpoints (
    request_id       uuid NOT NULL REFERENCES community_deletion_requests (id) ON DELETE RESTRICT,
    sequence         bigint GENERATED ALWAYS AS IDENTITY,
    stage            text NOT NULL,
    unit_key         text NOT NULL,
    status           text NOT NULL CONSTRAINT community_deletion_checkpoints_status_known CHECK (status IN ('started', 'completed', 'failed')),
    lease_generation bigint NOT NULL CONSTRAINT community_deletion_checkpoints_generation_positive CHECK (lease_generation > 0),
    attempts         integer NOT NULL DEFAULT 1 CONSTRAINT community_deletion_checkpoints_attempts_positive CHECK (attempts > 0),
    detail           jsonb NOT NULL DEFAULT '{}',
    error            text,
    started_at       timestamptz NOT NULL DEFAULT now(),
    completed_at     timestamptz,
    PRIMARY KEY (request_id, sequence),
    CONSTRAINT community_deletion_checkpoints_unit UNIQUE (request_id, stage, unit_key),
    CONSTRAINT community_deletion_checkpoints_completed_shape CHECK ((status = 'completed') = (completed_at IS NOT NULL)),
    CONSTRAINT community_deletion_checkpoints_failed_shape CHECK ((status = 'failed') = (error IS NOT NULL))
);

-- The post-fence object manifest, in chunks of at most
-- BUZZ_DELETION_MANIFEST_CHUNK_KEYS keys, so neither the executor nor a
-- row holds a whole community's keys at once. key_class says what deleting
-- a key means: a binding is the community's own object; a shared blob is
-- deleted only when no other community still references it.
CREATE TABLE community_deletion_manifest_keys (
    request_id uuid NOT NULL REFERENCES community_deletion_requests (id) ON DELETE CASCADE,
    chunk_no   bigint NOT NULL CONSTRAINT community_deletion_manifest_keys_chunk_no CHECK (chunk_no >= 0),
    prefix     text NOT NULL,
    key_class  text NOT NULL CONSTRAINT community_deletion_manifest_keys_class CHECK (key_class IN ('binding', 'shared_blob')),
    keys       jsonb NOT NULL CONSTRAINT community_deletion_manifest_keys_array CHECK (jsonb_typeof(keys) = 'array' AND jsonb_array_length(keys) > 0),
    deleted_at timestamptz,
    PRIMARY KEY (request_id, chunk_no)
);

-- Proof that a serving process is in the middle of an external side effect
-- (an object upload, a Redis write) for a community: the fence waits for
-- these to finish or expire before any destructive step.
CREATE TABLE community_serving_write_leases (
    id               uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    community_id     uuid NOT NULL REFERENCES communities (id),
    operation        text NOT NULL,
    owner            text NOT NULL,
    fence_generation bigint NOT NULL CONSTRAINT community_serving_write_leases_generation CHECK (fence_generation >= 0),
    lease_until      timestamptz NOT NULL,
    heartbeat_at     timestamptz NOT NULL DEFAULT now(),
    created_at       timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX community_serving_write_leases_by_community ON community_serving_write_leases (community_id, lease_until);

CREATE TABLE community_deletion_executor_heartbeats (
    executor_id  text PRIMARY KEY,
    mode         text NOT NULL CONSTRAINT community_deletion_executor_heartbeats_mode CHECK (mode IN ('run', 'drain')),
    request_id   uuid REFERENCES community_deletion_requests (id) ON DELETE SET NULL,
    lease_generation bigint,
    stage        text,
    started_at   timestamptz NOT NULL DEFAULT now(),
    heartbeat_at timestamptz NOT NULL DEFAULT now(),
    draining     boolean NOT NULL DEFAULT false,
    stopped_at   timestamptz
);

-- What a whole-bucket sweep found outside the known key shapes. Observational:
-- it never gates a deletion.
CREATE TABLE storage_taxonomy_sweeps (
    id                   uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    started_at           timestamptz NOT NULL,
    completed_at         timestamptz NOT NULL DEFAULT clock_timestamp(),
    listed_objects       bigint NOT NULL CHECK (listed_objects >= 0),
    unknown_object_count bigint NOT NULL CHECK (unknown_object_count >= 0),
    unknown_key_sample   jsonb NOT NULL DEFAULT '[]',
    CONSTRAINT storage_taxonomy_sweeps_order CHECK (completed_at >= started_at)
);

INSERT INTO _operator_global_tables (table_name, reason) VALUES
    ('community_deletion_requests', 'deletion control plane: outlives its community as evidence'),
    ('community_deletion_approvals', 'deletion control plane: approval evidence'),
    ('community_deletion_checkpoints', 'deletion control plane: progress evidence'),
    ('community_deletion_manifest_keys', 'deletion control plane: post-fence object manifest'),
    ('community_serving_write_leases', 'deletion control plane: in-flight external side effects'),
    ('community_deletion_executor_heartbeats', 'deletion control plane: executor liveness'),
    ('storage_taxonomy_sweeps', 'whole-bucket sweep results');

-- The write check every community-scoped row trigger runs. Order matters:
-- the isolation check comes first, so no forged setting is honoured under
-- REPEATABLE READ or SERIALIZABLE, where the state read below would come
-- from a snapshot older than the fence.
CREATE FUNCTION assert_community_write_allowed(community uuid) RETURNS void
    LANGUAGE plpgsql VOLATILE
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

-- For statements that touch many communities at once (claims, reapers):
-- put it in the WHERE so a fenced community's rows are skipped instead of
-- aborting the whole statement through the row trigger.
CREATE FUNCTION community_write_allowed(community uuid) RETURNS boolean
    LANGUAGE plpgsql VOLATILE
    AS $$
DECLARE
    state text;
BEGIN
    IF current_setting('transaction_isolation') <> 'read committed' THEN
        RAISE EXCEPTION 'community writes require READ COMMITTED isolation (this transaction is %)',
            current_setting('transaction_isolation') USING ERRCODE = '25000';
    END IF;
    IF community IS NULL THEN
        RETURN true;
    END IF;
    PERFORM pg_advisory_xact_lock_shared(community_deletion_lock_key(community));
    SELECT c.deletion_state INTO state FROM communities c WHERE c.id = community;
    RETURN state = 'active';
END
$$;

CREATE FUNCTION enforce_community_write_fence() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        PERFORM assert_community_write_allowed(NEW.community_id);
        RETURN NEW;
    ELSIF TG_OP = 'DELETE' THEN
        PERFORM assert_community_write_allowed(OLD.community_id);
        RETURN OLD;
    END IF;
    IF NEW.community_id IS NOT DISTINCT FROM OLD.community_id OR NEW.community_id IS NULL THEN
        PERFORM assert_community_write_allowed(OLD.community_id);
    ELSIF OLD.community_id IS NULL THEN
        PERFORM assert_community_write_allowed(NEW.community_id);
    ELSIF OLD.community_id < NEW.community_id THEN
        -- Both, in ascending order, so two movers cannot deadlock.
        PERFORM assert_community_write_allowed(OLD.community_id);
        PERFORM assert_community_write_allowed(NEW.community_id);
    ELSE
        PERFORM assert_community_write_allowed(NEW.community_id);
        PERFORM assert_community_write_allowed(OLD.community_id);
    END IF;
    RETURN NEW;
END
$$;

-- Attaches the fence to one table. Every migration that adds a table with
-- a community_id column must call it; readiness and the deletion executor
-- refuse to run while a community-scoped table lacks it. The trigger name
-- starts with an underscore so it fires before the table's other BEFORE
-- triggers (they fire in name order): a fenced write is refused before
-- any of them takes locks or does work.
CREATE FUNCTION attach_community_write_fence(target regclass) RETURNS void
    LANGUAGE plpgsql
    AS $$
DECLARE
    rel record;
BEGIN
    SELECT c.relname, c.relkind, c.relispartition, n.nspname INTO rel
    FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
    WHERE c.oid = target;
    IF rel.relkind NOT IN ('r', 'p') OR rel.relispartition OR rel.nspname <> current_schema() THEN
        RAISE EXCEPTION 'community write fence: % is not a table (or partitioned parent) in schema %', target, current_schema()
            USING ERRCODE = '42809';
    END IF;
    IF community_write_fence_excluded_table(rel.relname) THEN
        RETURN;
    END IF;
    IF NOT EXISTS (SELECT FROM pg_attribute a WHERE a.attrelid = target AND a.attname = 'community_id' AND NOT a.attisdropped) THEN
        RAISE EXCEPTION 'community write fence: % has no community_id column', target USING ERRCODE = '42703';
    END IF;
    IF NOT EXISTS (SELECT FROM pg_trigger t WHERE t.tgrelid = target AND t.tgname = '_community_write_fence') THEN
        EXECUTE format('CREATE TRIGGER _community_write_fence BEFORE INSERT OR UPDATE OR DELETE ON %s '
                       'FOR EACH ROW EXECUTE FUNCTION enforce_community_write_fence()', target);
    END IF;
END
$$;

-- The community-scoped catalog, read live: tables (not partitions) of this
-- schema with a community_id column, minus the deletion control tables.
CREATE FUNCTION community_scoped_tables() RETURNS SETOF text
    LANGUAGE sql STABLE
    AS $$
    SELECT c.relname::text
    FROM pg_class c
    JOIN pg_namespace n ON n.oid = c.relnamespace
    WHERE n.nspname = current_schema() AND c.relkind IN ('r', 'p') AND NOT c.relispartition
      AND NOT community_write_fence_excluded_table(c.relname)
      AND EXISTS (SELECT FROM pg_attribute a WHERE a.attrelid = c.oid AND a.attname = 'community_id' AND NOT a.attisdropped)
    ORDER BY 1
$$;

-- Tables carrying an enabled fence: a BEFORE ROW trigger for INSERT,
-- UPDATE and DELETE (tgtype bits 1, 2, 4, 8, 16) running the fence function.
CREATE FUNCTION community_fenced_tables() RETURNS SETOF text
    LANGUAGE sql STABLE
    AS $$
    SELECT DISTINCT c.relname::text
    FROM pg_trigger t
    JOIN pg_class c ON c.oid = t.tgrelid
    JOIN pg_namespace n ON n.oid = c.relnamespace
    WHERE n.nspname = current_schema() AND NOT t.tgisinternal AND t.tgenabled = 'O'
      AND t.tgfoid = 'enforce_community_write_fence'::regproc
      AND (t.tgtype::int & 31) = 31
    ORDER BY 1
$$;

-- Which community-scoped table references which: the purge deletes
-- referencing rows before the rows they reference.
CREATE FUNCTION community_scoped_foreign_keys() RETURNS TABLE (child text, parent text)
    LANGUAGE sql STABLE
    AS $$
    SELECT DISTINCT ch.relname::text, pa.relname::text
    FROM pg_constraint k
    JOIN pg_class ch ON ch.oid = k.conrelid
    JOIN pg_class pa ON pa.oid = k.confrelid
    WHERE k.contype = 'f' AND k.conrelid <> k.confrelid
      AND ch.relname::text IN (SELECT community_scoped_tables())
      AND pa.relname::text IN (SELECT community_scoped_tables())
    ORDER BY 1, 2
$$;

CREATE FUNCTION communities_tombstone_guard() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
DECLARE
    executor_community text := current_setting('buzz.deletion_executor_community', true);
    executor_generation text := current_setting('buzz.deletion_fence_generation', true);
BEGIN
    IF TG_OP = 'DELETE' THEN
        IF OLD.deletion_state = 'active' AND OLD.deleted_at IS NULL THEN
            RETURN OLD;
        END IF;
        RAISE EXCEPTION 'tombstones are permanent: community % is %', OLD.id, OLD.deletion_state USING ERRCODE = '55000';
    END IF;
    IF executor_community = OLD.id::text AND executor_generation ~ '^[0-9]{1,18}$'
       AND executor_generation::bigint = greatest(NEW.deletion_fence_generation, OLD.deletion_fence_generation)
       AND current_setting('buzz.deletion_lease_generation', true) ~ '^[0-9]{1,18}$'
       AND EXISTS (SELECT FROM community_deletion_requests r
                   WHERE r.community_id = OLD.id
                     AND r.lease_generation = current_setting('buzz.deletion_lease_generation', true)::bigint
                     AND r.lease_until >= now() AND r.blocked_at IS NULL) THEN
        RETURN NEW;
    END IF;
    IF OLD.deletion_state <> 'active'
       OR NEW.deletion_state IS DISTINCT FROM OLD.deletion_state
       OR NEW.deletion_fence_generation IS DISTINCT FROM OLD.deletion_fence_generation
       OR NEW.deleted_at IS DISTINCT FROM OLD.deleted_at THEN
        RAISE EXCEPTION 'community % is % and only its deletion executor may change its lifecycle', OLD.id, OLD.deletion_state
            USING ERRCODE = '55000';
    END IF;
    RETURN NEW;
END
$$;

CREATE TRIGGER communities_tombstone_guard BEFORE UPDATE OR DELETE ON communities
    FOR EACH ROW EXECUTE FUNCTION communities_tombstone_guard();

-- The stage order. Each step is taken one at a time, never skipped, never
-- undone.
CREATE FUNCTION community_deletion_next_stage(stage text) RETURNS text
    LANGUAGE sql IMMUTABLE
    AS $$
    SELECT CASE stage
        WHEN 'submitted' THEN 'inventoried'
        WHEN 'inventoried' THEN 'approved'
        WHEN 'approved' THEN 'fenced'
        WHEN 'fenced' THEN 'drained'
        WHEN 'drained' THEN 'bindings_removed'
        WHEN 'bindings_removed' THEN 'postgres_purged'
        WHEN 'postgres_purged' THEN 'cache_purged'
        WHEN 'cache_purged' THEN 'logically_verified'
        WHEN 'logically_verified' THEN 'retention_pending'
    END
$$;

CREATE FUNCTION community_deletion_runnable_stage(stage text) RETURNS boolean
    LANGUAGE sql IMMUTABLE
    AS $$ SELECT stage IN ('approved', 'fenced', 'drained', 'bindings_removed', 'postgres_purged', 'cache_purged', 'logically_verified') $$;

-- The request row's own rules: identity never changes, a frozen inventory
-- or object manifest never changes, stages move one step forward only (and
-- past the approval only with an approval of this exact inventory), a
-- blocked request holds still, and a finished request is evidence that
-- never changes again.
CREATE FUNCTION community_deletion_requests_guard() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
BEGIN
    IF TG_OP = 'DELETE' THEN
        RAISE EXCEPTION 'deletion requests are evidence and are never deleted' USING ERRCODE = '23000';
    END IF;
    IF OLD.stage = 'retention_pending' THEN
        RAISE EXCEPTION 'deletion request % is finished and cannot change', OLD.id USING ERRCODE = '23000';
    END IF;
    IF NEW.id <> OLD.id OR NEW.community_id <> OLD.community_id OR NEW.community_host <> OLD.community_host
       OR NEW.requested_by <> OLD.requested_by OR NEW.created_at <> OLD.created_at THEN
        RAISE EXCEPTION 'deletion request % cannot be retargeted', OLD.id USING ERRCODE = '23000';
    END IF;
    IF OLD.inventory_frozen_at IS NOT NULL
       AND (NEW.inventory_manifest IS DISTINCT FROM OLD.inventory_manifest
            OR NEW.inventory_digest IS DISTINCT FROM OLD.inventory_digest
            OR NEW.inventory_frozen_at IS DISTINCT FROM OLD.inventory_frozen_at) THEN
        RAISE EXCEPTION 'deletion request %: the frozen inventory is immutable', OLD.id USING ERRCODE = '23000';
    END IF;
    IF OLD.destructive_frozen_at IS NOT NULL
       AND (NEW.destructive_manifest IS DISTINCT FROM OLD.destructive_manifest
            OR NEW.destructive_frozen_at IS DISTINCT FROM OLD.destructive_frozen_at) THEN
        RAISE EXCEPTION 'deletion request %: the frozen object manifest is immutable', OLD.id USING ERRCODE = '23000';
    END IF;
    IF OLD.fence_generation IS NOT NULL AND NEW.fence_generation IS DISTINCT FROM OLD.fence_generation THEN
        RAISE EXCEPTION 'deletion request %: the fence generation is immutable', OLD.id USING ERRCODE = '23000';
    END IF;
    IF NEW.lease_generation < OLD.lease_generation THEN
        RAISE EXCEPTION 'deletion request %: lease generations only grow', OLD.id USING ERRCODE = '23000';
    END IF;
    IF NEW.stage <> OLD.stage THEN
        IF NEW.stage IS DISTINCT FROM community_deletion_next_stage(OLD.stage) THEN
            RAISE EXCEPTION 'deletion request %: illegal stage transition % -> %', OLD.id, OLD.stage, NEW.stage USING ERRCODE = '23000';
        END IF;
        IF OLD.blocked_at IS NOT NULL OR NEW.blocked_at IS NOT NULL THEN
            RAISE EXCEPTION 'deletion request % is blocked and cannot advance', OLD.id USING ERRCODE = '23000';
        END IF;
        IF NEW.stage = 'inventoried' AND NEW.inventory_frozen_at IS NULL THEN
            RAISE EXCEPTION 'deletion request %: no frozen inventory', OLD.id USING ERRCODE = '23000';
        END IF;
        IF NEW.stage = 'approved' AND NOT EXISTS (
            SELECT FROM community_deletion_approvals a
            WHERE a.request_id = NEW.id AND a.community_id = NEW.community_id AND a.inventory_digest = NEW.inventory_digest) THEN
            RAISE EXCEPTION 'deletion request %: no approval of this exact inventory', OLD.id USING ERRCODE = '23000';
        END IF;
        IF NEW.stage = 'fenced' AND NEW.fence_generation IS NULL THEN
            RAISE EXCEPTION 'deletion request %: fenced without a fence generation', OLD.id USING ERRCODE = '23000';
        END IF;
        IF NEW.stage = 'bindings_removed' AND EXISTS (
            SELECT FROM community_deletion_manifest_keys k WHERE k.request_id = NEW.id AND k.deleted_at IS NULL) THEN
            RAISE EXCEPTION 'deletion request %: manifest chunks remain undeleted', OLD.id USING ERRCODE = '23000';
        END IF;
    END IF;
    NEW.updated_at := now();
    RETURN NEW;
END
$$;

CREATE TRIGGER community_deletion_requests_guard BEFORE UPDATE OR DELETE ON community_deletion_requests
    FOR EACH ROW EXECUTE FUNCTION community_deletion_requests_guard();

CREATE FUNCTION community_deletion_approvals_guard() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
BEGIN
    RAISE EXCEPTION 'approval evidence is immutable' USING ERRCODE = '23000';
END
$$;

CREATE TRIGGER community_deletion_approvals_guard BEFORE UPDATE OR DELETE ON community_deletion_approvals
    FOR EACH ROW EXECUTE FUNCTION community_deletion_approvals_guard();

-- Manifest chunks are written only while the object manifest is being
-- built (stage fenced, not yet frozen); afterwards the only change is the
-- one-way stamp that a chunk's objects are gone, and chunks are removed
-- only once verification has proven the community absent everywhere.
CREATE FUNCTION community_deletion_manifest_keys_guard() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
DECLARE
    req record;
BEGIN
    IF TG_OP = 'UPDATE' THEN
        IF OLD.deleted_at IS NOT NULL OR NEW.deleted_at IS NULL
           OR NEW.request_id <> OLD.request_id OR NEW.chunk_no <> OLD.chunk_no OR NEW.prefix <> OLD.prefix
           OR NEW.key_class <> OLD.key_class OR NEW.keys <> OLD.keys THEN
            RAISE EXCEPTION 'manifest chunk %/%: only the one-way deleted stamp may change', OLD.request_id, OLD.chunk_no
                USING ERRCODE = '23000';
        END IF;
        RETURN NEW;
    END IF;
    IF TG_OP = 'INSERT' THEN
        SELECT stage, destructive_frozen_at INTO req FROM community_deletion_requests WHERE id = NEW.request_id FOR UPDATE;
        IF NOT FOUND OR req.stage <> 'fenced' OR req.destructive_frozen_at IS NOT NULL THEN
            RAISE EXCEPTION 'manifest chunk %/%: chunks are written only between the fence and the manifest freeze', NEW.request_id, NEW.chunk_no
                USING ERRCODE = '23000';
        END IF;
        RETURN NEW;
    END IF;
    SELECT stage, destructive_frozen_at INTO req FROM community_deletion_requests WHERE id = OLD.request_id FOR UPDATE;
    IF NOT FOUND OR req.destructive_frozen_at IS NULL OR req.stage IN ('logically_verified', 'retention_pending') THEN
        RETURN OLD;
    END IF;
    RAISE EXCEPTION 'manifest chunk %/% cannot be removed mid-execution', OLD.request_id, OLD.chunk_no USING ERRCODE = '23000';
END
$$;

CREATE TRIGGER community_deletion_manifest_keys_guard BEFORE INSERT OR UPDATE OR DELETE ON community_deletion_manifest_keys
    FOR EACH ROW EXECUTE FUNCTION community_deletion_manifest_keys_guard();

-- Migrations hold this key exclusively while they run; the destructive
-- steps (purge, final verification) hold it shared, so a new
-- community-scoped table cannot appear between their catalog check and
-- their commit.
CREATE FUNCTION community_schema_destruction_lock_key() RETURNS bigint
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    AS $$ SELECT 7094711454081051697::bigint $$;

-- Everything that makes deletion unsafe to run on this catalog, by table:
-- a community-scoped table without an enabled fence (someone added a table
-- and forgot attach_community_write_fence), or a missing tombstone guard.
-- Empty means ready. Relay readiness and every destructive step read it.
CREATE FUNCTION community_deletion_catalog_problems() RETURNS TABLE (table_name text, problem text)
    LANGUAGE sql STABLE
    AS $$
    SELECT s, 'community-scoped table has no enabled write fence (call attach_community_write_fence)'
    FROM community_scoped_tables() s
    WHERE s NOT IN (SELECT community_fenced_tables())
    UNION ALL
    SELECT 'communities', 'tombstone guard trigger is missing or disabled'
    WHERE NOT EXISTS (SELECT FROM pg_trigger t
                      WHERE t.tgrelid = 'communities'::regclass AND t.tgname = 'communities_tombstone_guard'
                        AND t.tgenabled = 'O')
    ORDER BY 1
$$;

CREATE FUNCTION community_deletion_raise_stale(request uuid, generation bigint, stage text) RETURNS void
    LANGUAGE plpgsql
    AS $$
BEGIN
    RAISE EXCEPTION 'stale deletion lease: request % generation % no longer owns stage %', request, generation, stage
        USING ERRCODE = 'BZ001';
END
$$;

-- The lease check every executor step runs first: this owner, this
-- generation, unexpired, not blocked, at the expected stage, and still
-- approved for its exact inventory.
CREATE FUNCTION community_deletion_requests_verify_lease(request uuid, owner text, generation bigint, expected_stage text)
    RETURNS community_deletion_requests
    LANGUAGE plpgsql
    AS $$
DECLARE
    r community_deletion_requests;
BEGIN
    SELECT q.* INTO r FROM community_deletion_requests q
    JOIN community_deletion_approvals a
      ON a.request_id = q.id AND a.community_id = q.community_id AND a.inventory_digest = q.inventory_digest
    WHERE q.id = request AND q.lease_owner = owner AND q.lease_generation = generation
      AND q.lease_until >= now() AND q.blocked_at IS NULL AND q.stage = expected_stage;
    IF NOT FOUND THEN
        PERFORM community_deletion_raise_stale(request, generation, expected_stage);
    END IF;
    RETURN r;
END
$$;

-- Verifies the lease and the fence, then presents the executor's identity
-- to the fence triggers for the rest of this transaction only.
CREATE FUNCTION community_deletion_requests_enter_executor(request uuid, owner text, generation bigint, expected_stage text)
    RETURNS community_deletion_requests
    LANGUAGE plpgsql
    AS $$
DECLARE
    r community_deletion_requests;
BEGIN
    r := community_deletion_requests_verify_lease(request, owner, generation, expected_stage);
    IF r.fence_generation IS NULL OR NOT EXISTS (
        SELECT FROM communities c WHERE c.id = r.community_id AND c.deletion_state IN ('fenced', 'tombstone')
          AND c.deletion_fence_generation = r.fence_generation) THEN
        RAISE EXCEPTION 'stale lease or fencing generation for deletion % (stage %)', request, expected_stage
            USING ERRCODE = 'BZ001';
    END IF;
    PERFORM set_config('buzz.deletion_executor_community', r.community_id::text, true);
    PERFORM set_config('buzz.deletion_fence_generation', r.fence_generation::text, true);
    PERFORM set_config('buzz.deletion_lease_generation', generation::text, true);
    RETURN r;
END
$$;

CREATE FUNCTION community_deletion_checkpoints_upsert(request uuid, stage text, unit_key text, status text,
                                              generation bigint, detail jsonb, error text)
    RETURNS void
    LANGUAGE sql
    AS $$
    INSERT INTO community_deletion_checkpoints AS k (request_id, stage, unit_key, status, lease_generation, detail, error, completed_at)
    VALUES (request, stage, unit_key, status, greatest(generation, 1), coalesce(detail, '{}'), error,
            CASE WHEN status = 'completed' THEN now() END)
    ON CONFLICT (request_id, stage, unit_key) DO UPDATE
    SET status = EXCLUDED.status, lease_generation = EXCLUDED.lease_generation, detail = EXCLUDED.detail,
        error = EXCLUDED.error, completed_at = EXCLUDED.completed_at, attempts = k.attempts + 1
$$;

-- Claims one runnable request (the named one, or the oldest due one)
-- under a new lease generation. A request without an approval of its
-- exact inventory is never claimable, whatever its stage column says. When
-- the catalog is unsafe the request is blocked instead, naming the tables,
-- and returned unleased.
CREATE FUNCTION community_deletion_requests_claim(request uuid, owner text, lease_seconds double precision)
    RETURNS SETOF community_deletion_requests
    LANGUAGE plpgsql
    AS $$
DECLARE
    r community_deletion_requests;
    problems text;
BEGIN
    SELECT q.* INTO r FROM community_deletion_requests q
    JOIN community_deletion_approvals a
      ON a.request_id = q.id AND a.community_id = q.community_id AND a.inventory_digest = q.inventory_digest
    WHERE (request IS NULL OR q.id = request)
      AND community_deletion_runnable_stage(q.stage) AND q.blocked_at IS NULL
      AND q.next_attempt_at <= now()
      AND (q.lease_until IS NULL OR q.lease_until < now())
    ORDER BY q.next_attempt_at, q.created_at, q.id
    LIMIT 1
    FOR UPDATE OF q SKIP LOCKED;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    SELECT string_agg(p.table_name || ': ' || p.problem, '; ') INTO problems FROM community_deletion_catalog_problems() p;
    IF problems IS NOT NULL THEN
        PERFORM community_deletion_checkpoints_upsert(r.id, r.stage, 'claim:catalog_validation', 'failed', r.lease_generation,
                                              jsonb_build_object('problems', problems), 'catalog drift: ' || problems);
        UPDATE community_deletion_requests
        SET blocked_at = now(), blocked_reason = 'catalog drift: ' || problems,
            last_error = 'catalog drift: ' || problems, last_error_at = now(), lease_owner = NULL, lease_until = NULL
        WHERE id = r.id
        RETURNING * INTO r;
        RETURN NEXT r;
        RETURN;
    END IF;
    UPDATE community_deletion_requests
    SET lease_owner = owner, lease_generation = lease_generation + 1,
        lease_until = now() + make_interval(secs => lease_seconds), attempts = attempts + 1
    WHERE id = r.id
    RETURNING * INTO r;
    RETURN NEXT r;
END
$$;

-- Extends the lease and records the executor's liveness. Raises when the
-- lease was lost (expired and maybe taken over, blocked, or finished).
CREATE FUNCTION community_deletion_requests_heartbeat(request uuid, owner text, generation bigint, mode text,
                                             draining boolean, lease_seconds double precision)
    RETURNS timestamptz
    LANGUAGE plpgsql
    AS $$
DECLARE
    r community_deletion_requests;
BEGIN
    UPDATE community_deletion_requests q
    SET lease_until = now() + make_interval(secs => lease_seconds)
    WHERE q.id = request AND q.lease_owner = owner AND q.lease_generation = generation
      AND q.lease_until >= now() AND q.blocked_at IS NULL AND community_deletion_runnable_stage(q.stage)
      AND EXISTS (SELECT FROM community_deletion_approvals a
                  WHERE a.request_id = q.id AND a.community_id = q.community_id AND a.inventory_digest = q.inventory_digest)
    RETURNING q.* INTO r;
    IF NOT FOUND THEN
        PERFORM community_deletion_raise_stale(request, generation, 'heartbeat');
    END IF;
    PERFORM community_deletion_executor_heartbeats_beat(owner, mode, request, generation, r.stage, draining, false);
    RETURN r.lease_until;
END
$$;

CREATE FUNCTION community_deletion_executor_heartbeats_beat(executor text, mode text, request uuid, generation bigint,
                                                 stage text, draining boolean, stopped boolean)
    RETURNS void
    LANGUAGE sql
    AS $$
    INSERT INTO community_deletion_executor_heartbeats AS h
        (executor_id, mode, request_id, lease_generation, stage, draining, stopped_at)
    VALUES (executor, mode, request, generation, stage, draining, CASE WHEN stopped THEN now() END)
    ON CONFLICT (executor_id) DO UPDATE
    SET mode = EXCLUDED.mode, request_id = EXCLUDED.request_id, lease_generation = EXCLUDED.lease_generation,
        stage = EXCLUDED.stage, heartbeat_at = now(), draining = EXCLUDED.draining, stopped_at = EXCLUDED.stopped_at
$$;

-- Gives the lease back (shutdown, end of a run) only while this owner and
-- generation still hold it: a successor's lease is never cleared.
CREATE FUNCTION community_deletion_requests_release(request uuid, owner text, generation bigint) RETURNS boolean
    LANGUAGE sql
    AS $$
    WITH released AS (
        UPDATE community_deletion_requests SET lease_owner = NULL, lease_until = NULL
        WHERE id = request AND lease_owner = owner AND lease_generation = generation
          AND stage <> 'retention_pending'
        RETURNING 1
    )
    SELECT EXISTS (SELECT FROM released)
$$;

-- Moves the request exactly one stage forward under its lease. Any
-- successful step resets the failure streak.
CREATE FUNCTION community_deletion_requests_advance(request uuid, owner text, generation bigint, from_stage text,
                                           new_fence_generation bigint)
    RETURNS community_deletion_requests
    LANGUAGE plpgsql
    AS $$
DECLARE
    r community_deletion_requests;
    to_stage text := community_deletion_next_stage(from_stage);
BEGIN
    UPDATE community_deletion_requests
    SET stage = to_stage,
        fence_generation = coalesce(fence_generation, new_fence_generation),
        retry_count = 0, retry_stage = NULL, last_error = NULL, last_error_at = NULL,
        completed_at = CASE WHEN to_stage = 'retention_pending' THEN now() END,
        lease_owner = CASE WHEN to_stage = 'retention_pending' THEN NULL ELSE lease_owner END,
        lease_until = CASE WHEN to_stage = 'retention_pending' THEN NULL ELSE lease_until END
    WHERE id = request AND stage = from_stage AND lease_owner = owner AND lease_generation = generation
      AND lease_until >= now() AND blocked_at IS NULL
    RETURNING * INTO r;
    IF NOT FOUND THEN
        PERFORM community_deletion_raise_stale(request, generation, from_stage);
    END IF;
    RETURN r;
END
$$;

-- Records a failed stage attempt. A permanent failure, or the
-- max_streak-th consecutive failure at the same stage, blocks the request
-- until an operator unblocks it; otherwise the next attempt waits an
-- exponentially growing delay (capped at an hour). The lease is released
-- either way.
CREATE FUNCTION community_deletion_requests_record_failure(request uuid, owner text, generation bigint, failed_stage text,
                                                  message text, permanent boolean,
                                                  base_delay_seconds double precision, max_streak integer)
    RETURNS community_deletion_requests
    LANGUAGE plpgsql
    AS $$
DECLARE
    r community_deletion_requests;
    streak integer;
    blocks boolean;
BEGIN
    SELECT * INTO r FROM community_deletion_requests WHERE id = request FOR UPDATE;
    IF NOT FOUND OR r.lease_owner IS DISTINCT FROM owner OR r.lease_generation <> generation
       OR r.lease_until < now() OR r.stage <> failed_stage THEN
        PERFORM community_deletion_raise_stale(request, generation, failed_stage);
    END IF;
    streak := CASE WHEN r.retry_stage = failed_stage THEN r.retry_count + 1 ELSE 1 END;
    blocks := permanent OR streak >= max_streak;
    PERFORM community_deletion_checkpoints_upsert(request, failed_stage, 'stage', 'failed', generation,
                                          jsonb_build_object('permanent', permanent, 'streak', streak), message);
    UPDATE community_deletion_requests
    SET retry_count = streak, retry_stage = failed_stage, last_error = message, last_error_at = now(),
        blocked_at = CASE WHEN blocks THEN now() END,
        blocked_reason = CASE
            WHEN permanent THEN message
            WHEN blocks THEN format('%s consecutive failures at stage %s: %s', streak, failed_stage, message) END,
        next_attempt_at = CASE WHEN blocks THEN next_attempt_at
            ELSE now() + make_interval(secs => least(base_delay_seconds * power(2, streak - 1), 3600)) END,
        lease_owner = NULL, lease_until = NULL
    WHERE id = request
    RETURNING * INTO r;
    RETURN r;
END
$$;

-- The audited way out of a block: who and why are recorded as a
-- checkpoint next to the block they cleared; stage, approval, digest and
-- fence generation are untouched.
CREATE FUNCTION community_deletion_requests_unblock(request uuid, unblocked_by text, reason text)
    RETURNS community_deletion_requests
    LANGUAGE plpgsql
    AS $$
DECLARE
    r community_deletion_requests;
BEGIN
    IF btrim(coalesce(unblocked_by, '')) = '' OR btrim(coalesce(reason, '')) = '' THEN
        RAISE EXCEPTION 'unblock needs who and why' USING ERRCODE = '22023';
    END IF;
    SELECT * INTO r FROM community_deletion_requests WHERE id = request FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'no deletion request %', request USING ERRCODE = 'BZ002';
    END IF;
    IF r.blocked_at IS NULL OR r.stage = 'retention_pending' THEN
        RAISE EXCEPTION 'deletion request % is not blocked', request USING ERRCODE = 'BZ002';
    END IF;
    IF r.lease_until >= now() THEN
        RAISE EXCEPTION 'deletion request % is leased by %', request, r.lease_owner USING ERRCODE = 'BZ002';
    END IF;
    PERFORM community_deletion_checkpoints_upsert(request, r.stage, 'operator_unblock:' || gen_random_uuid(), 'completed',
        r.lease_generation,
        jsonb_build_object('unblocked_by', left(unblocked_by, 512), 'reason', left(reason, 4096),
                           'previous_block', r.blocked_reason, 'previous_retry_count', r.retry_count), NULL);
    UPDATE community_deletion_requests
    SET blocked_at = NULL, blocked_reason = NULL, retry_count = 0, retry_stage = NULL,
        last_error = NULL, last_error_at = NULL, next_attempt_at = now(), lease_owner = NULL, lease_until = NULL
    WHERE id = request
    RETURNING * INTO r;
    RETURN r;
END
$$;

-- Blocks a request whose executor could not even start (the object store
-- or Redis could not be reached or configured), so the failure is on
-- record without any lease; repeated attempts count up on one checkpoint.
CREATE FUNCTION community_deletion_requests_block_preclaim(request uuid, message text)
    RETURNS community_deletion_requests
    LANGUAGE plpgsql
    AS $$
DECLARE
    r community_deletion_requests;
BEGIN
    SELECT * INTO r FROM community_deletion_requests WHERE id = request FOR UPDATE;
    IF NOT FOUND OR r.stage = 'retention_pending' OR r.lease_until >= now() THEN
        RAISE EXCEPTION 'deletion request % is missing, finished or leased', request USING ERRCODE = 'BZ002';
    END IF;
    PERFORM community_deletion_checkpoints_upsert(request, r.stage, 'pre_claim:service_setup', 'failed', r.lease_generation,
                                                  jsonb_build_object('error', message), message);
    UPDATE community_deletion_requests
    SET blocked_at = coalesce(blocked_at, now()), blocked_reason = coalesce(blocked_reason, message),
        last_error = message, last_error_at = now()
    WHERE id = request
    RETURNING * INTO r;
    RETURN r;
END
$$;

-- Opens a request for an active community. Retrying the same submit
-- returns the request it already made.
CREATE FUNCTION community_deletion_requests_submit(target_host text, requester text, why text)
    RETURNS community_deletion_requests
    LANGUAGE plpgsql
    AS $$
DECLARE
    c communities;
    r community_deletion_requests;
BEGIN
    SELECT * INTO c FROM communities WHERE lower(host) = lower(target_host);
    IF FOUND AND c.deletion_state = 'active' AND c.deleted_at IS NULL THEN
        INSERT INTO community_deletion_requests (community_id, community_host, requested_by, reason)
        VALUES (c.id, c.host, requester, why)
        ON CONFLICT (community_id) DO NOTHING
        RETURNING * INTO r;
        IF FOUND THEN
            RETURN r;
        END IF;
        SELECT * INTO r FROM community_deletion_requests
        WHERE community_id = c.id AND stage IN ('submitted', 'inventoried') AND requested_by = requester;
        IF FOUND THEN
            RETURN r;
        END IF;
    END IF;
    RAISE EXCEPTION 'community % is missing, already requested, fenced, or tombstoned', target_host USING ERRCODE = 'BZ002';
END
$$;

CREATE FUNCTION community_deletion_requests_freeze_inventory(request uuid, manifest jsonb, digest bytea)
    RETURNS community_deletion_requests
    LANGUAGE plpgsql
    AS $$
DECLARE
    r community_deletion_requests;
BEGIN
    UPDATE community_deletion_requests
    SET inventory_manifest = manifest, inventory_digest = digest, inventory_frozen_at = now(), stage = 'inventoried'
    WHERE id = request AND stage = 'submitted' AND blocked_at IS NULL
    RETURNING * INTO r;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'deletion request % is not waiting for its inventory', request USING ERRCODE = 'BZ002';
    END IF;
    RETURN r;
END
$$;

-- Approval of one exact inventory: the caller recomputed the digest from
-- the stored manifest; it must equal the stored digest, and the approval
-- row's foreign key binds the two for good.
CREATE FUNCTION community_deletion_requests_approve(request uuid, approver text, approval_note text, recomputed_digest bytea)
    RETURNS community_deletion_requests
    LANGUAGE plpgsql
    AS $$
DECLARE
    r community_deletion_requests;
BEGIN
    SELECT * INTO r FROM community_deletion_requests WHERE id = request FOR UPDATE;
    IF NOT FOUND OR r.stage <> 'inventoried' OR r.blocked_at IS NOT NULL THEN
        RAISE EXCEPTION 'deletion request % is not waiting for approval', request USING ERRCODE = 'BZ002';
    END IF;
    IF r.inventory_digest <> recomputed_digest THEN
        RAISE EXCEPTION 'deletion request %: the inventory does not hash to its stored digest', request USING ERRCODE = 'BZ002';
    END IF;
    INSERT INTO community_deletion_approvals (request_id, community_id, inventory_digest, approved_by, note)
    VALUES (r.id, r.community_id, r.inventory_digest, approver, approval_note);
    UPDATE community_deletion_requests SET stage = 'approved', next_attempt_at = now()
    WHERE id = request
    RETURNING * INTO r;
    RETURN r;
END
$$;

-- The point of no return: no new serving-write leases, no plain writes.
-- Exclusive on the community's lock, so it waits for every open writer.
CREATE FUNCTION community_deletion_requests_begin_quiescing(request uuid, owner text, generation bigint) RETURNS void
    LANGUAGE plpgsql
    AS $$
DECLARE
    r community_deletion_requests;
    c communities;
BEGIN
    r := community_deletion_requests_verify_lease(request, owner, generation, 'approved');
    PERFORM pg_advisory_xact_lock(community_deletion_lock_key(r.community_id));
    r := community_deletion_requests_verify_lease(request, owner, generation, 'approved');
    SELECT * INTO c FROM communities WHERE id = r.community_id FOR UPDATE;
    IF c.deletion_state = 'quiescing' THEN
        RETURN;
    END IF;
    PERFORM set_config('buzz.deletion_executor_community', c.id::text, true);
    PERFORM set_config('buzz.deletion_fence_generation', c.deletion_fence_generation::text, true);
    PERFORM set_config('buzz.deletion_lease_generation', generation::text, true);
    UPDATE communities SET deletion_state = 'quiescing'
    WHERE id = c.id AND deletion_state = 'active' AND deleted_at IS NULL;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'community % cannot start quiescing from state %', c.id, c.deletion_state USING ERRCODE = 'BZ002';
    END IF;
    PERFORM community_deletion_checkpoints_upsert(request, 'approved', 'quiesce_serving_writes', 'completed', generation, '{}', NULL);
END
$$;

-- Fences the community: generation + 1, state fenced, request stage
-- fenced, all in one transaction under the exclusive community lock.
-- Refuses (for a later retry) while serving-write leases are live.
CREATE FUNCTION community_deletion_requests_fence(request uuid, owner text, generation bigint) RETURNS bigint
    LANGUAGE plpgsql
    AS $$
DECLARE
    r community_deletion_requests;
    c communities;
    live bigint;
    operations text;
    new_generation bigint;
BEGIN
    r := community_deletion_requests_verify_lease(request, owner, generation, 'approved');
    PERFORM pg_advisory_xact_lock(community_deletion_lock_key(r.community_id));
    r := community_deletion_requests_verify_lease(request, owner, generation, 'approved');
    SELECT count(*), string_agg(DISTINCT operation, ',') INTO live, operations
    FROM community_serving_write_leases WHERE community_id = r.community_id AND lease_until >= now();
    IF live > 0 THEN
        RAISE EXCEPTION 'serving writes have not drained: % live leases (%)', live, operations USING ERRCODE = 'BZ003';
    END IF;
    SELECT * INTO c FROM communities WHERE id = r.community_id FOR UPDATE;
    new_generation := c.deletion_fence_generation + 1;
    PERFORM set_config('buzz.deletion_executor_community', c.id::text, true);
    PERFORM set_config('buzz.deletion_fence_generation', new_generation::text, true);
    PERFORM set_config('buzz.deletion_lease_generation', generation::text, true);
    UPDATE communities SET deletion_state = 'fenced', deletion_fence_generation = new_generation
    WHERE id = c.id AND deletion_state = 'quiescing';
    IF NOT FOUND THEN
        RAISE EXCEPTION 'community % cannot be fenced from state %', c.id, c.deletion_state USING ERRCODE = 'BZ002';
    END IF;
    PERFORM community_deletion_requests_advance(request, owner, generation, 'approved', new_generation);
    PERFORM community_deletion_checkpoints_upsert(request, 'approved', 'activate_fence', 'completed', generation,
                                          jsonb_build_object('fence_generation', new_generation), NULL);
    RETURN new_generation;
END
$$;

-- Freezes the post-fence object manifest (per-prefix counts and digests,
-- checked by the caller against the stored chunks). An identical retry
-- succeeds; a different manifest fails closed.
CREATE FUNCTION community_deletion_requests_freeze_objects(request uuid, owner text, generation bigint, manifest jsonb) RETURNS void
    LANGUAGE plpgsql
    AS $$
DECLARE
    r community_deletion_requests;
BEGIN
    r := community_deletion_requests_enter_executor(request, owner, generation, 'fenced');
    SELECT * INTO r FROM community_deletion_requests WHERE id = request FOR UPDATE;
    IF r.destructive_frozen_at IS NOT NULL THEN
        IF r.destructive_manifest <> manifest THEN
            RAISE EXCEPTION 'deletion request %: object manifest drifted after its freeze', request USING ERRCODE = 'BZ002';
        END IF;
        RETURN;
    END IF;
    UPDATE community_deletion_requests SET destructive_manifest = manifest, destructive_frozen_at = now() WHERE id = request;
END
$$;

CREATE FUNCTION community_deletion_requests_mark_drained(request uuid, owner text, generation bigint, detail jsonb) RETURNS void
    LANGUAGE plpgsql
    AS $$
DECLARE
    r community_deletion_requests;
    live bigint;
BEGIN
    r := community_deletion_requests_enter_executor(request, owner, generation, 'fenced');
    SELECT count(*) INTO live FROM community_serving_write_leases WHERE community_id = r.community_id AND lease_until >= now();
    IF live > 0 THEN
        RAISE EXCEPTION 'serving writes have not drained: % live leases', live USING ERRCODE = 'BZ003';
    END IF;
    IF r.destructive_frozen_at IS NULL THEN
        RAISE EXCEPTION 'deletion request %: object manifest not frozen', request USING ERRCODE = 'BZ002';
    END IF;
    PERFORM community_deletion_requests_advance(request, owner, generation, 'fenced', NULL);
    PERFORM community_deletion_checkpoints_upsert(request, 'fenced', 'serving_writes_drained', 'completed', generation, detail, NULL);
END
$$;

-- Stamps one chunk's objects as gone, exactly once.
CREATE FUNCTION community_deletion_manifest_keys_stamp(request uuid, owner text, generation bigint, chunk bigint, detail jsonb) RETURNS void
    LANGUAGE plpgsql
    AS $$
BEGIN
    PERFORM community_deletion_requests_enter_executor(request, owner, generation, 'drained');
    UPDATE community_deletion_manifest_keys SET deleted_at = now()
    WHERE request_id = request AND chunk_no = chunk AND deleted_at IS NULL;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'deletion request %: chunk % is missing or already stamped', request, chunk USING ERRCODE = 'BZ002';
    END IF;
    PERFORM community_deletion_checkpoints_upsert(request, 'drained', 'chunk:' || chunk, 'completed', generation, detail, NULL);
END
$$;

-- Raises naming the first community-scoped table that still holds rows of
-- the request's community, or the catalog problem that makes the answer
-- untrustworthy.
CREATE FUNCTION community_deletion_assert_postgres_absent(community uuid) RETURNS void
    LANGUAGE plpgsql
    AS $$
DECLARE
    t text;
    problems text;
    present boolean;
BEGIN
    PERFORM pg_advisory_xact_lock_shared(community_schema_destruction_lock_key());
    SELECT string_agg(p.table_name || ': ' || p.problem, '; ') INTO problems FROM community_deletion_catalog_problems() p;
    IF problems IS NOT NULL THEN
        RAISE EXCEPTION 'catalog drift: %', problems USING ERRCODE = 'BZ002';
    END IF;
    FOR t IN SELECT community_scoped_tables() LOOP
        EXECUTE format('SELECT EXISTS (SELECT FROM %I WHERE community_id = $1)', t) INTO present USING community;
        IF present THEN
            RAISE EXCEPTION 'community % still has rows in %', community, t USING ERRCODE = 'BZ002';
        END IF;
    END LOOP;
END
$$;

-- Once every scoped table is empty for the community: the community row
-- becomes a tombstone (state, deleted_at, signing key gone), in the same
-- transaction as the final absence check.
CREATE FUNCTION community_deletion_requests_tombstone(request uuid, owner text, generation bigint, detail jsonb) RETURNS void
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

CREATE FUNCTION community_deletion_requests_verify_postgres(request uuid, owner text, generation bigint) RETURNS void
    LANGUAGE plpgsql
    AS $$
DECLARE
    r community_deletion_requests;
BEGIN
    r := community_deletion_requests_enter_executor(request, owner, generation, 'cache_purged');
    IF NOT EXISTS (SELECT FROM communities WHERE id = r.community_id AND deletion_state = 'tombstone'
                   AND deleted_at IS NOT NULL AND deletion_fence_generation = r.fence_generation) THEN
        RAISE EXCEPTION 'community % is not a tombstone at generation %', r.community_id, r.fence_generation USING ERRCODE = 'BZ002';
    END IF;
    PERFORM community_deletion_assert_postgres_absent(r.community_id);
END
$$;

CREATE FUNCTION community_deletion_requests_mark_verified(request uuid, owner text, generation bigint, detail jsonb) RETURNS void
    LANGUAGE plpgsql
    AS $$
BEGIN
    PERFORM community_deletion_requests_enter_executor(request, owner, generation, 'cache_purged');
    PERFORM community_deletion_requests_advance(request, owner, generation, 'cache_purged', NULL);
    PERFORM community_deletion_checkpoints_upsert(request, 'cache_purged', 'verify_cross_store_absence', 'completed', generation, detail, NULL);
    -- The keys were only needed until absence was proven; the per-prefix
    -- counts and digests stay in the frozen manifest.
    DELETE FROM community_deletion_manifest_keys WHERE request_id = request;
END
$$;

-- Leases for serving-side external effects (object uploads, Redis
-- writes). Acquired only while the community is active; renewable while
-- quiescing so an admitted operation can finish; the fence waits for them.
CREATE FUNCTION community_serving_write_leases_acquire(community uuid, op text, lease_owner text, lease_seconds double precision)
    RETURNS uuid
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

CREATE FUNCTION community_serving_write_leases_renew(lease uuid, lease_seconds double precision) RETURNS boolean
    LANGUAGE plpgsql
    AS $$
DECLARE
    community uuid;
BEGIN
    SELECT community_id INTO community FROM community_serving_write_leases WHERE id = lease;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    PERFORM pg_advisory_xact_lock_shared(community_deletion_lock_key(community));
    UPDATE community_serving_write_leases l
    SET lease_until = now() + make_interval(secs => lease_seconds), heartbeat_at = now()
    FROM communities c
    WHERE l.id = lease AND c.id = l.community_id AND l.lease_until >= now()
      AND c.deletion_state IN ('active', 'quiescing') AND c.deleted_at IS NULL
      AND c.deletion_fence_generation = l.fence_generation;
    RETURN FOUND;
END
$$;

CREATE FUNCTION community_serving_write_leases_release(lease uuid) RETURNS boolean
    LANGUAGE sql
    AS $$
    WITH gone AS (DELETE FROM community_serving_write_leases WHERE id = lease RETURNING 1)
    SELECT EXISTS (SELECT FROM gone)
$$;

-- For the database step of a leased operation: re-verifies the lease and
-- lets this transaction's writes through while the community quiesces.
CREATE FUNCTION community_serving_write_leases_guard(lease uuid) RETURNS void
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

-- Deletes up to max_rows expired leases, of any community (tombstones
-- included), without waiting on rows another reaper holds.
CREATE FUNCTION community_serving_write_leases_reap(max_rows integer) RETURNS bigint
    LANGUAGE sql
    AS $$
    WITH expired AS (
        SELECT id FROM community_serving_write_leases
        WHERE lease_until < now()
        ORDER BY lease_until
        LIMIT greatest(1, least(max_rows, 10000))
        FOR UPDATE SKIP LOCKED
    ), gone AS (
        DELETE FROM community_serving_write_leases l USING expired e WHERE l.id = e.id RETURNING 1
    )
    SELECT count(*) FROM gone
$$;

-- Attach the fence to every community-scoped table the catalog holds now.
DO $$
DECLARE
    t text;
BEGIN
    FOR t IN SELECT community_scoped_tables() LOOP
        PERFORM attach_community_write_fence(t::regclass);
    END LOOP;
END
$$;

---- create above / drop below ----

DO $$
BEGIN
    IF EXISTS (SELECT FROM communities WHERE deletion_state <> 'active') THEN
        RAISE EXCEPTION 'refusing to drop the deletion machinery while a community is not active';
    END IF;
END
$$;

DO $$
DECLARE
    t text;
BEGIN
    FOR t IN SELECT DISTINCT c.relname FROM pg_trigger g JOIN pg_class c ON c.oid = g.tgrelid
             WHERE g.tgname = '_community_write_fence' LOOP
        EXECUTE format('DROP TRIGGER _community_write_fence ON %I', t);
    END LOOP;
END
$$;

DROP FUNCTION community_serving_write_leases_reap(integer);
DROP FUNCTION community_serving_write_leases_guard(uuid);
DROP FUNCTION community_serving_write_leases_release(uuid);
DROP FUNCTION community_serving_write_leases_renew(uuid, double precision);
DROP FUNCTION community_serving_write_leases_acquire(uuid, text, text, double precision);
DROP FUNCTION community_deletion_requests_mark_verified(uuid, text, bigint, jsonb);
DROP FUNCTION community_deletion_requests_verify_postgres(uuid, text, bigint);
DROP FUNCTION community_deletion_requests_tombstone(uuid, text, bigint, jsonb);
DROP FUNCTION community_deletion_assert_postgres_absent(uuid);
DROP FUNCTION community_deletion_manifest_keys_stamp(uuid, text, bigint, bigint, jsonb);
DROP FUNCTION community_deletion_requests_mark_drained(uuid, text, bigint, jsonb);
DROP FUNCTION community_deletion_requests_freeze_objects(uuid, text, bigint, jsonb);
DROP FUNCTION community_deletion_requests_fence(uuid, text, bigint);
DROP FUNCTION community_deletion_requests_begin_quiescing(uuid, text, bigint);
DROP FUNCTION community_deletion_requests_approve(uuid, text, text, bytea);
DROP FUNCTION community_deletion_requests_freeze_inventory(uuid, jsonb, bytea);
DROP FUNCTION community_deletion_requests_submit(text, text, text);
DROP FUNCTION community_deletion_requests_block_preclaim(uuid, text);
DROP FUNCTION community_deletion_requests_unblock(uuid, text, text);
DROP FUNCTION community_deletion_requests_record_failure(uuid, text, bigint, text, text, boolean, double precision, integer);
DROP FUNCTION community_deletion_requests_advance(uuid, text, bigint, text, bigint);
DROP FUNCTION community_deletion_requests_release(uuid, text, bigint);
DROP FUNCTION community_deletion_requests_heartbeat(uuid, text, bigint, text, boolean, double precision);
DROP FUNCTION community_deletion_executor_heartbeats_beat(text, text, uuid, bigint, text, boolean, boolean);
DROP FUNCTION community_deletion_requests_claim(uuid, text, double precision);
DROP FUNCTION community_deletion_checkpoints_upsert(uuid, text, text, text, bigint, jsonb, text);
DROP FUNCTION community_deletion_requests_enter_executor(uuid, text, bigint, text);
DROP FUNCTION community_deletion_requests_verify_lease(uuid, text, bigint, text);
DROP FUNCTION community_deletion_raise_stale(uuid, bigint, text);
DROP FUNCTION community_deletion_catalog_problems();
DROP FUNCTION community_schema_destruction_lock_key();
DROP TRIGGER communities_tombstone_guard ON communities;
DROP FUNCTION communities_tombstone_guard();
DELETE FROM _operator_global_tables WHERE table_name IN (
    'community_deletion_requests', 'community_deletion_approvals', 'community_deletion_checkpoints',
    'community_deletion_manifest_keys', 'community_serving_write_leases',
    'community_deletion_executor_heartbeats', 'storage_taxonomy_sweeps');
DROP TABLE storage_taxonomy_sweeps;
DROP TABLE community_deletion_executor_heartbeats;
DROP TABLE community_serving_write_leases;
DROP TABLE community_deletion_manifest_keys;
DROP TABLE community_deletion_checkpoints;
DROP TABLE community_deletion_approvals;
DROP TABLE community_deletion_requests;
DROP FUNCTION community_deletion_manifest_keys_guard();
DROP FUNCTION community_deletion_approvals_guard();
DROP FUNCTION community_deletion_requests_guard();
DROP FUNCTION community_deletion_runnable_stage(text);
DROP FUNCTION community_deletion_next_stage(text);
DROP FUNCTION community_scoped_foreign_keys();
DROP FUNCTION community_fenced_tables();
DROP FUNCTION community_scoped_tables();
DROP FUNCTION attach_community_write_fence(regclass);
DROP FUNCTION enforce_community_write_fence();
DROP FUNCTION community_write_allowed(uuid);
DROP FUNCTION assert_community_write_allowed(uuid);
DROP FUNCTION community_write_fence_excluded_table(text);
DROP FUNCTION community_deletion_lock_key(uuid);
ALTER TABLE communities DROP COLUMN deletion_fence_generation;
