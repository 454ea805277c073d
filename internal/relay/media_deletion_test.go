package relay_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/buzzrelay/buzz/internal/db"
	"github.com/buzzrelay/buzz/internal/deletion"
	"github.com/buzzrelay/buzz/internal/media"
	"github.com/buzzrelay/buzz/internal/relaytest"
)

// An upload in flight holds a serving-write lease: a deletion of its
// community quiesces (a new upload is refused: the community no longer
// resolves) but does not fence until the
// upload finished, and then deletes what it stored. Kills: an upload path
// without the lease (the deletion lists the objects before the upload
// writes them and leaves them behind).
func TestMediaUploadHoldsOffTheDeletionFence(t *testing.T) {
	t.Parallel()
	store, err := media.NewFSStore(t.TempDir())
	require.NoError(t, err)
	r := mediaRelay(t, store)
	ctx := context.Background()
	key := relaytest.NewKey(t)
	blob := pngBlob(t, 4096)

	body, feed := io.Pipe()
	uploaded := make(chan mediaReply, 1)
	go func() {
		uploaded <- mediaDo(t, r, http.MethodPut, "", "/media/upload", blossomAuth(t, key, "upload", []string{hexSHA(blob)}, nil), body, nil)
	}()
	_, err = feed.Write(blob[:100])
	require.NoError(t, err)
	waitFor(t, func() bool {
		var live int
		return r.Pool.QueryRow(ctx, `SELECT count(*) FROM community_serving_write_leases WHERE community_id = $1`, r.CommunityID).Scan(&live) == nil && live == 1
	})

	req, err := deletion.Submit(ctx, r.Pool, store, r.Host, "ops", "")
	require.NoError(t, err)
	_, err = deletion.Approve(ctx, r.Pool, req.ID, "lead", "")
	require.NoError(t, err)
	cfg := deletion.DefaultConfig()
	cfg.RetryBaseDelay = time.Second
	exec := deletion.NewExecutor(deletion.Options{Pool: r.Pool, Store: store, Config: cfg})
	out, err := exec.Run(ctx, req.ID)
	require.NoError(t, err)
	require.Equal(t, deletion.StageApproved, out.Stage, "not fenced while the upload runs")
	require.Contains(t, *out.LastError, "serving writes have not drained")
	row, err := db.New(r.Pool).CommunityByID(ctx, r.CommunityID)
	require.NoError(t, err)
	require.Equal(t, "quiescing", row.DeletionState)
	require.Equal(t, http.StatusNotFound, upload(t, r, "", key, pngBlob(t, 100)).Status)

	_, err = feed.Write(blob[100:])
	require.NoError(t, err)
	require.NoError(t, feed.Close())
	require.Equal(t, http.StatusOK, (<-uploaded).Status, "the admitted upload finishes")

	waitFor(t, func() bool {
		out, err = exec.Run(ctx, req.ID)
		return !errors.Is(err, deletion.ErrNotRunnable)
	})
	require.NoError(t, err)
	require.Equal(t, deletion.StageRetentionPending, out.Stage, "%+v", out)
	require.Empty(t, storeKeys(t, store), "the upload's objects were deleted too")
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		require.False(t, time.Now().After(deadline), "timed out")
		time.Sleep(20 * time.Millisecond)
	}
}
