package migrate_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/buzzrelay/buzz/internal/dbtest"
)

// Two sessions that each remove one of a channel's last two owners, at
// once and without the relay's channel lock (a psql session, a repair
// script): the second waits for the first and is refused, so the channel
// keeps an owner. Mutation killed: migration 031's function without its
// row lock (011's body): both commit and the channel has no owner.
func TestLastOwnersRemovedConcurrentlyKeepOne(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := dbtest.URL(t)
	first, second := connect(t, url), connect(t, url)
	community, channel := uuid.New(), uuid.New()
	a, b := make([]byte, 32), make([]byte, 32)
	a[0], b[0] = 1, 2
	for _, s := range []struct {
		sql  string
		args []any
	}{
		{`INSERT INTO communities (id, host) VALUES ($1, 'owner-race.example')`, []any{community}},
		{`INSERT INTO channels (community_id, id, name, created_by) VALUES ($1, $2, 'room', $3)`, []any{community, channel, a}},
		{`INSERT INTO channel_members (community_id, channel_id, pubkey, role) VALUES ($1, $2, $3, 'owner'), ($1, $2, $4, 'owner')`,
			[]any{community, channel, a, b}},
	} {
		_, err := first.Exec(ctx, s.sql, s.args...)
		require.NoError(t, err)
	}
	const remove = `UPDATE channel_members SET removed_at = now() WHERE community_id = $1 AND channel_id = $2 AND pubkey = $3`

	tx, err := first.Begin(ctx)
	require.NoError(t, err)
	_, err = tx.Exec(ctx, remove, community, channel, a)
	require.NoError(t, err)
	done := make(chan error, 1)
	go func() {
		_, err := second.Exec(ctx, remove, community, channel, b)
		done <- err
	}()
	// The second removal waits for the first transaction, or (without the
	// lock) has already passed its check.
	select {
	case err = <-done:
	case <-time.After(500 * time.Millisecond):
		require.NoError(t, tx.Commit(ctx))
		err = <-done
	}
	_ = tx.Commit(ctx)
	var pgErr *pgconn.PgError
	require.True(t, errors.As(err, &pgErr), "the second removal is refused: %v", err)
	require.Equal(t, "channel_members_keep_an_owner", pgErr.ConstraintName)

	var owners int
	require.NoError(t, first.QueryRow(ctx, `SELECT count(*) FROM channel_members
		WHERE community_id = $1 AND channel_id = $2 AND role = 'owner' AND removed_at IS NULL`, community, channel).Scan(&owners))
	require.Equal(t, 1, owners)
}
