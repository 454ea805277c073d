-- 058: a recorded agent owner ends when the attestation it was recorded
-- from does.
--
-- Why: an owner's attestation may carry created_at<T: the owner vouches for
-- the agent's events before T only. The owner recorded from it
-- (users.agent_owner_pubkey) stayed for good, so after T the agent still
-- answered the owner's agent_owner reads, the recorded-owner route and its
-- owner_only add policy as the owner's. agent_owner_until keeps T; from T
-- on the record counts as none, and the same owner's renewed attestation
-- records T again. Another owner's does not replace an ended one (the
-- first-wins trigger stays): an operator clears it first, as a wrong owner
-- (docs/agents.md).
-- NULL: the attestation had no such bound, the owner stays.
-- Owners recorded before this migration keep NULL: the attestation they
-- came from was not stored, so its bound is unknown. An agent that sends
-- its attestation again (every AUTH does) sets it, see UserAgentOwnerRecord.
-- Lock impact: ADD COLUMN without a default changes only the catalog: an
-- ACCESS EXCLUSIVE lock on users for an instant, no rewrite; it waits at
-- most lock_timeout for the transactions holding users.
-- Roll back: the down part drops the column (the bounds recorded are
-- lost); roll the relays back first, they write it.

SET LOCAL lock_timeout = '5s';

ALTER TABLE users ADD COLUMN agent_owner_until timestamptz NULL;

COMMENT ON COLUMN users.agent_owner_until IS 'When the recorded agent owner stops counting: the created_at< bound of the attestation it was recorded from (NULL: none).';

---- create above / drop below ----

SET LOCAL lock_timeout = '5s';

ALTER TABLE users DROP COLUMN agent_owner_until;
