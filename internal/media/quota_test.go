package media_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io"
	"strings"
	"sync"
	"sync/atomic"
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

// sidecarStoredButFailingStore stores sidecars but answers their writes
// with an error, as an S3 PUT the store completed after the client's
// hang-up cancelled the relay's wait would.
type sidecarStoredButFailingStore struct{ media.Store }

func (s sidecarStoredButFailingStore) Put(ctx context.Context, key string, body io.Reader, size int64, contentType string) error {
	err := s.Store.Put(ctx, key, body, size, contentType)
	if err == nil && strings.HasPrefix(key, "_meta/") {
		err = errors.New("store unavailable")
	}
	return err
}

// An upload whose sidecar write fails (a store error, or a client gone at
// that moment), even one the store took, leaves neither the sidecar, nor
// its upload record, nor the reservation, so the blob is not the
// community's and a retry counts it; if the sidecar cannot be removed
// either, the reservation stays (the count errs high, never low) and so
// does the record, by which the uploader can still delete the blob. A
// failure before the references gives the bytes back. Mutations killed:
// the failure path keeping the sidecar while releasing (the retry reserves
// nothing and the blob is stored uncounted); releasing although the
// sidecar stayed; removing the record although the sidecar stayed (alice
// may not delete it).
func TestUploadFailingToReferenceLeavesNoUncountedBlob(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	fs, err := media.NewFSStore(t.TempDir())
	require.NoError(t, err)
	limits := media.Limits{MaxBytes: 1 << 20, AllowedTypes: []string{"text/plain"}, TempDir: t.TempDir()}
	quota := &countingQuota{bytes: map[uuid.UUID]int64{}}
	community := uuid.New()
	blob := []byte("counted once, however the upload ended")

	failing := media.NewService(sidecarStoredButFailingStore{fs}, limits, nil)
	failing.UseQuota(quota)
	_, err = failing.Upload(ctx, community, "alice", bytes.NewReader(blob), nil)
	require.ErrorContains(t, err, "store sidecar")
	require.Zero(t, quota.of(community), "nothing of the failed upload counts")
	svc := media.NewService(fs, limits, nil)
	svc.UseQuota(quota)
	_, _, err = svc.Open(ctx, community, hexSHA256(blob))
	require.ErrorIs(t, err, media.ErrNotFound, "nor is its blob the community's")

	d, err := svc.Upload(ctx, community, "alice", bytes.NewReader(blob), nil)
	require.NoError(t, err)
	require.EqualValues(t, media.BlobCharge(int64(len(blob)))+media.ObjectCharge, quota.of(community), "the retry counts the blob and its record")
	require.NoError(t, svc.Delete(ctx, community, d.SHA256, "alice"))
	require.Zero(t, quota.of(community))

	// The sidecar cannot be removed either: it stays, and so do its bytes
	// and alice's record, by which she deletes it.
	stuck := uuid.New()
	sticky := media.NewService(sidecarStickyStore{sidecarStoredButFailingStore{fs}}, limits, nil)
	sticky.UseQuota(quota)
	_, err = sticky.Upload(ctx, stuck, "alice", bytes.NewReader(blob), nil)
	require.ErrorContains(t, err, "store sidecar")
	require.EqualValues(t, media.BlobCharge(int64(len(blob)))+media.ObjectCharge, quota.of(stuck), "the sidecar stayed: the blob and the record are counted")
	require.NoError(t, svc.Delete(ctx, stuck, d.SHA256, "alice"), "the uploader deletes the sidecar left")
	require.Zero(t, quota.of(stuck))

	// A failure before the references gives the bytes back.
	other := uuid.New()
	broken := media.NewService(failingPutStore{fs}, limits, nil)
	broken.UseQuota(quota)
	_, err = broken.Upload(ctx, other, "alice", bytes.NewReader([]byte("never stored")), nil)
	require.Error(t, err)
	require.Zero(t, quota.of(other))
}

// sidecarStickyStore refuses to delete sidecars.
type sidecarStickyStore struct{ media.Store }

func (s sidecarStickyStore) Delete(ctx context.Context, key string) error {
	if strings.HasPrefix(key, "_meta/") {
		return errors.New("store unavailable")
	}
	return s.Store.Delete(ctx, key)
}

func hexSHA256(b []byte) string {
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}

// failingPutStore fails every write.
type failingPutStore struct{ media.Store }

