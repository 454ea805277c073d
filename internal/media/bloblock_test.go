package media_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/buzzrelay/buzz/internal/dbtest"
	"github.com/buzzrelay/buzz/internal/media"
	"github.com/buzzrelay/buzz/internal/media/mediatest"
)

func TestMain(m *testing.M) {
	if dir := os.Getenv(spoolHelperEnv); dir != "" {
		spoolHelper(dir) // never returns: the test that started it kills it
	}
	if dir := os.Getenv(referenceHelperEnv); dir != "" {
		referenceHelper(dir) // never returns either
	}
	if dir := os.Getenv(deleteHelperEnv); dir != "" {
		deleteHelper(dir) // nor this
	}
	dbtest.Main(m)
}

// Two relay processes share one store: on one, the sweep removes a blob
// whose last reference a community deleted while, on the other, a second
// community uploads the same bytes and has just written or seen the blob
// there, either before taking the blob's lock (the sweep removes it, and
// the upload, under the lock, writes the blob again) or under it (the
// sweep waits for the upload's sidecar and keeps the blob). Without blob
// locks the blob went, and the second community's sidecar named nothing
// (GET 404 until someone uploaded the bytes again).
// Mutations killed: UseBlobLock not called (each process only locks its
// own requests; "under the lock" loses the blob); no second look at the
// blob under the lock ("before the lock" loses it).
func TestSweepOnOneProcessKeepsABlobAnUploadOnAnotherReferences(t *testing.T) {
	t.Parallel()
	for name, pauseAt := range map[string]int32{"before the lock": 1, "under the lock": 2} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			pool := dbtest.Pool(t)
			store := stores["fs"](t)
			processA := processSharingBlobLocks(t, store, pool)
			first, second := uuid.New(), uuid.New()
			blob := "bytes two communities share"
			d, err := processA.Upload(ctx, first, "alice", strings.NewReader(blob), nil)
			require.NoError(t, err)
			require.NoError(t, processA.Delete(ctx, first, d.SHA256, "alice"))

			paused := mediatest.NewPauseAfterStatOrPut(store, d.Blob, pauseAt)
			processB := processSharingBlobLocks(t, paused, pool)
			deleteWhileAnUploadIsPaused(t, pool, paused.Paused, paused.Resume, func() error {
				_, err := processB.Upload(ctx, second, "bob", strings.NewReader(blob), nil)
				return err
			}, func() error { _, err := sweeper(processA, pool).Sweep(ctx); return err })

			_, obj, err := processB.Open(ctx, second, d.SHA256)
			require.NoError(t, err, "the second community's blob")
			obj.Close()
			_, _, err = processA.Open(ctx, first, d.SHA256)
			require.ErrorIs(t, err, media.ErrNotFound, "the first community's reference is gone")
		})
	}
}

// deleteWhileAnUploadIsPaused runs upload until it pauses (paused closed),
// then del until it finished or waits on a blob lock, then lets the upload
// go on (resume); both must succeed.
func deleteWhileAnUploadIsPaused(t *testing.T, pool *pgxpool.Pool, paused <-chan struct{}, resume chan struct{}, upload, del func() error) {
	t.Helper()
	uploaded := make(chan error, 1)
	go func() { uploaded <- upload() }()
	select {
	case <-paused:
	case err := <-uploaded:
		t.Fatalf("the upload finished before reaching its pause (err %v)", err)
	}
	deleted := make(chan error, 1)
	go func() { deleted <- del() }()
	require.Eventually(t, func() bool {
		return len(deleted) == 1 || waitingOnABlobLock(t, pool)
	}, 30*time.Second, 10*time.Millisecond, "the delete neither finished nor waits")
	close(resume)
	require.NoError(t, <-uploaded)
	require.NoError(t, <-deleted)
}

