package replica_test

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/buzzrelay/buzz/internal/dberr"
	"github.com/buzzrelay/buzz/internal/dbtest"
	"github.com/buzzrelay/buzz/internal/replica"
)

func TestMain(m *testing.M) { dbtest.Main(m) }

var quiet = slog.New(slog.DiscardHandler)

// writerPool is a pool on url armed with the created_at floor, as the
// relay's writer pool is when a reader is configured.
func writerPool(t *testing.T, url string) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(url)
	require.NoError(t, err)
	replica.ArmFloor(cfg, replica.DefaultFloor)
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	return pool
}

func TestCreatedAtFloorGuard(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := dbtest.URL(t)
	pool := writerPool(t, url)

	// Catalog: a row-level AFTER constraint trigger on INSERT and UPDATE,
	// deferred to commit.
	var deferrable, deferred bool
	var tgtype int16
	require.NoError(t, pool.QueryRow(ctx, `
		SELECT tgdeferrable, tginitdeferred, tgtype FROM pg_trigger
		WHERE tgrelid = 'events'::regclass AND tgname = 'events_created_at_floor' AND tgconstraint <> 0`).
		Scan(&deferrable, &deferred, &tgtype))
	require.True(t, deferrable)
	require.True(t, deferred)
	const rowLevel, before, insert, update = 1, 2, 4, 16
	require.Equal(t, int16(rowLevel|insert|update), tgtype&(rowLevel|before|insert|update))
	var floor string
	require.NoError(t, pool.QueryRow(ctx, "SHOW buzz.created_at_floor").Scan(&floor))
	require.Equal(t, "960", floor)

	var community string
	require.NoError(t, pool.QueryRow(ctx, "INSERT INTO communities (host) VALUES ('floor.test') RETURNING id").Scan(&community))
	channel := "0b9a7c6e-6a49-4c43-9a0b-1f1f1f1f1f1f"
	ins := `INSERT INTO events (community_id, id, pubkey, created_at, kind, tags, content, sig, channel_id)
	        VALUES ($1, decode(md5($2) || md5($2), 'hex'), decode(repeat('ab', 32), 'hex'), $3, 9, '[]', '', decode(repeat('cd', 64), 'hex'), $4)`
	old := time.Now().Add(-20 * time.Minute)
	// An old channel event fails at commit, with the rule's name.
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		_, err := tx.Exec(ctx, ins, community, "old", old, channel)
		require.NoError(t, err, "the check waits for commit")
		return nil
	})
	v, ok := dberr.AsViolation(err)
	require.True(t, ok, "%v", err)
	require.Equal(t, "events_created_at_floor", v.Constraint)
	require.Contains(t, v.ClientText, "too far in the past")
	// A fresh channel event and an old channel-less one are stored.
	_, err = pool.Exec(ctx, ins, community, "fresh", time.Now(), channel)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, ins, community, "global", old, nil)
	require.NoError(t, err)
	// Moving the old channel-less row into a channel, or dating a channel
	// row below the floor, is refused.
	_, err = pool.Exec(ctx, "UPDATE events SET channel_id = $1 WHERE content = '' AND channel_id IS NULL", channel)
	v, ok = dberr.AsViolation(err)
	require.True(t, ok, "%v", err)
	require.Equal(t, "events_created_at_floor", v.Constraint)
	_, err = pool.Exec(ctx, "UPDATE events SET created_at = $1 WHERE channel_id IS NOT NULL", old)
	_, ok = dberr.AsViolation(err)
	require.True(t, ok, "%v", err)

	// The floor is measured at commit, not at the transaction's start: a
	// row that was fresh when inserted but committed after the floor passed
	// is refused. (Mutation killed: now() in place of clock_timestamp().)
	slow, err := pgx.Connect(ctx, url)
	require.NoError(t, err)
	defer slow.Close(ctx)
	_, err = slow.Exec(ctx, "SET buzz.created_at_floor = '1'")
	require.NoError(t, err)
	err = pgx.BeginFunc(ctx, slow, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, ins, community, "slow", time.Now(), channel); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, "SELECT pg_sleep(1.5)")
		return err
	})
	v, ok = dberr.AsViolation(err)
	require.True(t, ok, "%v", err)
	require.Equal(t, "events_created_at_floor", v.Constraint)

	// A session without the setting (a restore, a backfill) is not checked.
	unarmed, err := pgx.Connect(ctx, url)
	require.NoError(t, err)
	defer unarmed.Close(ctx)
	_, err = unarmed.Exec(ctx, ins, community, "backfill", old, channel)
	require.NoError(t, err)
}
