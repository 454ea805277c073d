package media_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"strings"
	"sync"
	"testing"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/buzzrelay/buzz/internal/media"
)

// countingQuota is a media.Quota without a database: bytes per community.
type countingQuota struct {
	mu    sync.Mutex
	bytes map[uuid.UUID]int64
}

func (q *countingQuota) Reserve(_ context.Context, c uuid.UUID, size int64) error {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.bytes[c] += size
	return nil
}

func (q *countingQuota) Release(_ context.Context, c uuid.UUID, size int64) error {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.bytes[c] = max(0, q.bytes[c]-size)
	return nil
}

func (q *countingQuota) of(c uuid.UUID) int64 {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.bytes[c]
}

// recordFailingStore fails the writes of upload records (the step after
// the sidecar), as a store error or a client gone mid-upload would.
type recordFailingStore struct{ media.Store }

func (s recordFailingStore) Put(ctx context.Context, key string, body io.Reader, size int64, contentType string) error {
	if strings.HasPrefix(key, "_uploads/") {
		return errors.New("store unavailable")
	}
	return s.Store.Put(ctx, key, body, size, contentType)
}

// An upload that fails after it wrote the community's sidecar keeps its
// reservation: the sidecar makes the blob the community's, and a later
// upload of it (which finds the sidecar) reserves nothing. Giving the
// bytes back there stored the blob uncounted, so a client that lost its
// connection at that moment (or met a store error) kept blobs past the
// quota. Mutation killed: the failure path releasing whatever failed
// (the count reads 0 after the failed upload and its retry).
func TestUploadFailingAfterItsSidecarKeepsTheReservation(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	fs, err := media.NewFSStore(t.TempDir())
	require.NoError(t, err)
	limits := media.Limits{MaxBytes: 1 << 20, AllowedTypes: []string{"text/plain"}, TempDir: t.TempDir()}
	quota := &countingQuota{bytes: map[uuid.UUID]int64{}}
	community := uuid.New()
	blob := []byte("counted once, however the upload ended")

	failing := media.NewService(recordFailingStore{fs}, limits, nil)
	failing.UseQuota(quota)
	_, err = failing.Upload(ctx, community, "alice", bytes.NewReader(blob), nil)
	require.ErrorContains(t, err, "store upload record")
	require.EqualValues(t, len(blob), quota.of(community), "the sidecar was written: the blob is the community's")

	svc := media.NewService(fs, limits, nil)
	svc.UseQuota(quota)
	d, err := svc.Upload(ctx, community, "alice", bytes.NewReader(blob), nil)
	require.NoError(t, err)
	require.EqualValues(t, len(blob), quota.of(community), "the retry finds the sidecar and reserves nothing more")
	require.NoError(t, svc.Delete(ctx, community, d.SHA256, "alice"))
	require.Zero(t, quota.of(community))

	// A failure before the sidecar gives the bytes back.
	other := uuid.New()
	broken := media.NewService(failingPutStore{fs}, limits, nil)
	broken.UseQuota(quota)
	_, err = broken.Upload(ctx, other, "alice", bytes.NewReader([]byte("never stored")), nil)
	require.Error(t, err)
	require.Zero(t, quota.of(other))
}

// failingPutStore fails every write.
type failingPutStore struct{ media.Store }

func (failingPutStore) Put(context.Context, string, io.Reader, int64, string) error {
	return errors.New("store unavailable")
}