// processSharingBlobLocks is one relay process's media service on store,
// taking its blob locks in pool as every process sharing store does.
func processSharingBlobLocks(t *testing.T, store media.Store, pool *pgxpool.Pool) *media.Service {
	t.Helper()
	svc := media.NewService(store, media.Limits{MaxBytes: 1 << 20, AllowedTypes: []string{"text/plain"}, TempDir: t.TempDir()}, nil)
	svc.UseBlobLock(media.AdvisoryBlobLock(pool))
	return svc
}

func waitingOnABlobLock(t *testing.T, pool *pgxpool.Pool) bool {
	t.Helper()
	var waiting bool
	require.NoError(t, pool.QueryRow(context.Background(),
		`SELECT EXISTS (SELECT FROM pg_locks WHERE locktype = 'advisory' AND NOT granted AND database = (SELECT oid FROM pg_database WHERE datname = current_database()))`).Scan(&waiting))
	return waiting
}

// Two relay processes share one store: on one, a member uploads a blob the
// community already has (another member's) and has written the sidecar
// but not yet its upload record; on the other, that other member deletes
// their upload. Under the blob lock the delete waits for the upload's
// record, sees it, and keeps the sidecar and the blob. Before, the lock
// covered neither the record nor the delete's listing: the delete saw no
// other member's record, removed the sidecar and the blob, and the upload
// answered 200 for a blob its community no longer served (and its member
// could no longer delete). Mutation killed: the upload releasing the blob
// lock before writing its record, or the delete listing the records
// before taking it (the second member's blob answers not found).
func TestDeleteOnOneProcessKeepsAnUploadRecordedOnAnother(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := dbtest.Pool(t)
	store := stores["fs"](t)
	processA := processSharingBlobLocks(t, store, pool)
	community := uuid.New()
	blob := "bytes two members upload"
	d, err := processA.Upload(ctx, community, "alice", strings.NewReader(blob), nil)
	require.NoError(t, err)

	paused := mediatest.NewPauseBeforePut(store, "_uploads/"+community.String()+"/")
	processB := processSharingBlobLocks(t, paused, pool)
	deleteWhileAnUploadIsPaused(t, pool, paused.Paused, paused.Resume, func() error {
		_, err := processB.Upload(ctx, community, "bob", strings.NewReader(blob), nil)
		return err
	}, func() error { return processA.Delete(ctx, community, d.SHA256, "alice") })

	_, obj, err := processB.Open(ctx, community, d.SHA256)
	require.NoError(t, err, "bob's upload is served")
	obj.Close()
	require.ErrorIs(t, processA.Delete(ctx, community, d.SHA256, "alice"), media.ErrNotUploader, "alice's record is gone")
	require.NoError(t, processB.Delete(ctx, community, d.SHA256, "bob"), "bob can delete his upload")
	require.Equal(t, media.SweepStats{Claimed: true, Looked: 1, Marked: 1, Removed: 1}, sweepAll(t, processB, pool))
	require.Empty(t, storeKeysOf(t, store))
}

// Two relay processes share one store: on one, a member's upload of a
// blob new to the community has written its upload record and not yet the
// sidecar; on the other, the same member deletes the blob (a client
// sending its delete while the upload is still answered). The delete finds
// a record without a sidecar, which it removes when an upload or a delete
// was cut short, but under the blob lock it waits for the upload, then
// removes the sidecar and the record both. Taken for what a cut-short
// upload left, the record went, the sidecar came after it, and the blob
// stayed served with no record that any member's delete could go by.
// Mutation killed: the delete's work done before it takes the blob lock
// (the sidecar stays, the blob served).
func TestDeleteOnOneProcessWaitsForAnUploadBetweenItsWritesOnAnother(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := dbtest.Pool(t)
	store := stores["fs"](t)
	processA := processSharingBlobLocks(t, store, pool)
	community := uuid.New()
	blob := "bytes uploaded through one relay, deleted through another"
	sum := sha256.Sum256([]byte(blob))
	sha := hex.EncodeToString(sum[:])

	paused := mediatest.NewPauseBeforePut(store, "_meta/"+community.String()+"/")
	processB := processSharingBlobLocks(t, paused, pool)
	deleteWhileAnUploadIsPaused(t, pool, paused.Paused, paused.Resume, func() error {
		_, err := processB.Upload(ctx, community, "alice", strings.NewReader(blob), nil)
		return err
	}, func() error { return processA.Delete(ctx, community, sha, "alice") })

	_, _, err := processA.Open(ctx, community, sha)
	require.ErrorIs(t, err, media.ErrNotFound, "the blob its uploader deleted is still served")
	for _, prefix := range media.CommunityPrefixes(community) {
		left, err := store.List(ctx, prefix)
		require.NoError(t, err)
		require.Empty(t, left, "what the delete left of the community's references")
	}
}

