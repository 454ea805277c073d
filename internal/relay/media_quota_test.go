package relay_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/buzzrelay/buzz/internal/config"
	"github.com/buzzrelay/buzz/internal/db"
	"github.com/buzzrelay/buzz/internal/dberr"
	"github.com/buzzrelay/buzz/internal/dbtest"
	"github.com/buzzrelay/buzz/internal/deletion"
	"github.com/buzzrelay/buzz/internal/media"
	"github.com/buzzrelay/buzz/internal/relay"
	"github.com/buzzrelay/buzz/internal/relaytest"
)

// quotaOn is the relay's quota on pool, outside any serving-write lease.
func quotaOn(pool *pgxpool.Pool, limit int64) media.CommunityQuota {
	return media.CommunityQuota{Limit: limit, Run: func(ctx context.Context, fn func(*db.Queries) error) error {
		return deletion.UnderLease(ctx, pool, fn)
	}}
}

// uploadCharge is what one upload of blob, new in its community, counts
// against the community's quota: the blob, its sidecar, its upload record.
func uploadCharge(blob []byte) int64 {
	return media.BlobCharge(int64(len(blob))) + media.ObjectCharge
}

func mediaUsage(t *testing.T, q *db.Queries, community uuid.UUID) int64 {
	t.Helper()
	used, err := q.MediaUsageGet(context.Background(), community)
	require.NoError(t, err)
	return used
}

// A community's media is bounded in bytes, not only per upload: a blob
// counts once per community however many members upload it (each upload
// record counts ObjectCharge), an upload past the quota is refused with 507
// and leaves nothing, another community has its own quota, and deleting
// the community's last reference to a blob makes room again (a member's
// delete of a blob another member also uploaded gives back only that
// member's record). Mutations killed: no reservation (the third blob is
// stored); the blob charged at every upload (the second member's upload of
// the same blob fills the quota early); no release on delete (the refused
// blob is still refused after the delete).
func TestMediaCommunityQuota(t *testing.T) {
	t.Parallel()
	blobCharge, recordCharge := media.BlobCharge(800), int64(media.ObjectCharge)
	svc := media.NewService(mediaStores["fs"](t), media.Limits{MaxBytes: testMediaMaxBytes, AllowedTypes: config.DefaultMediaTypes, TempDir: t.TempDir()}, nil)
	r := relaytest.StartWith(t, dbtest.Pool(t), []relay.Option{relay.WithMedia(svc)}, func(c *config.Config) { c.MediaCommunityQuotaBytes = 36000 })
	q := db.New(r.Pool)
	alice, bob := relaytest.NewKey(t), relaytest.NewKey(t)
	first, second, third := pngBlob(t, 800), pngBlob(t, 800), pngBlob(t, 800)

	require.Equal(t, http.StatusOK, upload(t, r, "", alice, first).Status)
	require.Equal(t, http.StatusOK, upload(t, r, "", bob, first).Status, "the same blob again")
	require.Equal(t, http.StatusOK, upload(t, r, "", bob, second).Status)
	require.Equal(t, 2*blobCharge+3*recordCharge, mediaUsage(t, q, r.CommunityID))

	full := upload(t, r, "", alice, third)
	require.Equal(t, http.StatusInsufficientStorage, full.Status, "%s", full.Body)
	require.Equal(t, "blocked: the community's media storage is full: it stores 28672 of its 36000 bytes and this upload counts 12288; delete blobs to make room", full.Error)
	require.Equal(t, full.Error, full.Header.Get("X-Reason"))
	require.Equal(t, http.StatusNotFound, mediaDo(t, r, http.MethodGet, "", "/media/"+hexSHA(third), "", nil, nil).Status)

	otherHost := "quota-other.example"
	other := r.AddCommunity(t, otherHost)
	require.Equal(t, http.StatusOK, upload(t, r, otherHost, alice, third).Status, "another community has its own quota")
	require.Equal(t, blobCharge+recordCharge, mediaUsage(t, q, other))

	// Bob's delete of the blob Alice uploaded too keeps it, and its bytes.
	del := mediaDo(t, r, http.MethodDelete, "", "/media/"+hexSHA(first), blossomAuth(t, bob, "delete", []string{hexSHA(first)}, nil), nil, nil)
	require.Equal(t, http.StatusOK, del.Status, "%s", del.Body)
	require.Equal(t, 2*blobCharge+2*recordCharge, mediaUsage(t, q, r.CommunityID))
	require.Equal(t, http.StatusInsufficientStorage, upload(t, r, "", alice, third).Status)
	// Alice's delete removes the community's last reference.
	del = mediaDo(t, r, http.MethodDelete, "", "/media/"+hexSHA(first), blossomAuth(t, alice, "delete", []string{hexSHA(first)}, nil), nil, nil)
	require.Equal(t, http.StatusOK, del.Status, "%s", del.Body)
	require.Equal(t, blobCharge+recordCharge, mediaUsage(t, q, r.CommunityID))
	require.Equal(t, http.StatusOK, upload(t, r, "", alice, third).Status)
	require.Equal(t, 2*blobCharge+2*recordCharge, mediaUsage(t, q, r.CommunityID))
}

