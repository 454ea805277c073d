-- 035: the remaining table-reading trigger functions read the real tables,
-- never a session's temporary ones.
--
-- Why: 032 pinned the write fence and the deletion guards. Five more
-- trigger functions keep a rule by reading or writing tables they name
-- without a schema, and a session's temporary table of the same name is
-- found first (TEMP is granted to PUBLIC):
--   channel_members_keep_an_owner: a temporary channel_members holding
--     another owner let a psql session remove a channel's last owner;
--   events_keep_newest_version: a temporary events table made it find no
--     head and delete the old version from the temporary table, so the slot
--     kept two versions;
--   reactions_remove_hidden, users_forget_hidden_profile,
--     workflows_disable_on_owner_removal: their UPDATE went to the
--     temporary table, so a hidden reaction or profile stayed, and a
--     removed member's workflow kept firing in the channel.
-- Each now runs with its own schema first and pg_temp last.
-- Cost: setting and restoring search_path on each call, about 1-2 us, and
-- only on the rows these triggers fire for (replaceable and addressable
-- events, hides of kinds 0 and 7, owner and membership changes), not on
-- every event.
-- Lock impact: ALTER FUNCTION locks only the functions; no table is
-- locked, scanned or rewritten.
-- Roll back: the down part resets the five settings.

DO $$
BEGIN
    EXECUTE format('ALTER FUNCTION channel_members_keep_an_owner() SET search_path = %I, pg_temp', current_schema());
    EXECUTE format('ALTER FUNCTION events_keep_newest_version() SET search_path = %I, pg_temp', current_schema());
    EXECUTE format('ALTER FUNCTION reactions_remove_hidden() SET search_path = %I, pg_temp', current_schema());
    EXECUTE format('ALTER FUNCTION users_forget_hidden_profile() SET search_path = %I, pg_temp', current_schema());
    EXECUTE format('ALTER FUNCTION workflows_disable_on_owner_removal() SET search_path = %I, pg_temp', current_schema());
END
$$;

---- create above / drop below ----

ALTER FUNCTION workflows_disable_on_owner_removal() RESET search_path;
ALTER FUNCTION users_forget_hidden_profile() RESET search_path;
ALTER FUNCTION reactions_remove_hidden() RESET search_path;
ALTER FUNCTION events_keep_newest_version() RESET search_path;
ALTER FUNCTION channel_members_keep_an_owner() RESET search_path;