func storeKeysOf(t *testing.T, s media.Store) []string {
	t.Helper()
	keys, err := s.List(context.Background(), "")
	require.NoError(t, err)
	return keys
}

// Two relay processes share one store and one quota. The count of a
// community's bytes stays exact when, on one process, an upload has looked
// at the community's sidecar and the blob (written or looked at, before
// the blob lock)
// and, on the other, the same community gains the blob first ("two
// uploads") or loses its last reference ("an upload and a delete"). The
// upload decides under the blob lock whether its community's sidecar is
// new, so the blob counts once (each upload record counts too). Before, two uploads both counted the blob
// (a member could inflate the count to the quota, uploading one blob
// through two relays and deleting it, until the community could store
// nothing), and an upload racing a delete wrote the sidecar uncounted.
// Mutation killed: the decision taken from the sidecar read before the
// lock (the count is twice the blob's size, or zero).
func TestQuotaIsExactWhenUploadsRaceAcrossProcesses(t *testing.T) {
	t.Parallel()
	for name, deleteFirst := range map[string]bool{"two uploads": false, "an upload and a delete": true} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			pool := dbtest.Pool(t)
			store := stores["fs"](t)
			quota := &countingQuota{bytes: map[uuid.UUID]int64{}}
			processA := processSharingBlobLocks(t, store, pool)
			processA.UseQuota(quota)
			community := uuid.New()
			blob := "bytes uploaded through two relays"
			sum := sha256.Sum256([]byte(blob))
			if deleteFirst {
				_, err := processA.Upload(ctx, community, "alice", strings.NewReader(blob), nil)
				require.NoError(t, err)
			}

			paused := mediatest.NewPauseAfterStatOrPut(store, hex.EncodeToString(sum[:])+".txt", 1)
			processB := processSharingBlobLocks(t, paused, pool)
			processB.UseQuota(quota)
			uploaded := make(chan error, 1)
			go func() {
				_, err := processB.Upload(ctx, community, "bob", strings.NewReader(blob), nil)
				uploaded <- err
			}()
			select {
			case <-paused.Paused:
			case err := <-uploaded:
				t.Fatalf("the upload never looked at the blob (err %v)", err)
			}
			if deleteFirst {
				require.NoError(t, processA.Delete(ctx, community, hex.EncodeToString(sum[:]), "alice"))
			} else {
				_, err := processA.Upload(ctx, community, "alice", strings.NewReader(blob), nil)
				require.NoError(t, err)
			}
			close(paused.Resume)
			require.NoError(t, <-uploaded)

			_, obj, err := processB.Open(ctx, community, hex.EncodeToString(sum[:]))
			require.NoError(t, err, "bob's upload is served")
			obj.Close()
			records := 2 // alice's and bob's
			if deleteFirst {
				records = 1 // bob's
			}
			require.EqualValues(t, media.BlobCharge(int64(len(blob)))+int64(records)*media.ObjectCharge, quota.of(community), "the community stores the blob once, and each upload record")
		})
	}
}
