package migrate_test

import (
	"context"
	"io/fs"
	"os"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/buzzrelay/buzz/internal/dbtest"
	"github.com/buzzrelay/buzz/internal/migrate"
	"github.com/buzzrelay/buzz/migrations"
)

const emojiMigration = "005_reactions_emoji_66.sql"

// Custom emoji reactions: the migration widens reactions.emoji to
// VARCHAR(66), and the desired-state schema sqlc reads declares it so.
func TestReactionsEmojiMigrationWidensTo66(t *testing.T) {
	t.Parallel()
	body, err := fs.ReadFile(migrations.FS, emojiMigration)
	require.NoError(t, err)
	up, down, found := strings.Cut(string(body), "---- create above / drop below ----")
	require.True(t, found)
	alter := func(n string) *regexp.Regexp {
		return regexp.MustCompile(`(?i)ALTER\s+TABLE\s+reactions\s+ALTER\s+COLUMN\s+emoji\s+TYPE\s+VARCHAR\(` + n + `\)\s*;`)
	}
	require.Regexp(t, alter("66"), up)
	require.Regexp(t, alter("64"), down, "the down part narrows it back")

	schema, err := os.ReadFile("../../sql/schema.sql")
	require.NoError(t, err)
	table := regexp.MustCompile(`(?s)CREATE TABLE public\.reactions \((.*?)\n\);`).FindStringSubmatch(string(schema))
	require.NotNil(t, table, "sql/schema.sql must define public.reactions")
	require.Regexp(t, `(?m)^\s+emoji character varying\(66\) NOT NULL,$`, table[1])
}

// The widening applied to a real database: 64 before, 66 after, a 66-char
// reaction fits, and rolling back refuses while such a reaction exists (as
// the migration's comment tells the DBA).
func TestReactionsEmojiMigrationOnADatabase(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	conn := connect(t, dbtest.EmptyURL(t))
	width := func() int {
		var n int
		require.NoError(t, conn.QueryRow(ctx, `
			SELECT character_maximum_length FROM information_schema.columns
			WHERE table_schema = 'public' AND table_name = 'reactions' AND column_name = 'emoji'`).Scan(&n))
		return n
	}
	require.NoError(t, migrate.To(ctx, conn, 4))
	require.Equal(t, 64, width())
	require.NoError(t, migrate.To(ctx, conn, 5))
	require.Equal(t, 66, width())

	_, err := conn.Exec(ctx, `
		INSERT INTO communities (id, host) VALUES ('00000000-0000-4000-8000-000000000066', 'emoji.example');
		INSERT INTO reactions (community_id, event_created_at, event_id, pubkey, emoji)
		VALUES ('00000000-0000-4000-8000-000000000066', now(), decode(repeat('11', 32), 'hex'), decode(repeat('22', 32), 'hex'), ':' || repeat('a', 64) || ':')`)
	require.NoError(t, err)
	require.Error(t, migrate.To(ctx, conn, 4), "narrowing must fail while a 66-char reaction is stored")
	require.Equal(t, 66, width())
}
