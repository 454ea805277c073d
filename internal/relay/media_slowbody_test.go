package relay_test

import (
	"bytes"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/buzzrelay/buzz/internal/config"
	"github.com/buzzrelay/buzz/internal/db"
	"github.com/buzzrelay/buzz/internal/dbtest"
	"github.com/buzzrelay/buzz/internal/media"
	"github.com/buzzrelay/buzz/internal/relay"
	"github.com/buzzrelay/buzz/internal/relaytest"
)

// An upload whose body arrives within BUZZ_HTTP_READ_TIMEOUT but after
// BUZZ_HTTP_WRITE_TIMEOUT (counted from the request's headers) is stored,
// and answered: the answer's deadline follows the body. Before, the blob,
// its record and its count were written and the answer was cut off, so
// the client took a stored upload for a failed one.
// Mutation killed: no write deadline set once the body is read (the
// client's request fails with the connection closed).
func TestMediaSlowUploadIsAnswered(t *testing.T) {
	t.Parallel()
	store := mediaStores["fs"](t)
	svc := media.NewService(store, media.Limits{MaxBytes: testMediaMaxBytes, AllowedTypes: config.DefaultMediaTypes, TempDir: t.TempDir()}, nil)
	const writeTimeout = 4 * time.Second
	r := relaytest.StartWith(t, dbtest.Pool(t), []relay.Option{relay.WithMedia(svc)}, func(c *config.Config) {
		c.HTTPReadTimeout = 30 * time.Second
		c.HTTPWriteTimeout = writeTimeout
	})
	key := relaytest.NewKey(t)
	blob := pngBlob(t, 4000)
	body, send := io.Pipe()
	go func() {
		_, _ = send.Write(blob[:1000])
		// Past the write timeout, well inside the read timeout: the body
		// is slow, not late.
		time.Sleep(writeTimeout + 2*time.Second)
		_, _ = send.Write(blob[1000:])
		_ = send.Close()
	}()
	req, err := http.NewRequest(http.MethodPut, r.HTTPURL+"/media/upload", body)
	require.NoError(t, err)
	req.ContentLength = int64(len(blob))
	req.Header.Set("Authorization", blossomAuth(t, key, "upload", []string{hexSHA(blob)}, nil))
	resp, err := bridgeHTTP.Do(req)
	require.NoError(t, err, "the stored upload's answer was cut off")
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	require.NoError(t, err, "the stored upload's answer was cut off")
	require.Equal(t, http.StatusOK, resp.StatusCode, "%s", raw)
	got := mediaDo(t, r, http.MethodGet, "", "/media/"+hexSHA(blob), "", nil, nil)
	require.Equal(t, http.StatusOK, got.Status)
	require.True(t, bytes.Equal(blob, got.Body))
	require.Equal(t, uploadCharge(blob), mediaUsage(t, db.New(r.Pool), r.CommunityID))
}

// A NIP-98 upload whose event has no payload tag is refused 401 before a
// byte of its body is read: no body passes without one. This body never
// ends (its writer waits for the answer), so only a refusal made before
// reading it answers the client; read first, the upload waited for the
// rest until BUZZ_HTTP_READ_TIMEOUT, spooling whatever came, and was
// refused for the unreadable body instead.
// Mutation killed: the payload tag looked at only once the body is read
// (the answer is the read timeout's 408, not 401).
func TestMediaUploadWithoutPayloadIsRefusedBeforeItsBody(t *testing.T) {
	t.Parallel()
	const maxBytes = 1 << 20 // past what the server reads of a body left unread, so it answers at once
	svc := media.NewService(mediaStores["fs"](t), media.Limits{MaxBytes: maxBytes, AllowedTypes: config.DefaultMediaTypes, TempDir: t.TempDir()}, nil)
	r := relaytest.StartWith(t, dbtest.Pool(t), []relay.Option{relay.WithMedia(svc)}, func(c *config.Config) {
		c.HTTPReadTimeout = 5 * time.Second // bounds the mutated run only
	})
	auth := authHeader(nip98(t, relaytest.NewKey(t), http.MethodPut, r.HTTPURL+"/media/upload", nil, withoutPayload))
	head := pngBlob(t, 4096)
	body, send := io.Pipe()
	defer body.Close()
	go func() {
		_, _ = send.Write(head)
		_, _ = send.Write(make([]byte, 4096)) // blocks until the client gives up the body
	}()
	req, err := http.NewRequest(http.MethodPut, r.HTTPURL+"/media/upload", body)
	require.NoError(t, err)
	req.ContentLength = maxBytes
	req.Header.Set("Authorization", auth)
	resp, err := bridgeHTTP.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	require.Equal(t, http.StatusUnauthorized, resp.StatusCode, "%s", raw)
	require.Contains(t, resp.Header.Get("X-Reason"), "no payload tag")

	// Refused before its signature is checked, which costs what the
	// refusal does not.
	// Mutation killed: the payload tag looked at after the signature (the
	// refusal names the signature).
	forged := nip98(t, relaytest.NewKey(t), http.MethodPut, r.HTTPURL+"/media/upload", nil, withoutPayload)
	forged.Sig = strings.Repeat("0", 128)
	got := mediaDo(t, r, http.MethodPut, "", "/media/upload", authHeader(forged), bytes.NewReader(head), nil)
	require.Equal(t, http.StatusUnauthorized, got.Status, "%s", got.Body)
	require.Contains(t, got.Header.Get("X-Reason"), "no payload tag")
}
