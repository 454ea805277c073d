package relay_test

import (
	"context"
	"encoding/json"
	"io"
	"maps"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/buzzrelay/buzz/internal/media"
	"github.com/buzzrelay/buzz/internal/relaytest"
)

// storeTrace is a Store that records what its callers do, by the shape of
// the key (blob, sidecar, record), not the key itself.
type storeTrace struct {
	media.Store
	mu  sync.Mutex
	ops []string
}

func (s *storeTrace) record(op, key string) {
	shape := "blob"
	switch {
	case strings.HasPrefix(key, "_meta/"):
		shape = "sidecar"
	case strings.HasPrefix(key, "_uploads/"):
		shape = "record"
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.ops = append(s.ops, op+" "+shape)
}

func (s *storeTrace) take() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	ops := s.ops
	s.ops = nil
	return ops
}

func (s *storeTrace) Stat(ctx context.Context, key string) (media.Info, error) {
	s.record("stat", key)
	return s.Store.Stat(ctx, key)
}

func (s *storeTrace) Put(ctx context.Context, key string, body io.Reader, size int64, contentType string) error {
	s.record("put", key)
	return s.Store.Put(ctx, key, body, size, contentType)
}

func (s *storeTrace) Open(ctx context.Context, key string) (media.Object, media.Info, error) {
	s.record("open", key)
	return s.Store.Open(ctx, key)
}

// Blobs are stored once for every community, so an upload of bytes that
// only another community holds must not answer differently, nor do less
// work, than an upload of new bytes: it would tell the uploader that
// someone, somewhere on the relay, stored this file (on the dev box's
// disk the upload of a 32 MiB blob another community held took a median
// 67 ms against 187 ms for new bytes: the blob's write and fsync were
// skipped).
// The two uploads make the same store calls, in the same order, and get
// the same status, headers and descriptor but for the hash.
// Mutation killed: the upload skipping the write of a blob the store
// already holds (the trace lacks its put).
func TestMediaUploadOfABlobAnotherCommunityHoldsLooksNew(t *testing.T) {
	t.Parallel()
	trace := &storeTrace{Store: mediaStores["fs"](t)}
	r := mediaRelay(t, trace)
	elsewhere := "dedup-elsewhere.example"
	r.AddCommunity(t, elsewhere)
	held, fresh := pngBlob(t, 4000), pngBlob(t, 4000)
	require.Equal(t, http.StatusOK, upload(t, r, elsewhere, relaytest.NewKey(t), held).Status)

	alice := relaytest.NewKey(t)
	trace.take()
	dup := upload(t, r, "", alice, held)
	dupOps := trace.take()
	novel := upload(t, r, "", alice, fresh)
	novelOps := trace.take()

	require.Equal(t, novelOps, dupOps, "the store calls of an upload tell whether another community holds the blob")
	require.Equal(t, novel.Status, dup.Status)
	require.Equal(t, http.StatusOK, dup.Status, "%s", dup.Body)
	headers := func(h http.Header) []string {
		h = h.Clone()
		h.Del("Date")
		return slices.Sorted(maps.Keys(h))
	}
	require.Equal(t, headers(novel.Header), headers(dup.Header))
	require.Equal(t, novel.Header.Get("Content-Length"), dup.Header.Get("Content-Length"))
	var dupBody, novelBody map[string]any
	require.NoError(t, json.Unmarshal(dup.Body, &dupBody))
	require.NoError(t, json.Unmarshal(novel.Body, &novelBody))
	require.InDelta(t, novelBody["uploaded"], dupBody["uploaded"], 5, "the descriptor dates this upload, not the other community's")
	for _, body := range []map[string]any{dupBody, novelBody} {
		delete(body, "sha256")
		delete(body, "url")
		delete(body, "uploaded")
	}
	require.Equal(t, novelBody, dupBody)
}
