-- 012: workflows: owner-signed definitions, durable runs, approvals and
-- schedule slot claims.
--
-- Why: a workflow is defined by an owner-signed addressable event (kind
-- 30620) and materialized, in that event's transaction, into a workflows
-- row that pins the exact event id it came from. Every run is a durable row
-- claimed by a worker with FOR UPDATE SKIP LOCKED under a lease, like the
-- listener outbox: a relay killed mid-run leaves the run to be resumed by
-- another process once the lease expires, and every transition after a
-- claim is fenced by (id, claim_id, status = 'running'), so the late worker
-- changes nothing. A durable delay is a pending run with a future run_at,
-- not a sleeping goroutine.
--   workflows.owner_pubkey has no FK to users: a users row exists only once
--   the pubkey published a profile, and a channel member without one may
--   still own workflows. Membership is enforced instead: when an owner
--   leaves or is removed from the channel, the trigger below disables that
--   owner's workflows there.
--   error_code is the stable machine-readable reason a run failed or was
--   cancelled (the CHECK lists every code); error_message is the human
--   diagnostic. Both are set together or both NULL. No run rows exist
--   before this migration, so nothing is backfilled; legacy_unclassified is
--   reserved for rows imported from elsewhere without a known code.
--   workflow_approvals.token is the SHA-256 of the raw approval token; the
--   raw token is never stored.
--   scheduled_workflow_fires: one row per (workflow, slot) claimed; the
--   primary key makes a slot fire once across every relay process.
-- Lock impact: new types and tables, and a new trigger on channel_members
-- (CREATE TRIGGER takes a SHARE ROW EXCLUSIVE lock on channel_members for
-- the instant of the DDL; membership writes wait for it, reads do not).
-- Roll back: the down part drops the trigger, the four tables and the
-- types. Every definition stays stored as its kind 30620 event; re-saving
-- (or a re-materialization script) recreates the rows. Run history,
-- approvals and slot claims are lost.

CREATE TYPE workflow_status AS ENUM ('active', 'disabled', 'archived');
CREATE TYPE workflow_run_status AS ENUM ('pending', 'running', 'waiting_approval', 'completed', 'failed', 'cancelled');
CREATE TYPE workflow_approval_status AS ENUM ('pending', 'granted', 'denied', 'expired');

CREATE TABLE workflows (
    community_id        uuid            NOT NULL REFERENCES communities (id),
    id                  uuid            NOT NULL,
    name                varchar(255)    NOT NULL CONSTRAINT workflows_name_not_blank CHECK (btrim(name) <> ''),
    owner_pubkey        bytea           NOT NULL CONSTRAINT workflows_owner_pubkey_len CHECK (octet_length(owner_pubkey) = 32),
    channel_id          uuid            NULL,
    -- The validated definition as JSON (with _webhook_secret for webhook
    -- triggers), and the SHA-256 of exactly that JSON text.
    definition          jsonb           NOT NULL,
    definition_hash     bytea           NOT NULL CONSTRAINT workflows_definition_hash_len CHECK (octet_length(definition_hash) = 32),
    -- The kind 30620 event this row was materialized from. NULL means the
    -- row predates pinning: it fires nothing until the owner saves it again.
    definition_event_id bytea           NULL CONSTRAINT workflows_definition_event_id_len CHECK (octet_length(definition_event_id) = 32),
    status              workflow_status NOT NULL DEFAULT 'active',
    enabled             boolean         NOT NULL DEFAULT true,
    created_at          timestamptz     NOT NULL DEFAULT now(),
    updated_at          timestamptz     NOT NULL DEFAULT now(),
    PRIMARY KEY (community_id, id),
    FOREIGN KEY (community_id, channel_id) REFERENCES channels (community_id, id) ON DELETE CASCADE
);

