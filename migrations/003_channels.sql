-- 003: channels (NIP-29 groups), their members, and user profiles.
--
-- Why: a channel is where people and agents talk; its membership decides who
-- may read and write it. Channel ids are chosen by the client that
-- creates the group and are unique only within a community, hence the
-- (community_id, id) key. Profiles mirror the newest kind 0 per pubkey.
-- Lock impact: new tables and types only.
-- Roll back: the down part drops them (destroys channel state and profiles;
-- the events that built them stay in events).

CREATE TYPE channel_type AS ENUM ('stream', 'forum', 'dm', 'workflow');
CREATE TYPE channel_visibility AS ENUM ('open', 'private');
CREATE TYPE member_role AS ENUM ('owner', 'admin', 'member', 'guest', 'bot');
CREATE TYPE channel_add_policy AS ENUM ('anyone', 'owner_only', 'nobody');

CREATE TABLE channels (
    community_id uuid               NOT NULL REFERENCES communities (id),
    id           uuid               NOT NULL,
    name         varchar(255)       NOT NULL CONSTRAINT channels_name_not_blank CHECK (btrim(name) <> ''),
    channel_type channel_type       NOT NULL DEFAULT 'stream',
    visibility   channel_visibility NOT NULL DEFAULT 'open',
    description  text               NOT NULL DEFAULT '',
    created_by   bytea              NOT NULL CONSTRAINT channels_created_by_len CHECK (octet_length(created_by) = 32),
    created_at   timestamptz        NOT NULL DEFAULT now(),
    updated_at   timestamptz        NOT NULL DEFAULT now(),
    archived_at  timestamptz        NULL,
    deleted_at   timestamptz        NULL,
    PRIMARY KEY (community_id, id)
);

CREATE INDEX channels_by_visibility ON channels (community_id, visibility) WHERE deleted_at IS NULL;

-- A channel never moves between tenants.
CREATE FUNCTION channels_community_id_immutable() RETURNS trigger
    LANGUAGE plpgsql
AS $$
BEGIN
    IF NEW.community_id <> OLD.community_id THEN
        RAISE EXCEPTION 'channels.community_id is immutable' USING ERRCODE = '23514';
    END IF;
    RETURN NEW;
END
$$;

CREATE TRIGGER channels_community_id_immutable
    BEFORE UPDATE OF community_id ON channels
    FOR EACH ROW EXECUTE FUNCTION channels_community_id_immutable();

CREATE TABLE channel_members (
    community_id uuid        NOT NULL,
    channel_id   uuid        NOT NULL,
    pubkey       bytea       NOT NULL CONSTRAINT channel_members_pubkey_len CHECK (octet_length(pubkey) = 32),
    role         member_role NOT NULL DEFAULT 'member',
    joined_at    timestamptz NOT NULL DEFAULT now(),
    invited_by   bytea       NULL,
    -- Removal is soft so history keeps who was there; re-adding clears it.
    removed_at   timestamptz NULL,
    removed_by   bytea       NULL,
    PRIMARY KEY (community_id, channel_id, pubkey),
    FOREIGN KEY (community_id, channel_id) REFERENCES channels (community_id, id) ON DELETE CASCADE
);

CREATE INDEX channel_members_active_by_pubkey ON channel_members (community_id, pubkey) WHERE removed_at IS NULL;

-- Every live channel keeps at least one owner: removing, demoting or letting
-- the last owner leave is refused here, whichever code path tries it.
CREATE FUNCTION channel_members_keep_an_owner() RETURNS trigger
    LANGUAGE plpgsql
AS $$
BEGIN
    IF OLD.role = 'owner' AND OLD.removed_at IS NULL
       AND (NEW.role <> 'owner' OR NEW.removed_at IS NOT NULL)
       AND NOT EXISTS (
           SELECT FROM channel_members
           WHERE community_id = OLD.community_id AND channel_id = OLD.channel_id
             AND pubkey <> OLD.pubkey AND role = 'owner' AND removed_at IS NULL)
       AND EXISTS (
           SELECT FROM channels
           WHERE community_id = OLD.community_id AND id = OLD.channel_id AND deleted_at IS NULL)
    THEN
        RAISE EXCEPTION 'channel % would have no owner', OLD.channel_id USING ERRCODE = '23514';
    END IF;
    RETURN NEW;
END
$$;

CREATE TRIGGER channel_members_keep_an_owner
    BEFORE UPDATE OF role, removed_at ON channel_members
    FOR EACH ROW EXECUTE FUNCTION channel_members_keep_an_owner();

CREATE TABLE users (
    community_id       uuid               NOT NULL REFERENCES communities (id),
    pubkey             bytea              NOT NULL CONSTRAINT users_pubkey_len CHECK (octet_length(pubkey) = 32),
    display_name       text               NULL,
    about              text               NULL,
    avatar_url         text               NULL,
    nip05_handle       text               NULL,
    -- Who may add this user (typically an agent) to channels.
    channel_add_policy channel_add_policy NOT NULL DEFAULT 'anyone',
    agent_owner_pubkey bytea              NULL,
    metadata_event_id  bytea              NULL,
    metadata_created_at timestamptz       NULL,
    created_at         timestamptz        NOT NULL DEFAULT now(),
    updated_at         timestamptz        NOT NULL DEFAULT now(),
    PRIMARY KEY (community_id, pubkey)
);

---- create above / drop below ----

DROP TABLE users;
DROP TABLE channel_members;
DROP FUNCTION channel_members_keep_an_owner();
DROP TABLE channels;
DROP FUNCTION channels_community_id_immutable();
DROP TYPE channel_add_policy;
DROP TYPE member_role;
DROP TYPE channel_visibility;
DROP TYPE channel_type;
