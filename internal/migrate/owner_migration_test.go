package migrate_test

import (
	"context"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/buzzrelay/buzz/internal/dbtest"
	"github.com/buzzrelay/buzz/internal/migrate"
)

// The verified-owner migration on a database holding self-declared owners:
// every one is cleared (none was proven), including one naming a key that
// has no users row (which the new foreign key would refuse); the index and
// constraints exist afterwards, and the down part removes them so the
// migration applies again.
//
// Mutations killed: a migration that keeps the self-declared values fails
// the cleared assertion (and the FK cannot be added over the dangling one);
// dropping the index fails the index assertion.
func TestOwnerMigrationClearsSelfDeclaredOwners(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	conn := connect(t, dbtest.EmptyURL(t))
	version := migrationVersion(t, "nip_oa_owner")
	exec := func(sql string, args ...any) {
		t.Helper()
		_, err := conn.Exec(ctx, sql, args...)
		require.NoError(t, err)
	}
	require.NoError(t, migrate.To(ctx, conn, version-1))
	const community = "00000000-0000-4000-8000-000000000014"
	owner, agent, orphan, plain := strings.Repeat("aa", 32), strings.Repeat("bb", 32), strings.Repeat("cc", 32), strings.Repeat("dd", 32)
	exec(`INSERT INTO communities (id, host) VALUES ($1, 'owners.example')`, community)
	exec(`INSERT INTO users (community_id, pubkey) VALUES ($1, decode($2, 'hex')), ($1, decode($3, 'hex'))`, community, owner, plain)
	exec(`INSERT INTO users (community_id, pubkey, agent_owner_pubkey, channel_add_policy) VALUES
		($1, decode($2, 'hex'), decode($3, 'hex'), 'owner_only'),
		($1, decode($4, 'hex'), decode($5, 'hex'), 'owner_only')`, community, agent, owner, orphan, strings.Repeat("ee", 32))

	require.NoError(t, migrate.To(ctx, conn, version))
	var withOwner, users int
	require.NoError(t, conn.QueryRow(ctx, `SELECT count(agent_owner_pubkey), count(*) FROM users`).Scan(&withOwner, &users))
	require.Equal(t, 0, withOwner, "no self-declared owner survives")
	require.Equal(t, 4, users, "no user is lost")
	var policy string
	require.NoError(t, conn.QueryRow(ctx, `SELECT channel_add_policy::text FROM users WHERE pubkey = decode($1, 'hex')`, agent).Scan(&policy))
	require.Equal(t, "owner_only", policy, "the agent's own policy stays")

	objects := func() []string {
		var names []string
		rows, err := conn.Query(ctx, `
			SELECT conname FROM pg_constraint WHERE conrelid = 'users'::regclass AND conname LIKE 'users_agent_owner%'
			UNION ALL SELECT indexname FROM pg_indexes WHERE tablename = 'users' AND indexname = 'users_agent_owner'
			UNION ALL SELECT tgname FROM pg_trigger WHERE tgrelid = 'users'::regclass AND tgname LIKE 'users_agent_owner%'
			ORDER BY 1`)
		require.NoError(t, err)
		defer rows.Close()
		for rows.Next() {
			var n string
			require.NoError(t, rows.Scan(&n))
			names = append(names, n)
		}
		require.NoError(t, rows.Err())
		return names
	}
	require.Equal(t, []string{"users_agent_owner", "users_agent_owner_first_wins", "users_agent_owner_fkey", "users_agent_owner_not_self"}, objects())
	var def string
	require.NoError(t, conn.QueryRow(ctx, `SELECT indexdef FROM pg_indexes WHERE indexname = 'users_agent_owner'`).Scan(&def))
	require.Contains(t, def, "(community_id, agent_owner_pubkey) WHERE (agent_owner_pubkey IS NOT NULL)")

	require.NoError(t, migrate.To(ctx, conn, version-1))
	require.Empty(t, objects())
	require.NoError(t, migrate.To(ctx, conn, version))
}
