package relay_test

import (
	"context"
	"fmt"
	"net"
	"net/url"
	"testing"

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
	svc := media.NewService(paused, media.Limits{MaxBytes: testMediaMaxBytes, AllowedTypes: config.DefaultMediaTypes, TempDir: t.TempDir()}, nil)
	r := relaytest.StartWith(t, dbtest.Pool(t), []relay.Option{relay.WithMedia(svc)})
	ctx := context.Background()
	key := relaytest.NewKey(t)

	u, err := url.Parse(r.HTTPURL)
	require.NoError(t, err)
	conn, err := net.Dial("tcp", u.Host)
	require.NoError(t, err)
	defer conn.Close()
	_, err = fmt.Fprintf(conn, "PUT /media/upload HTTP/1.1\r\nHost: %s\r\nAuthorization: %s\r\nContent-Length: %d\r\n\r\n",
		u.Host, blossomAuth(t, key, "upload", []string{hexSHA(blob)}, nil), len(blob))
	require.NoError(t, err)
	_, err = conn.Write(blob)
	require.NoError(t, err)
	<-paused.Entered
	require.NoError(t, conn.Close())

	// The upload's lease is released once the handler returned.
	waitFor(t, func() bool {
		var live int
		return r.Pool.QueryRow(ctx, `SELECT count(*) FROM community_serving_write_leases WHERE community_id = $1`, r.CommunityID).Scan(&live) == nil && live == 0
	})
	require.Empty(t, storeKeys(t, store), "the abandoned upload's blob is left in the store")
	require.Zero(t, mediaUsage(t, db.New(r.Pool), r.CommunityID))
}
