-- 001: tenants ("communities") and the registry of tables that are deliberately
-- not tenant-scoped.
--
-- Why: every request is bound to one community from its Host header before any
-- handler runs, so no client input can pick another tenant. Hosts are stored already normalized by the relay
-- (internal/community.NormalizeHost); the CHECK below refuses the shapes that
-- normalization removes, so a hand-written psql INSERT cannot create a host the
-- relay would never resolve.
-- Lock impact: new tables only.
-- Roll back: the down part drops both tables (destroys every tenant row).

CREATE TABLE communities (
    id          uuid PRIMARY KEY DEFAULT gen_random_uuid()
                CONSTRAINT communities_id_not_nil CHECK (id <> '00000000-0000-0000-0000-000000000000'),
    host        varchar(255) NOT NULL
                CONSTRAINT communities_host_normalized CHECK (
                    host <> ''
                    AND host = lower(btrim(host))
                    AND host !~ ':(80|443)$'
                    AND host !~ '\.$'
                    AND host !~ '^(127\.0\.0\.1|\[::1\])(:|$)'
                ),
    signing_key bytea NULL CONSTRAINT communities_signing_key_len CHECK (octet_length(signing_key) = 32),
    created_at  timestamptz NOT NULL DEFAULT now(),
    archived_at timestamptz NULL,
    deleted_at  timestamptz NULL,
    deletion_state text NOT NULL DEFAULT 'active'
                CONSTRAINT communities_deletion_state_known CHECK (deletion_state IN ('active', 'quiescing', 'fenced', 'tombstone'))
);

-- A tombstoned community keeps its row, so its host stays reserved.
CREATE UNIQUE INDEX communities_host_key ON communities (lower(host));

COMMENT ON TABLE communities IS 'Tenants. A connection is bound to exactly one, resolved from its Host.';
COMMENT ON COLUMN communities.signing_key IS 'Secret key the relay signs community events with (NIP-29 discovery); NULL until first needed.';

-- Tables listed here are exempt from the tenant-key rule that
-- the catalog test in internal/migrate enforces over the live catalog: every other table
-- must have community_id NOT NULL leading its primary key, unique constraints
-- and foreign keys.
CREATE TABLE _operator_global_tables (
    table_name text PRIMARY KEY,
    reason     text NOT NULL CHECK (reason <> '')
);

INSERT INTO _operator_global_tables (table_name, reason) VALUES
    ('communities', 'the tenant registry itself'),
    ('_operator_global_tables', 'this registry'),
    ('schema_version', 'tern bookkeeping');

---- create above / drop below ----

DROP TABLE _operator_global_tables;
DROP TABLE communities;
