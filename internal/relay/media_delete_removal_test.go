package relay_test

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/buzzrelay/buzz/internal/config"
	"github.com/buzzrelay/buzz/internal/dbtest"
	"github.com/buzzrelay/buzz/internal/media"
	"github.com/buzzrelay/buzz/internal/relay"
	"github.com/buzzrelay/buzz/internal/relaytest"
)

// refuseBlobDeletes fails the store's deletes of blobs while refusing is
// set.
type refuseBlobDeletes struct {
	media.Store
	refusing *atomic.Bool
}

func (f refuseBlobDeletes) Delete(ctx context.Context, key string) error {
	if !strings.HasPrefix(key, "_") && f.refusing.Load() {
		return errors.New("the store refused the delete")
	}
	return f.Store.Delete(ctx, key)
}

// A delete that removes its community's last reference to a blob answers
// once the community's upload record and sidecar are gone and leaves the
// blob in the store: removed there, the delete's work (and an upload of
// the same bytes waiting on it) took longer when no other community held
// the bytes, which told the deleter that someone elsewhere on the relay
// stored them. The relay's sweep removes the blob afterwards; a removal
// the store refuses is counted as failed and done by the next sweep.
// Mutations killed: the delete removing the blob again (the store is
// empty at its answer); the sweep's outcomes not counted.
func TestMediaDeleteLeavesTheBlobToTheSweep(t *testing.T) {
	t.Parallel()
	var refusing atomic.Bool
	fs := mediaStores["fs"](t)
	store := refuseBlobDeletes{Store: fs, refusing: &refusing}
	svc := media.NewService(store, media.Limits{MaxBytes: testMediaMaxBytes, AllowedTypes: config.DefaultMediaTypes, TempDir: t.TempDir()}, nil)
	r := relaytest.StartWith(t, dbtest.Pool(t), []relay.Option{relay.WithMedia(svc)}, func(c *config.Config) { c.MediaSweepGrace = 0 })
	sweeps := r.Server.Metrics().MediaSweepBlobs
	alice := relaytest.NewKey(t)
	blob := pngBlob(t, 3000)
	sha := hexSHA(blob)
	require.Equal(t, http.StatusOK, upload(t, r, "", alice, blob).Status)
	del := mediaDo(t, r, http.MethodDelete, "", "/media/"+sha, blossomAuth(t, alice, "delete", []string{sha}, nil), nil, nil)
	require.Equal(t, http.StatusOK, del.Status, "%s", del.Body)
	require.Equal(t, []string{sha + ".png"}, storeKeys(t, fs), "the community's objects are gone, the blob is the sweep's")
	require.Equal(t, http.StatusNotFound, mediaDo(t, r, http.MethodGet, "", "/media/"+sha, "", nil, nil).Status)

	refusing.Store(true)
	st := r.Server.SweepMedia(context.Background())
	require.Equal(t, 1, st.Failed)
	require.Equal(t, 1.0, testutil.ToFloat64(sweeps.WithLabelValues("failed")))
	require.Equal(t, []string{sha + ".png"}, storeKeys(t, fs))

	refusing.Store(false)
	st = r.Server.SweepMedia(context.Background())
	require.Equal(t, 1, st.Removed)
	require.Equal(t, 1.0, testutil.ToFloat64(sweeps.WithLabelValues("removed")))
	require.Empty(t, storeKeys(t, fs))
}

// An upload through the relay that references a blob the sweep noted
// unreferenced forgets the note, so the sweep's grace starts again when
// the blob is unreferenced next (media.ForgetUnreferenced; the grace
// itself is tested in the media package).
// Mutation killed: the relay not wiring the upload to forget the note (the
// note stays after the upload).
func TestMediaUploadForgetsTheSweepsNote(t *testing.T) {
	t.Parallel()
	fs := mediaStores["fs"](t)
	svc := media.NewService(fs, media.Limits{MaxBytes: testMediaMaxBytes, AllowedTypes: config.DefaultMediaTypes, TempDir: t.TempDir()}, nil)
	r := relaytest.StartWith(t, dbtest.Pool(t), []relay.Option{relay.WithMedia(svc)}, func(c *config.Config) { c.MediaSweepGrace = time.Hour })
	notes := func() int {
		var n int
		require.NoError(t, r.Pool.QueryRow(context.Background(), `SELECT count(*) FROM media_unreferenced_blobs`).Scan(&n))
		return n
	}
	alice := relaytest.NewKey(t)
	blob := pngBlob(t, 3000)
	sha := hexSHA(blob)
	require.Equal(t, http.StatusOK, upload(t, r, "", alice, blob).Status)
	del := mediaDo(t, r, http.MethodDelete, "", "/media/"+sha, blossomAuth(t, alice, "delete", []string{sha}, nil), nil, nil)
	require.Equal(t, http.StatusOK, del.Status, "%s", del.Body)
	require.Equal(t, 1, r.Server.SweepMedia(context.Background()).Marked)
	require.Equal(t, 1, notes())

	require.Equal(t, http.StatusOK, upload(t, r, "", alice, blob).Status)
	require.Zero(t, notes(), "the upload that referenced the blob again left the sweep's note")
}