// Uploads racing for the last of a quota, as on several relay processes
// sharing one database (one service each), store exactly what fits. The
// services share the store but not their in-process hash locks. Mutation
// killed: the reservation's quota condition dropped (every upload is
// stored).
func TestMediaCommunityQuotaUnderParallelUploads(t *testing.T) {
	t.Parallel()
	const blobSize, fits, uploads = 1000, 5, 12
	pool := dbtest.Pool(t)
	row, err := db.New(pool).CommunityCreate(context.Background(), "quota-race-"+uuid.NewString()[:8]+".example")
	require.NoError(t, err)
	store := mediaStores["fs"](t)
	charge := media.BlobCharge(blobSize) + media.ObjectCharge // the blob, its sidecar, its record
	quota := quotaOn(pool, fits*charge)
	var stored, refused int
	var mu sync.Mutex
	var wg sync.WaitGroup
	for range uploads {
		wg.Go(func() {
			svc := media.NewService(store, media.Limits{MaxBytes: testMediaMaxBytes, AllowedTypes: config.DefaultMediaTypes, TempDir: t.TempDir()}, nil)
			svc.UseQuota(quota)
			_, err := svc.Upload(context.Background(), row.ID, "uploader", bytes.NewReader(pngBlob(t, blobSize)), nil)
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err == nil:
				stored++
			case errors.Is(err, media.ErrQuotaExceeded):
				refused++
			default:
				t.Errorf("upload: %v", err)
			}
		})
	}
	wg.Wait()
	require.Equal(t, fits, stored)
	require.Equal(t, uploads-fits, refused)
	require.Equal(t, fits*charge, mediaUsage(t, db.New(pool), row.ID))
}

// An upload admitted before its community's deletion began, reserving
// after the deletion quiesced the community, is refused by the fence on
// media_usage as a fenced write (410), not as a store failure (500).
// Mutation killed: Reserve returning the database error uninterpreted.
func TestMediaQuotaReservationIsFencedByTheDeletion(t *testing.T) {
	t.Parallel()
	pool := dbtest.Pool(t)
	host := "quota-fenced-" + uuid.NewString()[:8] + ".example"
	row, err := db.New(pool).CommunityCreate(context.Background(), host)
	require.NoError(t, err)
	quiesceCommunity(t, pool, host)
	quota := quotaOn(pool, 1<<20)
	err = quota.Reserve(context.Background(), row.ID, 100)
	require.ErrorIs(t, err, dberr.ErrCommunityWriteFenced)
}

// blockUploadRecords puts a file where community's upload records go in
// the filesystem store at dir, so an upload's record write fails once its
// blob is written; unblock removes it.
func blockUploadRecords(t *testing.T, dir string, community uuid.UUID) (unblock func()) {
	t.Helper()
	obstacle := filepath.Join(dir, "_uploads", community.String())
	require.NoError(t, os.MkdirAll(filepath.Dir(obstacle), 0o750))
	require.NoError(t, os.WriteFile(obstacle, nil, 0o600))
	return func() { require.NoError(t, os.Remove(obstacle)) }
}

// An upload whose upload record the store refuses (a full disk, say, here
// a file standing where the community's upload records go) leaves no
// sidecar: the blob is not served to a community whose upload was
// answered 500, and once it is uploaded again it counts against the
// quota. Before, the sidecar (then written first) stayed while the
// reservation was given back, so the blob was served, counted nowhere,
// and every later upload of it was free. Mutation killed: the sidecar
// written although the upload record failed (GET answered 200, and the
// quota stayed at 0 after the successful upload).
func TestMediaUploadFailingAfterItsSidecarLeavesNone(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	store, err := media.NewFSStore(dir)
	require.NoError(t, err)
	r := mediaRelay(t, store)
	q := db.New(r.Pool)
	alice := relaytest.NewKey(t)
	blob := pngBlob(t, 1000)

	unblock := blockUploadRecords(t, dir, r.CommunityID)
	failed := upload(t, r, "", alice, blob)
	require.Equal(t, http.StatusInternalServerError, failed.Status, "%s", failed.Body)
	require.Equal(t, http.StatusNotFound, mediaDo(t, r, http.MethodGet, "", "/media/"+hexSHA(blob), "", nil, nil).Status,
		"the blob of a failed upload is served")
	require.Zero(t, mediaUsage(t, q, r.CommunityID))

	unblock()
	require.Equal(t, http.StatusOK, upload(t, r, "", alice, blob).Status)
	require.Equal(t, uploadCharge(blob), mediaUsage(t, q, r.CommunityID))
	require.Equal(t, http.StatusOK, mediaDo(t, r, http.MethodGet, "", "/media/"+hexSHA(blob), "", nil, nil).Status)
}

