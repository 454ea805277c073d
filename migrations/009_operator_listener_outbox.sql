-- 009: operator-listener mention delivery: listener registrations,
-- the delivery outbox, and the operator API's NIP-98 replay store.
--
-- Why: an operator listener (a deployment-wide HTTPS endpoint, e.g. the
-- service that wakes remote agents) registers target pubkeys. When a stored
-- message p-tags a target, the event's own transaction inserts one outbox row
-- per (listener, target); a delivery worker claims rows with
-- FOR UPDATE SKIP LOCKED, POSTs a signed notification and deletes the row.
-- No row is ever "delivered" or "failed": a finished row is deleted, so the
-- table only holds work (at most 15 minutes of it, see the reaper).
--   Operator-global: listeners serve the whole deployment, so none of these
--   tables is tenant data. The outbox's community_id only records where the
--   event was saved (it has no FK: a community's lifecycle must not block or
--   cascade into delivery bookkeeping that expires within 15 minutes anyway).
--   operator_auth_replays is the replay store of NIP-98 auth events on
--   /operator/* (scope "operator-management"): one operator-global namespace,
--   unlike http_auth_replays (008), which is per community.
-- Lock impact: new tables only; the INSERT into _operator_global_tables takes
-- a row lock on that small registry.
-- Roll back: the down part drops the three tables. Undelivered mentions are
-- lost (listeners miss those wake-ups; the events themselves are unaffected)
-- and listeners must register their targets again.

CREATE TABLE operator_listener_pubkeys (
    listener_pubkey bytea       NOT NULL CONSTRAINT operator_listener_pubkeys_listener_len CHECK (octet_length(listener_pubkey) = 32),
    target_pubkey   bytea       NOT NULL CONSTRAINT operator_listener_pubkeys_target_len CHECK (octet_length(target_pubkey) = 32),
    -- Refreshed by every registration: a registration lives 30 days from its
    -- last renewal.
    created_at      timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (listener_pubkey, target_pubkey)
);

-- Enqueue fans out from the mentioned pubkey to its listeners.
CREATE INDEX operator_listener_pubkeys_target ON operator_listener_pubkeys (target_pubkey, listener_pubkey);
-- The daily 30-day expiry sweep.
CREATE INDEX operator_listener_pubkeys_created ON operator_listener_pubkeys (created_at);

COMMENT ON TABLE operator_listener_pubkeys IS 'Target pubkeys each operator listener wants mention notifications for; expire 30 days after created_at.';

CREATE TABLE operator_listener_outbox (
    id               uuid        PRIMARY KEY DEFAULT gen_random_uuid(),
    listener_pubkey  bytea       NOT NULL CONSTRAINT operator_listener_outbox_listener_len CHECK (octet_length(listener_pubkey) = 32),
    target_pubkey    bytea       NOT NULL CONSTRAINT operator_listener_outbox_target_len CHECK (octet_length(target_pubkey) = 32),
    community_id     uuid        NOT NULL,
    event_id         bytea       NOT NULL CONSTRAINT operator_listener_outbox_event_id_len CHECK (octet_length(event_id) = 32),
    event_kind       integer     NOT NULL,
    -- Author-controlled: never used for scheduling or retention.
    event_created_at timestamptz NOT NULL,
    state            text        NOT NULL DEFAULT 'pending'
                     CONSTRAINT operator_listener_outbox_state_known CHECK (state IN ('pending', 'sending')),
    -- The 1-based number of the attempt in progress while 'sending'.
    attempts         integer     NOT NULL DEFAULT 0 CONSTRAINT operator_listener_outbox_attempts_nonnegative CHECK (attempts >= 0),
    next_attempt_at  timestamptz NOT NULL DEFAULT now(),
    lease_until      timestamptz NULL,
    -- Fencing token of the current claim: every transition after a claim
    -- matches (id, claim_id, state = 'sending'), so a worker whose lease
    -- expired and whose row was claimed again changes nothing.
    claim_id         uuid        NULL,
    created_at       timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT operator_listener_outbox_once UNIQUE (listener_pubkey, target_pubkey, community_id, event_id),
    CONSTRAINT operator_listener_outbox_sending_is_claimed CHECK (
        state = 'pending' OR (claim_id IS NOT NULL AND lease_until IS NOT NULL)
    )
);

-- The claim's two entry points: due pending rows, and sending rows whose
-- lease expired (a worker died mid-delivery).
CREATE INDEX operator_listener_outbox_due ON operator_listener_outbox (next_attempt_at, created_at, id) WHERE state = 'pending';
CREATE INDEX operator_listener_outbox_recovery ON operator_listener_outbox (lease_until, created_at, id) WHERE state = 'sending';
-- The 5-minute retention reaper.
CREATE INDEX operator_listener_outbox_created ON operator_listener_outbox (created_at);

COMMENT ON TABLE operator_listener_outbox IS 'Pending mention notifications to operator listeners; rows are deleted when delivered, failed or 15 minutes old.';
COMMENT ON COLUMN operator_listener_outbox.community_id IS 'Provenance only (the community the event was saved in); deliberately no FK.';

CREATE TABLE operator_auth_replays (
    event_id   bytea       PRIMARY KEY CONSTRAINT operator_auth_replays_event_id_len CHECK (octet_length(event_id) = 32),
    expires_at timestamptz NOT NULL
);

-- The outbox reaper purges expired claims.
CREATE INDEX operator_auth_replays_expiry ON operator_auth_replays (expires_at);

COMMENT ON TABLE operator_auth_replays IS 'NIP-98 auth event ids already used on /operator/* (scope operator-management); rows past expires_at may be purged.';

INSERT INTO _operator_global_tables (table_name, reason) VALUES
    ('operator_listener_pubkeys', 'operator listeners are deployment-wide; registrations belong to no community'),
    ('operator_listener_outbox', 'deliveries to deployment-wide listeners; community_id is provenance only'),
    ('operator_auth_replays', 'replay store of the operator API, which is not bound to a community');

---- create above / drop below ----

DELETE FROM _operator_global_tables
WHERE table_name IN ('operator_listener_pubkeys', 'operator_listener_outbox', 'operator_auth_replays');
DROP TABLE operator_auth_replays;
DROP TABLE operator_listener_outbox;
DROP TABLE operator_listener_pubkeys;
