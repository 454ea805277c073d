package deletion_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/buzzrelay/buzz/internal/deletion"
	"github.com/buzzrelay/buzz/internal/media"
	"github.com/buzzrelay/buzz/internal/media/mediatest"
)

// beforeDelete runs hook once, just before the first DeleteKeys that
// removes a key starting with prefix: another process acting between the
// deletion's steps.
type beforeDelete struct {
	media.Store
	prefix string
	once   sync.Once
	hook   func()
}

func (s *beforeDelete) DeleteKeys(ctx context.Context, keys []string) (int, int, error) {
	for _, k := range keys {
		if strings.HasPrefix(k, s.prefix) {
			s.once.Do(s.hook)
			break
		}
	}
	return s.Store.DeleteKeys(ctx, keys)
}

// A member of another community deletes their copy of a blob the doomed
// community shares while the deletion runs, between its shared-blob check
// and the removal of its own sidecars (two communities deleted at once
// interleave the same way). Each side saw the other's sidecar
// and kept the blob; nobody deleted it afterwards, so the bytes outlived
// both references and the deletion's own verification refused to finish
// (a late object, retried until the request blocked). A deletion must drop
// its own references before it decides whether a shared blob is still
// needed, as a member's media delete does.
// Mutation killed: shared-blob chunks deleted before the binding chunks
// (the run ends short of retention_pending with the blob still stored).
func TestSharedBlobReleasedByTheOtherCommunityMidDeletionIsDeleted(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	doomedHost := "doomed-shared.test"
	doomed := f.community(doomedHost)
	other := f.community("other-shared.test")
	fs, err := media.NewFSStore(t.TempDir())
	require.NoError(t, err)
	svc := media.NewService(fs, media.Limits{MaxBytes: 1 << 20, AllowedTypes: []string{"text/plain"}}, nil)
	mine := upload(t, svc, doomed, "bytes both communities hold")
	theirs := upload(t, svc, other, "bytes both communities hold")
	require.Equal(t, mine.Blob, theirs.Blob)

	store := &beforeDelete{Store: fs, prefix: media.CommunityPrefixes(doomed)[0], hook: func() {
		// The other community's uploader deletes it: its sidecar goes, and
		// the blob stays because the doomed community's sidecar is still
		// there.
		require.NoError(t, svc.Delete(context.Background(), other, theirs.SHA256, strings.Repeat("ab", 32)))
	}}
	req := f.submitAndApprove(doomedHost, store)
	exec := deletion.NewExecutor(deletion.Options{Pool: f.pool, Store: store, ID: "exec-shared", Config: testConfig()})
	out, err := exec.Run(f.ctx, req.ID)
	require.NoError(t, err)
	require.Equal(t, deletion.StageRetentionPending, out.Stage, "%+v last error %v", out, deref(out.LastError))
	_, err = fs.Stat(f.ctx, mine.Blob)
	require.ErrorIs(t, err, media.ErrNotFound, "no community references the blob any more")
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

// Another community, served by another relay process, uploads the bytes
// the doomed community alone holds while the deletion decides about them:
// the upload has seen the blob there, under its blob lock, and not yet
// written its sidecar. The deletion waits for that lock, sees the new
// sidecar and keeps the blob; it used to delete it, and the other
// community's sidecar named nothing.
// Mutation killed: deleteChunk without the chunk's blob locks (the blob is
// gone).
func TestSharedBlobUploadedElsewhereMidDeletionIsKept(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	doomedHost := "doomed-upload.test"
	doomed := f.community(doomedHost)
	other := f.community("other-upload.test")
	fs, err := media.NewFSStore(t.TempDir())
	require.NoError(t, err)
	limits := media.Limits{MaxBytes: 1 << 20, AllowedTypes: []string{"text/plain"}}
	mine := upload(t, media.NewService(fs, limits, nil), doomed, "bytes the doomed community alone holds")

	paused := mediatest.NewPauseAfterStatOrPut(fs, mine.Blob, 2) // its write of the blob, then its look under its lock
	elsewhere := media.NewService(paused, limits, nil)
	elsewhere.UseBlobLock(media.AdvisoryBlobLock(f.pool))
	uploaded := make(chan error, 1)
	go func() {
		_, err := elsewhere.Upload(context.Background(), other, strings.Repeat("cd", 32), strings.NewReader("bytes the doomed community alone holds"), nil)
		uploaded <- err
	}()
	<-paused.Paused

	req := f.submitAndApprove(doomedHost, fs)
	exec := deletion.NewExecutor(deletion.Options{Pool: f.pool, Store: fs, ID: "exec-upload", Config: testConfig()})
	type result struct {
		out deletion.Outcome
		err error
	}
	ran := make(chan result, 1)
	go func() {
		out, err := exec.Run(f.ctx, req.ID)
		ran <- result{out, err}
	}()
	// A wait on a lock of this test's database only: other packages'
	// tests share the cluster, and a wait of theirs would resume the
	// upload before the deletion reached its locks (the mutation named above
	// would then go unnoticed).
	require.Eventually(t, func() bool {
		var waiting bool
		require.NoError(t, f.pool.QueryRow(f.ctx, `SELECT EXISTS (SELECT FROM pg_locks WHERE locktype = 'advisory' AND NOT granted
			AND database = (SELECT oid FROM pg_database WHERE datname = current_database()))`).Scan(&waiting))
		return len(ran) == 1 || waiting
	}, 30*time.Second, 10*time.Millisecond, "the deletion neither finished nor waits")
	close(paused.Resume)
	require.NoError(t, <-uploaded)
	r := <-ran
	require.NoError(t, r.err)
	require.Equal(t, deletion.StageRetentionPending, r.out.Stage, "%+v last error %v", r.out, deref(r.out.LastError))
	_, err = fs.Stat(f.ctx, mine.Blob)
	require.NoError(t, err, "the other community references the blob")
}

// countBlobLocks records, at each DeleteKeys, the most blob locks the
// deletion's database holds.
type countBlobLocks struct {
	media.Store
	t    *testing.T
	pool *pgxpool.Pool
	most atomic.Int64
}

func (s *countBlobLocks) DeleteKeys(ctx context.Context, keys []string) (int, int, error) {
	var held int64
	require.NoError(s.t, s.pool.QueryRow(ctx, `SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted
		AND classid = x'626c6f62'::int::oid AND objsubid = 2
		AND database = (SELECT oid FROM pg_database WHERE datname = current_database())`).Scan(&held))
	for most := s.most.Load(); held > most && !s.most.CompareAndSwap(most, held); most = s.most.Load() {
	}
	return s.Store.DeleteKeys(ctx, keys)
}

// A community's deletion holds a bounded number of blob locks, whatever
// the size of its manifest chunk (10,000 keys by default): each is an
// entry of PostgreSQL's shared lock table, sized 64 per connection slot
// for the whole cluster, and a deletion that held a chunk's worth would
// leave every other session in the cluster "out of shared memory" for
// its locks.
// Mutation killed: deleteChunk locking the whole chunk's blobs at once
// (100 held).
func TestDeletionHoldsBoundedBlobLocks(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	host := "doomed-many-blobs.test"
	doomed := f.community(host)
	fs, err := media.NewFSStore(t.TempDir())
	require.NoError(t, err)
	svc := media.NewService(fs, media.Limits{MaxBytes: 1 << 20, AllowedTypes: []string{"text/plain"}}, nil)
	var blobs []string
	for i := range 100 {
		blobs = append(blobs, upload(t, svc, doomed, fmt.Sprint("blob number ", i)).Blob)
	}

	store := &countBlobLocks{Store: fs, t: t, pool: f.pool}
	req := f.submitAndApprove(host, store)
	exec := deletion.NewExecutor(deletion.Options{Pool: f.pool, Store: store, ID: "exec-many", Config: testConfig()})
	out, err := exec.Run(f.ctx, req.ID)
	require.NoError(t, err)
	require.Equal(t, deletion.StageRetentionPending, out.Stage, "%+v last error %v", out, deref(out.LastError))
	for _, b := range blobs {
		_, err := fs.Stat(f.ctx, b)
		require.ErrorIs(t, err, media.ErrNotFound)
	}
	require.NotZero(t, store.most.Load(), "the deletion held blob locks")
	require.LessOrEqual(t, store.most.Load(), int64(64), "blob locks held at once")
}
