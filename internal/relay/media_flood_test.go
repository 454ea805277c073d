package relay_test

import (
	"bytes"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/buzzrelay/buzz/internal/config"
	"github.com/buzzrelay/buzz/internal/media"
	"github.com/buzzrelay/buzz/internal/relay"
	"github.com/buzzrelay/buzz/internal/relaytest"
)

// Any key may upload, so after its claim an upload makes the relay run its
// quota reservation (a transaction) and take its blob lock (a connection
// held while the sidecar and upload record are written to the store, or
// while another holder of the hash's lock finishes): at the default caps,
// 16 uploads from 4 addresses, each with a fresh key. While either
// statement is slow they must leave the writers their connections, and
// every upload is then stored.
//
// Mutations killed: the quota's transaction taking no read slot, the blob
// lock taking none (the 16 hold all 8 connections and the publish is
// never answered).
func TestFreshKeyUploadFloodLeavesWritersTheirConnections(t *testing.T) {
	t.Parallel()
	for _, statement := range []string{"ServingLeaseAcquire", "MediaUsageReserve", "MediaBlobLock"} {
		t.Run(statement, func(t *testing.T) {
			t.Parallel()
			svc := media.NewService(mediaStores["fs"](t), media.Limits{MaxBytes: testMediaMaxBytes, AllowedTypes: config.DefaultMediaTypes, TempDir: t.TempDir()}, nil)
			held, r, publisher := relayWithHeldStatement(t, statement, []relay.Option{relay.WithMedia(svc)}, func(c *config.Config) {
				c.TrustedProxies = mustPrefixes(t, "127.0.0.0/8,::1") // the test names each client's address
			}) // 16 uploads at once, 4 per address
			release := held.start(t)
			statuses := make(chan int, 16)
			for i := range 16 {
				blob := pngBlob(t, 800)
				auth := blossomAuth(t, relaytest.NewKey(t), "upload", []string{hexSHA(blob)}, nil)
				go func() {
					req, err := http.NewRequest(http.MethodPut, r.HTTPURL+"/media/upload", bytes.NewReader(blob))
					if err != nil {
						statuses <- 0
						return
					}
					req.Header.Set("Authorization", auth)
					req.Header.Set("X-Forwarded-For", fmt.Sprintf("203.0.113.%d", i%4+1))
					resp, err := (&http.Client{Timeout: time.Minute}).Do(req)
					if err != nil {
						statuses <- 0
						return
					}
					resp.Body.Close()
					statuses <- resp.StatusCode
				}()
			}
			writersServedWhileSlotsHeld(t, held, publisher, "published while fresh keys' uploads are held", statement)
			release()
			for range 16 {
				require.Equal(t, http.StatusOK, <-statuses)
			}
		})
	}
}