// An upload whose spool file cannot be made (here its directory is gone)
// blames the relay, not the media store or the client, and stores nothing.
// Mutation killed: the spool failure left to the
// generic answer ("could not reach the media store").
func TestMediaUploadSpoolFailureBlamesTheRelay(t *testing.T) {
	t.Parallel()
	spool := filepath.Join(t.TempDir(), "spool")
	require.NoError(t, os.Mkdir(spool, 0o700))
	svc := media.NewService(mediaStores["fs"](t), media.Limits{MaxBytes: testMediaMaxBytes, AllowedTypes: config.DefaultMediaTypes, TempDir: spool}, nil)
	r := relaytest.StartWith(t, dbtest.Pool(t), []relay.Option{relay.WithMedia(svc)}, func(c *config.Config) { c.MediaCommunityQuotaBytes = 20000 })
	alice := relaytest.NewKey(t)
	blob := pngBlob(t, 800)
	require.NoError(t, os.Remove(spool))

	failed := upload(t, r, "", alice, blob)
	require.Equal(t, http.StatusInternalServerError, failed.Status, "%s", failed.Body)
	require.Equal(t, "error: the relay could not spool the upload; try again later", failed.Error)
	require.Equal(t, http.StatusNotFound, mediaDo(t, r, http.MethodGet, "", "/media/"+hexSHA(blob), "", nil, nil).Status)

	require.NoError(t, os.Mkdir(spool, 0o700))
	require.Equal(t, http.StatusOK, upload(t, r, "", alice, blob).Status, "the same upload once the spool is back")
	require.Equal(t, uploadCharge(blob), mediaUsage(t, db.New(r.Pool), r.CommunityID))
}

// The media doc's correction of an over-counted community, run as written
// under psql after an upload made since the operator read the count: the
// over-count goes, the later upload's bytes stay. Setting the total the
// operator computed instead would drop them, and the community could store
// that much more than its quota.
func TestMediaUsageCorrectionByTheMediaDoc(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	svc := media.NewService(mediaStores["fs"](t), media.Limits{MaxBytes: testMediaMaxBytes, AllowedTypes: config.DefaultMediaTypes, TempDir: t.TempDir()}, nil)
	r := relaytest.StartWith(t, dbtest.Pool(t), []relay.Option{relay.WithMedia(svc)}, func(c *config.Config) { c.MediaCommunityQuotaBytes = 1 << 20 })
	q := db.New(r.Pool)
	alice, bob := relaytest.NewKey(t), relaytest.NewKey(t)
	first, later := pngBlob(t, 800), pngBlob(t, 900)
	require.Equal(t, http.StatusOK, upload(t, r, "", alice, first).Status)
	// A release that was lost leaves the count high.
	const over = 5000
	_, err := r.Pool.Exec(ctx, `UPDATE media_usage SET bytes = bytes + $2 WHERE community_id = $1`, r.CommunityID, over)
	require.NoError(t, err)
	counted, stored := mediaUsage(t, q, r.CommunityID), uploadCharge(first)
	require.Equal(t, stored+over, counted, "what the operator reads, and what the store holds")

	require.Equal(t, http.StatusOK, upload(t, r, "", bob, later).Status, "an upload after the reading")

	correction := dbtest.SQLBlock(t, "../../docs/media.md", "-- Lower a community's media usage by what it over-counts.")
	cmd := exec.Command(dbtest.PsqlPath(t), "-X", "-v", "ON_ERROR_STOP=1", "-v", "host="+r.Host,
		"-v", fmt.Sprintf("over=%d", counted-stored), "-v", fmt.Sprintf("total=%d", stored),
		"-f", "-", dbtest.PsqlURL(t, r.Pool.Config().ConnString()))
	cmd.Stdin = strings.NewReader(correction)
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "%s", out)
	require.Contains(t, string(out), "(1 row)")
	require.Equal(t, uploadCharge(first)+uploadCharge(later), mediaUsage(t, q, r.CommunityID),
		"the over-count gone, the later upload still counted\n%s", out)
}
