package relay_test

import (
	"context"
	"encoding/json"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/buzzrelay/buzz/internal/logtest"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/buzzrelay/buzz/internal/community"
	"github.com/buzzrelay/buzz/internal/config"
	"github.com/buzzrelay/buzz/internal/db"
	"github.com/buzzrelay/buzz/internal/dbtest"
	"github.com/buzzrelay/buzz/internal/fanout"
	"github.com/buzzrelay/buzz/internal/ingest"
	"github.com/buzzrelay/buzz/internal/nostr"
	"github.com/buzzrelay/buzz/internal/relay"
	"github.com/buzzrelay/buzz/internal/relaytest"
)

// The list folder as the relay runs it (Server.RunListFolder, on the
// relay's write timeout): a fold that cannot finish, here because the
// test holds the channel's row past the timeout, is logged as a warning;
// once the row is free a later pass writes the lists; and the loop returns
// when the relay's context ends. Mutations killed: the failure not logged;
// the loop giving up after a failure (the lists never written); the loop
// not returning on its context.
func TestRelayListFolderLogsAFailedFoldAndWritesItLater(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := dbtest.Pool(t)
	row, err := db.New(pool).CommunityCreate(ctx, "folder.example")
	require.NoError(t, err)
	tenant := community.FromRow(row)

	owner := relaytest.NewKey(t)
	ch := uuid.NewString()
	create := &nostr.Event{Kind: ingest.KindCreateGroup, CreatedAt: time.Now().Unix(), Tags: nostr.Tags{{"h", ch}, {"name", "folded"}}}
	require.NoError(t, create.Sign(owner))
	_, err = ingest.New(pool, fanout.NewHub(), ingest.Options{MaxFutureSkew: time.Minute}).Submit(ctx, tenant, create.PubKey, create)
	require.NoError(t, err)
	// A member the stored list lacks, and the channel's mark, as a
	// change of a large channel leaves them.
	member := relaytest.NewKey(t).PublicKeyHex()
	_, err = pool.Exec(ctx, `INSERT INTO channel_members (community_id, channel_id, pubkey) VALUES ($1, $2, decode($3, 'hex'))`, tenant.ID(), ch, member)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `INSERT INTO channel_lists_due (community_id, channel_id, due_at) VALUES ($1, $2, now())`, tenant.ID(), ch)
	require.NoError(t, err)
	listed := func() bool {
		tag, _ := json.Marshal([][]string{{"p", member}})
		var n int
		require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM events WHERE kind = $1 AND d_tag = $2 AND deleted_at IS NULL AND tags @> $3::jsonb`,
			ingest.KindGroupMembers, ch, string(tag)).Scan(&n))
		return n == 1
	}
	require.False(t, listed())

	hold, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = hold.Rollback(ctx) }()
	_, err = hold.Exec(ctx, `SELECT 1 FROM channels WHERE id = $1 FOR NO KEY UPDATE`, ch)
	require.NoError(t, err)

	cfg := config.Default()
	cfg.IngestWriteTimeout = time.Second
	logs := &logtest.Buffer{}
	srv := relay.New(cfg, pool, slog.New(slog.NewTextHandler(logs, nil)))
	t.Cleanup(func() {
		sctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
	})
	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	done := make(chan struct{})
	go func() { srv.RunListFolder(runCtx); close(done) }()

	waitUntil := func(what string, cond func() bool) {
		t.Helper()
		deadline := time.Now().Add(60 * time.Second)
		for !cond() {
			require.True(t, time.Now().Before(deadline), "gave up waiting: %s; log: %s", what, logs.String())
			time.Sleep(10 * time.Millisecond)
		}
	}
	waitUntil("the failed fold logged", func() bool { return strings.Contains(logs.String(), "channel lists: fold failed") })
	require.Contains(t, logs.String(), "level=WARN")
	require.False(t, listed(), "written while the test held the channel")
	require.NoError(t, hold.Rollback(ctx))
	waitUntil("the lists written on a later pass", listed)

	stop()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("RunListFolder did not return once the relay's context ended")
	}
}
