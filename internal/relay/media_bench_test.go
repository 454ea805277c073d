package relay_test

import (
	"bytes"
	"crypto/rand"
	"io"
	"net/http"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/buzzrelay/buzz/internal/config"
	"github.com/buzzrelay/buzz/internal/dbtest"
	"github.com/buzzrelay/buzz/internal/media"
	"github.com/buzzrelay/buzz/internal/nostr"
	"github.com/buzzrelay/buzz/internal/relay"
	"github.com/buzzrelay/buzz/internal/relaytest"
)

// Media throughput through the relay's HTTP surface (tenant lookup, auth,
// spool and hash, store, JSON reply; then GET), 4 MiB blobs, per store.
func BenchmarkMediaHTTP(b *testing.B) {
	for name, newStore := range mediaStores {
		b.Run(name, func(b *testing.B) {
			svc := media.NewService(newStore(b), media.Limits{MaxBytes: 64 << 20, AllowedTypes: config.DefaultMediaTypes, TempDir: b.TempDir()}, nil)
			r := relaytest.StartWith(b, dbtest.Pool(b), []relay.Option{relay.WithMedia(svc)})
			key, err := nostr.GenerateSecretKey()
			require.NoError(b, err)
			blob := make([]byte, 4<<20)
			_, err = rand.Read(blob)
			require.NoError(b, err)
			copy(blob, "\x89PNG\r\n\x1a\n")
			auth := func() string {
				ev := &nostr.Event{Kind: 24242, CreatedAt: time.Now().Unix(), Tags: nostr.Tags{{"t", "upload"}, {"expiration", strconv.FormatInt(time.Now().Add(time.Hour).Unix(), 10)}}}
				require.NoError(b, ev.Sign(key))
				return authHeader(ev)
			}()
			put := func(i int) string {
				blob[100], blob[101], blob[102] = byte(i), byte(i>>8), byte(i>>16)
				req, err := http.NewRequest(http.MethodPut, r.HTTPURL+"/media/upload", bytes.NewReader(blob))
				require.NoError(b, err)
				req.Header.Set("Authorization", auth)
				resp, err := bridgeHTTP.Do(req)
				require.NoError(b, err)
				defer resp.Body.Close()
				require.Equal(b, http.StatusOK, resp.StatusCode)
				return r.HTTPURL + "/media/" + hexSHA(blob)
			}
			b.Run("upload", func(b *testing.B) {
				b.SetBytes(int64(len(blob)))
				for i := 0; b.Loop(); i++ {
					put(i + 1)
				}
			})
			url := put(0)
			b.Run("download", func(b *testing.B) {
				b.SetBytes(int64(len(blob)))
				for b.Loop() {
					resp, err := bridgeHTTP.Get(url)
					require.NoError(b, err)
					n, err := io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
					require.NoError(b, err)
					require.EqualValues(b, len(blob), n)
				}
			})
		})
	}
}