-- Triggering loads the enabled workflows of one channel.
CREATE INDEX workflows_by_channel ON workflows (community_id, channel_id, status, enabled);
-- The scheduler scans enabled workflows.
CREATE INDEX workflows_enabled ON workflows (enabled, status) WHERE enabled;
-- The owner-left trigger disables one owner's workflows in one channel.
CREATE INDEX workflows_by_owner ON workflows (community_id, channel_id, owner_pubkey);

COMMENT ON TABLE workflows IS 'Materialized kind 30620 workflow definitions; definition_event_id pins the signed event.';
COMMENT ON COLUMN workflows.enabled IS 'false once the owner left or was removed from the channel, or the definition was deleted.';

CREATE TABLE workflow_runs (
    community_id     uuid                NOT NULL,
    id               uuid                NOT NULL,
    workflow_id      uuid                NOT NULL,
    status           workflow_run_status NOT NULL DEFAULT 'pending',
    -- The event that caused the run (message, reaction, manual command);
    -- NULL for schedule and webhook runs.
    trigger_event_id bytea               NULL CONSTRAINT workflow_runs_trigger_event_id_len CHECK (octet_length(trigger_event_id) = 32),
    -- Index of the next step to execute; steps before it are done.
    current_step     integer             NOT NULL DEFAULT 0 CONSTRAINT workflow_runs_current_step_nonnegative CHECK (current_step >= 0),
    execution_trace  jsonb               NOT NULL DEFAULT '[]',
    trigger_context  jsonb               NULL,
    started_at       timestamptz         NULL,
    completed_at     timestamptz         NULL,
    error_code       text                NULL CONSTRAINT workflow_runs_error_code_known CHECK (error_code IN (
                         'invalid_yaml', 'invalid_definition', 'condition_evaluation_failed',
                         'template_resolution_failed', 'step_timeout', 'webhook_failed',
                         'capacity_exceeded', 'database_error', 'owner_unauthorized',
                         'action_not_implemented', 'approval_denied', 'approval_expired',
                         'workflow_disabled', 'legacy_unclassified')),
    error_message    text                NULL,
    -- When the run is next due: creation time, or the end of a delay step.
    run_at           timestamptz         NOT NULL DEFAULT now(),
    -- Number of claims taken so far (a run resumed after a lost lease is
    -- claimed again).
    attempts         integer             NOT NULL DEFAULT 0 CONSTRAINT workflow_runs_attempts_nonnegative CHECK (attempts >= 0),
    -- Fencing token of the current claim and its lease (status 'running').
    claim_id         uuid                NULL,
    lease_until      timestamptz         NULL,
    created_at       timestamptz         NOT NULL DEFAULT now(),
    PRIMARY KEY (community_id, id),
    FOREIGN KEY (community_id, workflow_id) REFERENCES workflows (community_id, id) ON DELETE CASCADE,
    CONSTRAINT workflow_runs_error_pair CHECK ((error_code IS NULL) = (error_message IS NULL)),
    CONSTRAINT workflow_runs_running_is_claimed CHECK (
        status <> 'running' OR (claim_id IS NOT NULL AND lease_until IS NOT NULL)
    )
);

CREATE INDEX workflow_runs_by_status ON workflow_runs (community_id, status);
-- Run history pages newest first with a (created_at, id) keyset cursor.
CREATE INDEX workflow_runs_history ON workflow_runs (community_id, workflow_id, created_at DESC, id DESC);
-- The claim's two entry points: due pending runs, and running runs whose
-- lease expired (a worker died mid-step).
CREATE INDEX workflow_runs_due ON workflow_runs (run_at, created_at, id) WHERE status = 'pending';
CREATE INDEX workflow_runs_recovery ON workflow_runs (lease_until, created_at, id) WHERE status = 'running';

COMMENT ON TABLE workflow_runs IS 'Durable workflow runs; claimed by workers under a lease and fenced by claim_id.';
COMMENT ON COLUMN workflow_runs.error_code IS 'Stable reason code of a failed or cancelled run; error_message is the diagnostic.';

