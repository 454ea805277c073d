package relay_test

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"testing"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/buzzrelay/buzz/internal/config"
	"github.com/buzzrelay/buzz/internal/db"
	"github.com/buzzrelay/buzz/internal/dbtest"
	"github.com/buzzrelay/buzz/internal/media"
	"github.com/buzzrelay/buzz/internal/media/mediatest"
	"github.com/buzzrelay/buzz/internal/relay"
	"github.com/buzzrelay/buzz/internal/relaytest"
)

// A client that sends its whole body and hangs up while the relay is
// storing the blob (the request's context ends) leaves nothing behind: the
// upload fails after the blob was written, and the blob, referenced by no
// community, is removed. Before, it stayed in the store: its bytes were
// given back to the quota, no sidecar named it, and no delete or community
// deletion would ever reach it, so any key could fill the store past every
// community's quota, one hang-up per blob, and a deleted community's bytes
// outlived it. Mutation killed: the failed upload not removing the blob it
// wrote (the blob key stays in the store).
func TestMediaUploadAbandonedMidStoreLeavesNoBlob(t *testing.T) {
	t.Parallel()
	store, err := media.NewFSStore(t.TempDir())
	require.NoError(t, err)
	blob := pngBlob(t, 4096)
	paused := mediatest.NewPutUntilCanceled(store, hexSHA(blob)+".png")
	r := mediaRelay(t, paused)
	u, err := url.Parse(r.HTTPURL)
	require.NoError(t, err)
	abandonUpload(t, r, u.Host, r.CommunityID, blob, paused.Entered)
	require.Empty(t, storeKeys(t, store), "the abandoned upload's blob is left in the store")
	require.Zero(t, mediaUsage(t, db.New(r.Pool), r.CommunityID))
}

// A client that hangs up while the relay writes its community's sidecar or
// upload record, when the store takes the write but the relay's request
// reports the cancellation (an S3 PUT completed after the caller stopped
// waiting), leaves nothing behind either: no sidecar, no upload record, no
// blob, no bytes counted. Before, a sidecar whose write reported failure
// was never removed: the blob stayed served where the upload had failed,
// its reservation given back (counted nowhere), and with no upload record
// no member could delete it. Mutations killed: a failed sidecar write not
// removed (GET 200, the sidecar and the blob stay); a failed upload record
// write not removed (the record stays).
func TestMediaUploadAbandonedMidReferenceLeavesNothing(t *testing.T) {
	t.Parallel()
	for _, what := range []string{"sidecar", "upload record"} {
		t.Run(what, func(t *testing.T) {
			t.Parallel()
			store, err := media.NewFSStore(t.TempDir())
			require.NoError(t, err)
			blob := pngBlob(t, 4096)
			pool := dbtest.Pool(t)
			row, err := db.New(pool).CommunityCreate(context.Background(), "abandon-"+uuid.NewString()[:8]+".example")
			require.NoError(t, err)
			key := "_meta/" + row.ID.String() + "/" + hexSHA(blob) + ".json"
			if what == "upload record" {
				key = "_uploads/" + row.ID.String() + "/" + hexSHA(blob) + "/"
			}
			paused := mediatest.NewPutUntilCanceled(store, key)
			paused.ReportCancel = true
			svc := media.NewService(paused, media.Limits{MaxBytes: testMediaMaxBytes, AllowedTypes: config.DefaultMediaTypes, TempDir: t.TempDir()}, nil)
			r := relaytest.StartWith(t, pool, []relay.Option{relay.WithMedia(svc)})
			abandonUpload(t, r, row.Host, row.ID, blob, paused.Entered)
			require.Equal(t, http.StatusNotFound, mediaDo(t, r, http.MethodGet, row.Host, "/media/"+hexSHA(blob), "", nil, nil).Status,
				"the blob of an abandoned upload is served")
			require.Empty(t, storeKeys(t, store), "the abandoned upload left objects in the store")
			require.Zero(t, mediaUsage(t, db.New(r.Pool), row.ID))
		})
	}
}

// abandonUpload sends a whole upload of blob to host's community on a raw
// connection, hangs up once the store is entered (entered: the relay is
// writing), and waits until the upload's serving-write lease is released
// (its handler returned).
func abandonUpload(t *testing.T, r *relaytest.Relay, host string, community uuid.UUID, blob []byte, entered <-chan struct{}) {
	t.Helper()
	u, err := url.Parse(r.HTTPURL)
	require.NoError(t, err)
	conn, err := net.Dial("tcp", u.Host)
	require.NoError(t, err)
	defer conn.Close()
	_, err = fmt.Fprintf(conn, "PUT /media/upload HTTP/1.1\r\nHost: %s\r\nAuthorization: %s\r\nContent-Length: %d\r\n\r\n",
		host, blossomAuth(t, relaytest.NewKey(t), "upload", []string{hexSHA(blob)}, nil), len(blob))
	require.NoError(t, err)
	_, err = conn.Write(blob)
	require.NoError(t, err)
	<-entered
	require.NoError(t, conn.Close())
	waitFor(t, func() bool {
		var live int
		return r.Pool.QueryRow(context.Background(), `SELECT count(*) FROM community_serving_write_leases WHERE community_id = $1`, community).Scan(&live) == nil && live == 0
	})
}
