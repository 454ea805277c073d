package migrate_test

import (
	"context"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/buzzrelay/buzz/internal/dbtest"
	"github.com/buzzrelay/buzz/internal/migrate"
)

// Migration 010 on a database that already holds a loosely spelled
// deletion: the migration applies (the constraint is NOT VALID, nothing is
// scanned), new loose deletions are refused, VALIDATE CONSTRAINT reports the
// old row as the migration's comment tells the DBA, and 011 and the down
// parts apply on top.
func TestCanonicalCoordinatesMigrationOnADatabaseWithRows(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	conn := connect(t, dbtest.EmptyURL(t))
	require.NoError(t, migrate.To(ctx, conn, 9))
	insertDeletion := func(id, coordinate string) error {
		_, err := conn.Exec(ctx, `
			INSERT INTO events (community_id, id, pubkey, created_at, kind, tags, content, sig)
			VALUES ('00000000-0000-4000-8000-000000000010', decode($1, 'hex'), decode(repeat('22', 32), 'hex'), now(), 5,
			        jsonb_build_array(jsonb_build_array('a', $2::text)), '', decode(repeat('33', 64), 'hex'))`, id, coordinate)
		return err
	}
	_, err := conn.Exec(ctx, `INSERT INTO communities (id, host) VALUES ('00000000-0000-4000-8000-000000000010', 'coords.example')`)
	require.NoError(t, err)
	loose := "10002:" + strings.Repeat("22", 32)
	require.NoError(t, insertDeletion(strings.Repeat("01", 32), loose))

	require.NoError(t, migrate.To(ctx, conn, 11))
	require.ErrorContains(t, insertDeletion(strings.Repeat("02", 32), loose), "events_deletion_coordinates_canonical")
	require.NoError(t, insertDeletion(strings.Repeat("03", 32), loose+":"))
	_, err = conn.Exec(ctx, `ALTER TABLE events VALIDATE CONSTRAINT events_deletion_coordinates_canonical`)
	require.ErrorContains(t, err, "events_deletion_coordinates_canonical")

	require.NoError(t, migrate.To(ctx, conn, 9))
	require.NoError(t, insertDeletion(strings.Repeat("04", 32), loose), "rolled back: the constraint is gone")
}