func (failingPutStore) Put(context.Context, string, io.Reader, int64, string) error {
	return errors.New("store unavailable")
}

// A sidecar and an upload record written before the quota counted objects
// carry no charge: their delete gives back the blob's size, as it was
// counted then, and nothing for the record. Mutation killed: the sidecar's
// charge read as written (0: the blob's bytes stay counted for good).
func TestDeleteOfAnUploadCountedByBytesGivesBackItsBytes(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	fs, err := media.NewFSStore(t.TempDir())
	require.NoError(t, err)
	quota := &countingQuota{bytes: map[uuid.UUID]int64{}}
	svc := media.NewService(fs, media.Limits{MaxBytes: 1 << 20, AllowedTypes: []string{"text/plain"}, TempDir: t.TempDir()}, nil)
	svc.UseQuota(quota)
	community := uuid.New()
	blob := []byte("uploaded when only bytes counted")
	sha := hexSHA256(blob)
	put := func(key, body string) {
		require.NoError(t, fs.Put(ctx, key, strings.NewReader(body), int64(len(body)), "application/json"))
	}
	put(sha+".txt", string(blob))
	put("_meta/"+community.String()+"/"+sha+".json", `{"sha256":"`+sha+`","size":32,"type":"text/plain","uploaded":1,"blob":"`+sha+`.txt"}`)
	put("_uploads/"+community.String()+"/"+sha+"/01HZZZZZZZZZZZZZZZZZZZZZZZ.json", `{"pubkey":"alice","sha256":"`+sha+`","uploaded":1}`)
	require.NoError(t, quota.Reserve(ctx, community, 1000+int64(len(blob)))) // other blobs, and this one's bytes

	require.NoError(t, svc.Delete(ctx, community, sha, "alice"))
	require.EqualValues(t, 1000, quota.of(community))
}

// recordStoredButStuckStore stores upload records but answers their writes
// with an error, and cannot delete them, while stuck is set: a write the
// store completed unseen, then a store that fails the cleanup.
type recordStoredButStuckStore struct {
	media.Store
	stuck *atomic.Bool
}

func (s recordStoredButStuckStore) Put(ctx context.Context, key string, body io.Reader, size int64, contentType string) error {
	err := s.Store.Put(ctx, key, body, size, contentType)
	if err == nil && s.stuck.Load() && strings.HasPrefix(key, "_uploads/") {
		err = errors.New("store unavailable")
	}
	return err
}

func (s recordStoredButStuckStore) Delete(ctx context.Context, key string) error {
	if s.stuck.Load() && strings.HasPrefix(key, "_uploads/") {
		return errors.New("store unavailable")
	}
	return s.Store.Delete(ctx, key)
}

// A record whose write failed but which the store kept, and whose removal
// failed too, stays counted: it carries its charge, which a later delete
// gives back. Counted as gone, that delete took the count below what is
// stored.
func TestRecordLeftByAFailedUploadStaysCounted(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	fs, err := media.NewFSStore(t.TempDir())
	require.NoError(t, err)
	var stuck atomic.Bool
	stuck.Store(true)
	quota := &countingQuota{bytes: map[uuid.UUID]int64{}}
	svc := media.NewService(recordStoredButStuckStore{Store: fs, stuck: &stuck}, media.Limits{MaxBytes: 1 << 20, AllowedTypes: []string{"text/plain"}, TempDir: t.TempDir()}, nil)
	svc.UseQuota(quota)
	community := uuid.New()
	blob := []byte("a record the store kept unseen")

	_, err = svc.Upload(ctx, community, "alice", bytes.NewReader(blob), nil)
	require.Error(t, err)
	records, err := fs.List(ctx, "_uploads/"+community.String()+"/")
	require.NoError(t, err)
	require.Len(t, records, 1, "the store kept the record it answered with an error")
	require.EqualValues(t, media.ObjectCharge, quota.of(community), "the record left is counted")

	stuck.Store(false)
	_, err = svc.Upload(ctx, community, "alice", bytes.NewReader(blob), nil)
	require.NoError(t, err)
	require.NoError(t, svc.Delete(ctx, community, hexSHA256(blob), "alice"))
	records, err = fs.List(ctx, "_uploads/"+community.String()+"/")
	require.NoError(t, err)
	require.Empty(t, records)
	require.Zero(t, quota.of(community))
}