CREATE TABLE workflow_approvals (
    community_id    uuid                     NOT NULL,
    -- SHA-256 of the raw approval token.
    token           bytea                    NOT NULL CONSTRAINT workflow_approvals_token_len CHECK (octet_length(token) = 32),
    workflow_id     uuid                     NOT NULL,
    run_id          uuid                     NOT NULL,
    step_id         varchar(64)              NOT NULL,
    step_index      integer                  NOT NULL,
    approver_spec   text                     NOT NULL DEFAULT '',
    status          workflow_approval_status NOT NULL DEFAULT 'pending',
    approver_pubkey bytea                    NULL CONSTRAINT workflow_approvals_approver_len CHECK (octet_length(approver_pubkey) = 32),
    note            text                     NULL,
    granted_at      timestamptz              NULL,
    denied_at       timestamptz              NULL,
    expires_at      timestamptz              NOT NULL,
    created_at      timestamptz              NOT NULL DEFAULT now(),
    PRIMARY KEY (community_id, token),
    FOREIGN KEY (community_id, workflow_id) REFERENCES workflows (community_id, id) ON DELETE CASCADE,
    FOREIGN KEY (community_id, run_id) REFERENCES workflow_runs (community_id, id) ON DELETE CASCADE
);

CREATE INDEX workflow_approvals_by_workflow ON workflow_approvals (community_id, workflow_id);
CREATE INDEX workflow_approvals_by_run ON workflow_approvals (community_id, run_id);
CREATE INDEX workflow_approvals_by_status ON workflow_approvals (community_id, status);

COMMENT ON TABLE workflow_approvals IS 'Approval requests of runs; token is the SHA-256 of the raw token, never the token itself.';

CREATE TABLE scheduled_workflow_fires (
    community_id    uuid        NOT NULL,
    workflow_id     uuid        NOT NULL,
    -- The slot, a whole second (slots are named by their Unix second).
    scheduled_for   timestamptz NOT NULL CONSTRAINT scheduled_workflow_fires_whole_second CHECK (scheduled_for = date_trunc('second', scheduled_for)),
    claimed_at      timestamptz NOT NULL DEFAULT now(),
    workflow_run_id uuid        NULL,
    PRIMARY KEY (community_id, workflow_id, scheduled_for),
    FOREIGN KEY (community_id, workflow_id) REFERENCES workflows (community_id, id) ON DELETE CASCADE,
    FOREIGN KEY (community_id, workflow_run_id) REFERENCES workflow_runs (community_id, id)
);

CREATE INDEX scheduled_workflow_fires_claimed ON scheduled_workflow_fires (claimed_at);

COMMENT ON TABLE scheduled_workflow_fires IS 'Schedule slots claimed; the primary key lets each slot fire at most once across relay processes.';

-- An owner who leaves or is removed from a channel no longer speaks for
-- it: their workflows there stop firing, whichever code path removed them.
-- Re-saving the definition after rejoining enables it again.
CREATE FUNCTION workflows_disable_on_owner_removal() RETURNS trigger
    LANGUAGE plpgsql
AS $$
BEGIN
    UPDATE workflows
    SET enabled = false, updated_at = now()
    WHERE community_id = NEW.community_id AND channel_id = NEW.channel_id
      AND owner_pubkey = NEW.pubkey AND enabled;
    RETURN NULL;
END
$$;

CREATE TRIGGER workflows_disable_on_owner_removal
    AFTER UPDATE OF removed_at ON channel_members
    FOR EACH ROW
    WHEN (OLD.removed_at IS NULL AND NEW.removed_at IS NOT NULL)
    EXECUTE FUNCTION workflows_disable_on_owner_removal();

---- create above / drop below ----

DROP TRIGGER workflows_disable_on_owner_removal ON channel_members;
DROP FUNCTION workflows_disable_on_owner_removal();
DROP TABLE scheduled_workflow_fires;
DROP TABLE workflow_approvals;
DROP TABLE workflow_runs;
DROP TABLE workflows;
DROP TYPE workflow_approval_status;
DROP TYPE workflow_run_status;
DROP TYPE workflow_status;
