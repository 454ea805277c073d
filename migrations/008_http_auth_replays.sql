-- 008: replay guard for NIP-98 HTTP authorization (the HTTP bridge).
--
-- Why: a NIP-98 auth event (kind 27235) authorizes one HTTP request. It is
-- valid for ±60 s around its created_at, so without a guard it could be
-- replayed for up to two minutes. The bridge claims each auth event id once
-- per community: INSERT ... ON CONFLICT DO NOTHING, and zero rows inserted
-- means the event was already used (401). The reference keeps this in Redis
-- (SET buzz:{C}:nip98:{id} NX EX); Postgres is the one shared store here, so
-- every relay pod sees the same claims.
--   expires_at = the auth event's created_at + the 60 s window + 60 s slack
--     (clock skew between relay pods and the database). After it, the event
--     fails the created_at check anyway, so its row is only dead weight.
--   The bridge purges a community's expired rows at most once a minute from
--   its request path (HTTPAuthReplaysPurge), so the table holds about two
--   minutes of auth events per community; http_auth_replays_expiry serves
--   that purge.
--   Tenant data: community_id leads the key (a replay in community A says
--   nothing about community B, and a community deletion finds its rows).
-- Lock impact: new table only.
-- Roll back: the down part drops the table; in-flight auth events (at most
-- two minutes old) become replayable until they expire.

CREATE TABLE http_auth_replays (
    community_id uuid        NOT NULL REFERENCES communities (id),
    event_id     bytea       NOT NULL CONSTRAINT http_auth_replays_event_id_len CHECK (octet_length(event_id) = 32),
    expires_at   timestamptz NOT NULL,
    PRIMARY KEY (community_id, event_id)
);

CREATE INDEX http_auth_replays_expiry ON http_auth_replays (community_id, expires_at);

COMMENT ON TABLE http_auth_replays IS 'NIP-98 auth event ids already used per community; rows past expires_at may be purged.';

---- create above / drop below ----

DROP TABLE http_auth_replays;
