package migrate_test

import (
	"context"
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/buzzrelay/buzz/internal/dbtest"
)

// A session's temporary tables named like the ones the rule-keeping
// triggers read (TEMP is granted to everyone, and pg_temp is searched first
// unless a function's search_path says otherwise) do not switch the rules
// off. Mutations killed, one line of migration 035 each: without
// channel_members_keep_an_owner's, the last owner is removed; without
// events_keep_newest_version's, the slot keeps both versions; without
// workflows_disable_on_owner_removal's, the removed member's workflow stays
// enabled; without users_forget_hidden_profile's, the hidden profile's
// name stays; without reactions_remove_hidden's, the hidden reaction's row
// stays.
func TestTemporaryTablesCannotShadowTheTriggers(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := dbtest.URL(t)
	setup := connect(t, url)
	community, channel := uuid.New(), uuid.New()
	owner, member := make([]byte, 32), make([]byte, 32)
	owner[0], member[0] = 1, 2
	exec := func(conn *pgx.Conn, sql string, args ...any) error {
		_, err := conn.Exec(ctx, sql, args...)
		return err
	}
	require.NoError(t, exec(setup, `INSERT INTO communities (id, host) VALUES ($1, 'shadow-triggers.example')`, community))
	require.NoError(t, exec(setup, `INSERT INTO channels (community_id, id, name, created_by) VALUES ($1, $2, 'room', $3)`, community, channel, owner))
	require.NoError(t, exec(setup, `INSERT INTO channel_members (community_id, channel_id, pubkey, role) VALUES ($1, $2, $3, 'owner'), ($1, $2, $4, 'member')`,
		community, channel, owner, member))
	require.NoError(t, exec(setup, `INSERT INTO workflows (community_id, id, name, owner_pubkey, channel_id, definition, definition_hash)
		VALUES ($1, gen_random_uuid(), 'w', $2, $3, '{}', sha256('w'))`, community, member, channel))

	shadow := connect(t, url)
	for _, table := range []string{"channel_members", "events", "workflows", "users", "reactions"} {
		require.NoError(t, exec(shadow, `CREATE TEMP TABLE `+table+` (LIKE public.`+table+`)`))
	}
	require.NoError(t, exec(shadow, `INSERT INTO pg_temp.channel_members SELECT * FROM public.channel_members WHERE community_id = $1`, community))
	require.NoError(t, exec(shadow, `UPDATE pg_temp.channel_members SET role = 'owner' WHERE pubkey = $1`, member))

	err := exec(shadow, `UPDATE public.channel_members SET removed_at = now() WHERE community_id = $1 AND channel_id = $2 AND pubkey = $3`, community, channel, owner)
	require.ErrorContains(t, err, "would have no owner", "the last owner's removal")

	event := func(kind, day int, content string) []byte {
		id := make([]byte, 32)
		id[0], id[1], id[2] = 9, byte(kind), byte(day)
		require.NoError(t, exec(shadow, `INSERT INTO public.events (community_id, id, pubkey, created_at, kind, tags, content, sig)
			VALUES ($1, $2, $3, timestamptz '2026-01-01' + make_interval(days => $4), $5, '[]', $6, $7)`,
			community, id, member, day, kind, content, make([]byte, 64)))
		return id
	}
	event(0, 1, `{"name":"old"}`)
	newest := event(0, 2, `{"name":"new"}`)
	var versions int
	require.NoError(t, setup.QueryRow(ctx, `SELECT count(*) FROM events WHERE community_id = $1 AND kind = 0`, community).Scan(&versions))
	require.Equal(t, 1, versions, "a replaceable slot keeps its newest version only")

	require.NoError(t, exec(setup, `INSERT INTO users (community_id, pubkey, display_name, metadata_event_id) VALUES ($1, $2, 'new', $3)`, community, member, newest))
	require.NoError(t, exec(shadow, `UPDATE public.events SET deleted_at = now() WHERE community_id = $1 AND id = $2`, community, newest))
	var name *string
	require.NoError(t, setup.QueryRow(ctx, `SELECT display_name FROM users WHERE community_id = $1 AND pubkey = $2`, community, member).Scan(&name))
	require.Nil(t, name, "a hidden profile's fields are forgotten")

	reaction := event(7, 3, "+")
	require.NoError(t, exec(setup, `INSERT INTO reactions (community_id, event_created_at, event_id, pubkey, emoji, reaction_event_id)
		VALUES ($1, now(), $2, $3, '+', $4)`, community, newest, member, reaction))
	require.NoError(t, exec(shadow, `UPDATE public.events SET deleted_at = now() WHERE community_id = $1 AND id = $2`, community, reaction))
	var removed bool
	require.NoError(t, setup.QueryRow(ctx, `SELECT removed_at IS NOT NULL FROM reactions WHERE community_id = $1 AND reaction_event_id = $2`, community, reaction).Scan(&removed))
	require.True(t, removed, "a hidden reaction's row is removed")

	require.NoError(t, exec(shadow, `UPDATE public.channel_members SET removed_at = now() WHERE community_id = $1 AND channel_id = $2 AND pubkey = $3`, community, channel, member))
	var enabled bool
	require.NoError(t, setup.QueryRow(ctx, `SELECT enabled FROM workflows WHERE community_id = $1 AND owner_pubkey = $2`, community, member).Scan(&enabled))
	require.False(t, enabled, "a removed member's workflow is disabled")
}

// triggerFunctionsReadingNoTable are the trigger functions that name no
// table or view (they read only NEW/OLD and settings, or call functions,
// which PostgreSQL never looks up in pg_temp), so need no search_path.
var triggerFunctionsReadingNoTable = map[string]string{
	"channels_community_id_immutable":    "compares OLD and NEW",
	"communities_announce_archived":      "pg_notify only",
	"communities_announce_closed":        "pg_notify only",
	"enforce_community_write_fence":      "calls assert_community_write_allowed, which is pinned",
	"events_created_at_floor_guard":      "reads a setting and NEW",
	"users_agent_owner_first_wins":       "compares OLD and NEW",
	"community_deletion_approvals_guard": "raises on every change",
}

// Every trigger function either runs with a pinned search_path (its schema,
// then pg_temp) or is listed above as naming no table: a new rule-keeping
// trigger that reads a table without one could be switched off by a
// session's temporary table. Mutation killed: any line of migration 032 or
// 035 removed.
func TestTriggerFunctionsPinTheirSearchPath(t *testing.T) {
	t.Parallel()
	conn := connect(t, dbtest.URL(t))
	rows, err := conn.Query(context.Background(), `
		SELECT p.proname, coalesce(array_to_string(p.proconfig, ','), '')
		FROM pg_proc p
		WHERE p.pronamespace = current_schema()::regnamespace AND p.prorettype = 'trigger'::regtype`)
	require.NoError(t, err)
	functions, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) ([2]string, error) {
		var f [2]string
		return f, row.Scan(&f[0], &f[1])
	})
	require.NoError(t, err)
	require.NotEmpty(t, functions)
	for _, f := range functions {
		if _, exempt := triggerFunctionsReadingNoTable[f[0]]; exempt {
			continue
		}
		require.Contains(t, f[1], "search_path=public, pg_temp", "trigger function %s reads tables without a pinned search_path", f[0])
	}
}
