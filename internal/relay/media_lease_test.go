package relay_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/buzzrelay/buzz/internal/config"
	"github.com/buzzrelay/buzz/internal/db"
	"github.com/buzzrelay/buzz/internal/dberr"
	"github.com/buzzrelay/buzz/internal/dbtest"
	"github.com/buzzrelay/buzz/internal/media"
	"github.com/buzzrelay/buzz/internal/nostr"
	"github.com/buzzrelay/buzz/internal/relay"
	"github.com/buzzrelay/buzz/internal/relaytest"
)

// holdBlobLock takes sha's blob lock (media.AdvisoryBlobLock's keys) on a
// connection of pool, so an upload of sha stops right before its locked
// window; the returned func gives it back.
func holdBlobLock(t *testing.T, pool *pgxpool.Pool, sha string) (release func()) {
	t.Helper()
	conn, err := pool.Acquire(context.Background())
	require.NoError(t, err)
	prefix, err := hex.DecodeString(sha[:8])
	require.NoError(t, err)
	_, err = conn.Exec(context.Background(), `SELECT pg_advisory_lock($1::int, $2::int)`, int32(0x626c6f62), int32(binary.BigEndian.Uint32(prefix)))
	require.NoError(t, err)
	released := false
	release = func() {
		if !released {
			released = true
			_, err := conn.Exec(context.Background(), `SELECT pg_advisory_unlock_all()`)
			require.NoError(t, err)
			conn.Release()
		}
	}
	t.Cleanup(release)
	return release
}

// advisoryWaiters counts sessions waiting for an advisory lock in pool's
// database, and blobLocksHeld the blob locks held there.
func advisoryWaiters(t *testing.T, pool *pgxpool.Pool) (waiting, blobLocksHeld int) {
	t.Helper()
	require.NoError(t, pool.QueryRow(context.Background(), `
		SELECT count(*) FILTER (WHERE NOT granted),
		       count(*) FILTER (WHERE granted AND classid = $1::int::oid AND objsubid = 2)
		FROM pg_locks WHERE locktype = 'advisory'
		  AND database = (SELECT oid FROM pg_database WHERE datname = current_database())`, int32(0x626c6f62)).Scan(&waiting, &blobLocksHeld))
	return waiting, blobLocksHeld
}

// lockWaiters counts statements named name waiting for a lock in pool's
// database.
func lockWaiters(t *testing.T, pool *pgxpool.Pool, name string) int {
	t.Helper()
	var n int
	require.NoError(t, pool.QueryRow(context.Background(), `
		SELECT count(*) FROM pg_stat_activity
		WHERE datname = current_database() AND wait_event_type = 'Lock' AND query LIKE '-- name: ' || $1 || '%'`, name).Scan(&n))
	return n
}

// uploadAtTheBlobLock starts an upload of blob to r's home community and
// returns once it waits for the blob lock the test holds: its body is
// hashed, its bytes reserved, its blob written, its record and sidecar not
// yet. unlock lets it go on.
func uploadAtTheBlobLock(t *testing.T, r *relaytest.Relay, blob []byte) (unlock func(), reply <-chan mediaReply) {
	t.Helper()
	unlock = holdBlobLock(t, r.Pool, hexSHA(blob))
	replies := make(chan mediaReply, 1)
	go func() { replies <- upload(t, r, "", relaytest.NewKey(t), blob) }()
	waitFor(t, func() bool { waiting, _ := advisoryWaiters(t, r.Pool); return waiting == 1 })
	require.Equal(t, uploadCharge(blob), mediaUsage(t, db.New(r.Pool), r.CommunityID), "reserved before the blob lock")
	return unlock, replies
}

// requireNothingLeft requires that the refused upload of blob left nothing:
// not served, no object in store, nothing counted, no serving-write lease
// and no blob lock held.
func requireNothingLeft(t *testing.T, r *relaytest.Relay, store media.Store, blob []byte) {
	t.Helper()
	requireNothingStored(t, r, store, blob)
	waitFor(t, func() bool {
		var leases int
		require.NoError(t, r.Pool.QueryRow(context.Background(), `SELECT count(*) FROM community_serving_write_leases`).Scan(&leases))
		return leases == 0
	})
}

// requireNothingStored is requireNothingLeft but for the lease.
func requireNothingStored(t *testing.T, r *relaytest.Relay, store media.Store, blob []byte) {
	t.Helper()
	require.Equal(t, http.StatusNotFound, mediaDo(t, r, http.MethodGet, "", "/media/"+hexSHA(blob), "", nil, nil).Status, "the refused upload's blob is served")
	require.Empty(t, storeKeys(t, store), "the refused upload left objects in the store")
	var counted int64
	require.NoError(t, r.Pool.QueryRow(context.Background(), `SELECT coalesce(sum(bytes), 0) FROM media_usage WHERE community_id = $1`, r.CommunityID).Scan(&counted))
	require.Zero(t, counted, "the refused upload's bytes are still counted")
	waitFor(t, func() bool { _, held := advisoryWaiters(t, r.Pool); return held == 0 })
}

// An upload whose serving-write lease lapsed while its renewal could not
// get through (here a transaction holds the lease's row, and moves its
// expiry into the past, as a minute of stalled renewals would) is refused
// before it makes its blob visible: the deletion's fence passes a lapsed
// lease and lists the community's objects, so a sidecar written after it
// would be left behind, served and counted by nothing. It is answered 503
// with JSON, and leaves no object, no count, no lease and no blob lock.
// Before, the upload, holding the blob lock, went on writing its upload
// record and sidecar and answered 200. Mutations killed: no
// lease confirmation before the record and sidecar (200, the blob served);
// the reservation given back only under the lapsed lease (its guard
// refuses: the bytes stay counted).
func TestMediaUploadWhoseLeaseLapsedStoresNothing(t *testing.T) {
	t.Parallel()
	store := mediaStores["fs"](t)
	r := mediaRelay(t, store)
	ctx := context.Background()
	blob := pngBlob(t, 4096)
	unlock, replies := uploadAtTheBlobLock(t, r, blob)

	lapse, err := r.Pool.Begin(ctx)
	require.NoError(t, err)
	defer lapse.Rollback(ctx) //nolint:errcheck
	_, err = lapse.Exec(ctx, `UPDATE community_serving_write_leases SET lease_until = now() - interval '1 second' WHERE community_id = $1`, r.CommunityID)
	require.NoError(t, err)
	unlock()
	// The upload's renewal waits for the lease's row, or (before the fix)
	// the upload, done without asking, waits to release its lease.
	waitFor(t, func() bool { return lockWaiters(t, r.Pool, "ServingLease") > 0 })
	require.NoError(t, lapse.Commit(ctx))

	reply := <-replies
	require.Equal(t, http.StatusServiceUnavailable, reply.Status, "%s", reply.Body)
	require.Equal(t, "error: the relay's serving-write lease on this community lapsed before the request was done; try again", reply.Error)
	require.Equal(t, reply.Error, reply.Header.Get("X-Reason"))
	requireNothingLeft(t, r, store, blob)
}

// An upload whose lease renewal does not get through at all (a
// transaction holds the lease's row and never lets go) is refused once the
// renewal has waited 10 s: it holds the blob lock meanwhile, a lease it
// cannot renew may expire under it, and its client's answer must go before
// the HTTP write timeout (30 s). It stores
// nothing, and once the row is let go nothing is left. Mutations killed:
// the confirmation's renewal unbounded, or the lease's deletion unbounded
// (either waits for the row for good: no answer while the row is held).
func TestMediaUploadWhoseLeaseRenewalHangsStoresNothing(t *testing.T) {
	t.Parallel()
	store := mediaStores["fs"](t)
	r := mediaRelay(t, store)
	ctx := context.Background()
	blob := pngBlob(t, 4096)
	unlock, replies := uploadAtTheBlobLock(t, r, blob)

	holder, err := r.Pool.Begin(ctx)
	require.NoError(t, err)
	defer holder.Rollback(ctx) //nolint:errcheck
	_, err = holder.Exec(ctx, `SELECT FROM community_serving_write_leases WHERE community_id = $1 FOR UPDATE`, r.CommunityID)
	require.NoError(t, err)
	unlock()
	waitFor(t, func() bool { return lockWaiters(t, r.Pool, "ServingLeaseRenew") > 0 })
	var reply mediaReply
	select {
	case reply = <-replies:
	case <-time.After(2 * time.Minute):
		t.Fatal("the upload is still waiting for its lease's row")
	}
	require.Equal(t, http.StatusServiceUnavailable, reply.Status, "%s", reply.Body)
	require.Equal(t, "error: the relay's serving-write lease on this community lapsed before the request was done; try again", reply.Error)
	require.NoError(t, holder.Rollback(ctx))
	// The lease, whose deletion the held row stopped too (for at most 5 s,
	// then the answer went), expires on its own.
	requireNothingStored(t, r, store, blob)
}

// A NIP-98 upload refused 503 after its auth event was claimed (here its
// serving-write lease lapsed before it made its blob visible) stored
// nothing and gives the claim back: the same request, same header, sent
// again is stored; sent once more, after it succeeded, it is a replay.
// Mutations killed: the claim kept (the retry is 401); the claim released
// whatever the outcome (the replay of the stored upload is stored again).
func TestMediaUploadRefusedForTheRelayMayBeSentAgain(t *testing.T) {
	t.Parallel()
	store := mediaStores["fs"](t)
	r := mediaRelay(t, store)
	ctx := context.Background()
	blob := pngBlob(t, 4096)
	auth := authHeader(nip98(t, relaytest.NewKey(t), http.MethodPut, r.HTTPURL+"/media/upload", blob, nil))
	send := func() mediaReply {
		return mediaDo(t, r, http.MethodPut, "", "/media/upload", auth, bytes.NewReader(blob), nil)
	}

	unlock := holdBlobLock(t, r.Pool, hexSHA(blob))
	replies := make(chan mediaReply, 1)
	go func() { replies <- send() }()
	waitFor(t, func() bool { waiting, _ := advisoryWaiters(t, r.Pool); return waiting == 1 }) // claimed by then
	lapse, err := r.Pool.Begin(ctx)
	require.NoError(t, err)
	defer lapse.Rollback(ctx) //nolint:errcheck
	_, err = lapse.Exec(ctx, `UPDATE community_serving_write_leases SET lease_until = now() - interval '1 second' WHERE community_id = $1`, r.CommunityID)
	require.NoError(t, err)
	unlock()
	waitFor(t, func() bool { return lockWaiters(t, r.Pool, "ServingLease") > 0 })
	require.NoError(t, lapse.Commit(ctx))
	reply := <-replies
	require.Equal(t, http.StatusServiceUnavailable, reply.Status, "%s", reply.Body)
	requireNothingStored(t, r, store, blob)

	again := send()
	require.Equal(t, http.StatusOK, again.Status, "%s", again.Body)
	require.Equal(t, uploadCharge(blob), mediaUsage(t, db.New(r.Pool), r.CommunityID))
	replay := send()
	require.Equal(t, http.StatusUnauthorized, replay.Status, "%s", replay.Body)
	require.Equal(t, "auth-required: "+authEventUsed, replay.Error)
}

// removalsFail is a store whose removals of keys under prefix fail while
// failing is set, as a store with a passing error would.
type removalsFail struct {
	media.Store
	prefix  string
	failing atomic.Bool
}

func (s *removalsFail) Delete(ctx context.Context, key string) error {
	if s.failing.Load() && strings.HasPrefix(key, s.prefix) {
		return errors.New("store unavailable")
	}
	return s.Store.Delete(ctx, key)
}

// uploadDelete is a blob uploaded by key to relay, at path, and send, one
// NIP-98 delete of it: the same header each time it is sent.
type uploadDelete struct {
	relay *relaytest.Relay
	store *removalsFail
	key   *nostr.SecretKey
	path  string
	send  func() mediaReply
}

// deleteOfAnUploadWhoseRemovalsFailUnder starts a relay on a store whose
// removals under prefix fail while its failing is set, uploads a blob to it
// and signs one delete of that blob.
func deleteOfAnUploadWhoseRemovalsFailUnder(t *testing.T, prefix string) uploadDelete {
	t.Helper()
	store := &removalsFail{Store: mediaStores["fs"](t), prefix: prefix}
	svc := media.NewService(store, media.Limits{MaxBytes: testMediaMaxBytes, AllowedTypes: config.DefaultMediaTypes, TempDir: t.TempDir()}, nil)
	r := relaytest.StartWith(t, dbtest.Pool(t), []relay.Option{relay.WithMedia(svc)})
	key := relaytest.NewKey(t)
	blob := pngBlob(t, 4096)
	require.Equal(t, http.StatusOK, upload(t, r, "", key, blob).Status)
	path := "/media/" + hexSHA(blob)
	auth := authHeader(nip98(t, key, http.MethodDelete, r.HTTPURL+path, nil, withoutPayload))
	return uploadDelete{relay: r, store: store, key: key, path: path,
		send: func() mediaReply { return mediaDo(t, r, http.MethodDelete, "", path, auth, nil, nil) }}
}

// A NIP-98 delete that failed for the relay's reason before removing
// anything (here the store refused its first removal, the sidecar's) gives
// its claim back, as an upload does: the client sends the same request,
// header and all, again, and it deletes the blob; sent a third time it is
// a replay. Mutation killed: only a delete refused as busy giving its
// claim back (the second send is refused 401 as a replay, and the blob
// stays until the member signs anew).
func TestMediaDeleteRefusedForTheRelayMayBeSentAgain(t *testing.T) {
	t.Parallel()
	d := deleteOfAnUploadWhoseRemovalsFailUnder(t, "_meta/")
	r, store, path, send := d.relay, d.store, d.path, d.send

	store.failing.Store(true)
	failed := send()
	require.Equal(t, http.StatusInternalServerError, failed.Status, "%s", failed.Body)
	store.failing.Store(false)
	again := send()
	require.Equal(t, http.StatusOK, again.Status, "%s", again.Body)
	require.Equal(t, http.StatusNotFound, mediaDo(t, r, http.MethodGet, "", path, "", nil, nil).Status, "the deleted blob is not served")
	replay := send()
	require.Equal(t, http.StatusUnauthorized, replay.Status, "%s", replay.Body)
	require.Equal(t, "auth-required: "+authEventUsed, replay.Error)
}

// A NIP-98 delete that failed after it removed something (the sidecar
// went, the store refused the member's upload record) keeps its claim:
// the same header sent again, once the store works, is a replay. Only a
// delete that removed nothing gives its claim back
// (TestMediaDeleteRefusedForTheRelayMayBeSentAgain); given back here, the
// header would act a second time, on whatever the community holds by then.
// A delete signed anew then removes the record the first one left without
// a sidecar, and the community's count (media_usage) comes back to zero:
// the sidecar's charge went with the sidecar, the record's with the record.
// Mutations killed: the claim given back whether or not the delete removed
// anything (media.DeletedNothing ignored: the second send is 200); records
// without a sidecar not removed by a delete (the new delete is 404, and
// the record stays counted).
func TestMediaDeleteFailingAfterItRemovedKeepsItsClaim(t *testing.T) {
	t.Parallel()
	d := deleteOfAnUploadWhoseRemovalsFailUnder(t, "_uploads/")
	r, store, key, path, send := d.relay, d.store, d.key, d.path, d.send

	store.failing.Store(true)
	failed := send()
	require.Equal(t, http.StatusInternalServerError, failed.Status, "%s", failed.Body)
	require.Equal(t, http.StatusNotFound, mediaDo(t, r, http.MethodGet, "", path, "", nil, nil).Status, "the sidecar went before the record's removal failed")
	require.EqualValues(t, media.ObjectCharge, mediaUsage(t, db.New(r.Pool), r.CommunityID), "the record left stays counted")
	store.failing.Store(false)
	again := send()
	require.Equal(t, http.StatusUnauthorized, again.Status, "%s", again.Body)
	require.Equal(t, "auth-required: "+authEventUsed, again.Error)

	anew := mediaDo(t, r, http.MethodDelete, "", path, authHeader(nip98(t, key, http.MethodDelete, r.HTTPURL+path, nil, withoutPayload)), nil, nil)
	require.Equal(t, http.StatusOK, anew.Status, "%s", anew.Body)
	require.Zero(t, mediaUsage(t, db.New(r.Pool), r.CommunityID))
	for _, prefix := range media.CommunityPrefixes(r.CommunityID) {
		left, err := store.List(context.Background(), prefix)
		require.NoError(t, err)
		require.Empty(t, left, "the community's sidecar and records")
	}
}

// A NIP-98 upload refused for its community's reason (the quota is full)
// keeps its claim: the same header sent again is a replay, as before.
// Mutation killed: the claim given back whatever the reason (the retry is
// refused 507 again instead of 401).
func TestMediaUploadRefusedForTheQuotaKeepsItsClaim(t *testing.T) {
	t.Parallel()
	svc := media.NewService(mediaStores["fs"](t), media.Limits{MaxBytes: testMediaMaxBytes, AllowedTypes: config.DefaultMediaTypes, TempDir: t.TempDir()}, nil)
	r := relaytest.StartWith(t, dbtest.Pool(t), []relay.Option{relay.WithMedia(svc)}, func(c *config.Config) { c.MediaCommunityQuotaBytes = 2000 })
	blob := pngBlob(t, 4096)
	auth := authHeader(nip98(t, relaytest.NewKey(t), http.MethodPut, r.HTTPURL+"/media/upload", blob, nil))
	full := mediaDo(t, r, http.MethodPut, "", "/media/upload", auth, bytes.NewReader(blob), nil)
	require.Equal(t, http.StatusInsufficientStorage, full.Status, "%s", full.Body)
	replay := mediaDo(t, r, http.MethodPut, "", "/media/upload", auth, bytes.NewReader(blob), nil)
	require.Equal(t, http.StatusUnauthorized, replay.Status, "%s", replay.Body)
}

// A NIP-98 upload gives a claim back only if it made it: a replay of a
// header an earlier upload used (and claimed) that fails for the relay's
// reason before its own claim (here its spool file cannot be made) stored
// nothing, but the claim is the earlier upload's, and the header stays
// used: sent once more, once the spool is back, it is a replay.
// Mutation killed: the claim given back whether or not this request made
// it (the third send is stored: 200, not 401).
func TestMediaUploadReplayFailingForTheRelayKeepsTheEarlierClaim(t *testing.T) {
	t.Parallel()
	spool := filepath.Join(t.TempDir(), "spool")
	require.NoError(t, os.Mkdir(spool, 0o700))
	svc := media.NewService(mediaStores["fs"](t), media.Limits{MaxBytes: testMediaMaxBytes, AllowedTypes: config.DefaultMediaTypes, TempDir: spool}, nil)
	r := relaytest.StartWith(t, dbtest.Pool(t), []relay.Option{relay.WithMedia(svc)})
	blob := pngBlob(t, 4096)
	auth := authHeader(nip98(t, relaytest.NewKey(t), http.MethodPut, r.HTTPURL+"/media/upload", blob, nil))
	send := func() mediaReply {
		return mediaDo(t, r, http.MethodPut, "", "/media/upload", auth, bytes.NewReader(blob), nil)
	}
	first := send()
	require.Equal(t, http.StatusOK, first.Status, "%s", first.Body)

	require.NoError(t, os.Remove(spool))
	replay := send()
	require.Equal(t, http.StatusInternalServerError, replay.Status, "%s", replay.Body)
	require.Equal(t, "error: the relay could not spool the upload; try again later", replay.Error)
	require.NoError(t, os.Mkdir(spool, 0o700))

	again := send()
	require.Equal(t, http.StatusUnauthorized, again.Status, "%s", again.Body)
	require.Equal(t, "auth-required: "+authEventUsed, again.Error)
}

// A NIP-98 upload that failed for the relay's reason after it began to
// store (its upload record's write failed: the record or the sidecar may
// remain) keeps its claim: the same header sent again, once the store
// works, is a replay. Only an upload that stored nothing gives its claim
// back (TestMediaUploadRefusedForTheRelayMayBeSentAgain).
// Mutation killed: the claim given back whether or not the upload stored
// anything (media.StoredNothing ignored: the second send is stored, 200).
func TestMediaUploadFailingAfterItStoredKeepsItsClaim(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	store, err := media.NewFSStore(dir)
	require.NoError(t, err)
	r := mediaRelay(t, store)
	blob := pngBlob(t, 4096)
	auth := authHeader(nip98(t, relaytest.NewKey(t), http.MethodPut, r.HTTPURL+"/media/upload", blob, nil))
	send := func() mediaReply {
		return mediaDo(t, r, http.MethodPut, "", "/media/upload", auth, bytes.NewReader(blob), nil)
	}
	// A file where the community's upload records go: the record's write
	// fails once the blob is written.
	unblock := blockUploadRecords(t, dir, r.CommunityID)
	failed := send()
	require.Equal(t, http.StatusInternalServerError, failed.Status, "%s", failed.Body)
	unblock()

	again := send()
	require.Equal(t, http.StatusUnauthorized, again.Status, "%s", again.Body)
	require.Equal(t, "auth-required: "+authEventUsed, again.Error)
}

// A failed quota release is retried after the answer, not before it: the
// upload's 500 comes while the release still cannot get through (a
// transaction holds the community's media_usage row), and the count is
// whole once it can. Shutdown makes a retry waiting out its backoff try at
// once and waits for it, so the count is whole when Shutdown returns.
// Mutations killed: a single attempt (the bytes stay counted, 4096); the
// retries run inside the request (the answer comes after all four attempts
// failed, the count stays high and one is counted lost); Shutdown that does
// not wait for the retries.
func TestMediaQuotaReleaseRetriesFollowTheAnswer(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	store, err := media.NewFSStore(dir)
	require.NoError(t, err)
	r := mediaRelay(t, store)
	ctx := context.Background()
	blob := pngBlob(t, 4096)
	failures := r.Server.Metrics().MediaQuotaReleaseFailures
	unlock, replies := uploadAtTheBlobLock(t, r, blob)

	// The upload record's write fails, so the upload gives its reservation
	// back; the release waits for the row lock until its attempt times out.
	unblock := blockUploadRecords(t, dir, r.CommunityID)
	holder, err := r.Pool.Begin(ctx)
	require.NoError(t, err)
	defer holder.Rollback(ctx) //nolint:errcheck
	_, err = holder.Exec(ctx, `SELECT FROM media_usage WHERE community_id = $1 FOR UPDATE`, r.CommunityID)
	require.NoError(t, err)
	unlock()
	var reply mediaReply
	select {
	case reply = <-replies:
	case <-time.After(relaytest.Patience):
		t.Fatal("the upload was not answered")
	}
	require.Equal(t, http.StatusInternalServerError, reply.Status, "%s", reply.Body)
	require.Equal(t, uploadCharge(blob), mediaUsage(t, db.New(r.Pool), r.CommunityID), "answered before its bytes could be given back")
	require.Zero(t, testutil.ToFloat64(failures.WithLabelValues("lost")), "the answer waited for every retry")
	require.NoError(t, holder.Rollback(ctx))

	shutdownCtx, cancel := context.WithTimeout(ctx, relaytest.Patience)
	defer cancel()
	require.NoError(t, r.Shutdown(shutdownCtx))
	require.Zero(t, mediaUsage(t, db.New(r.Pool), r.CommunityID), "the retry did not give the bytes back by the end of Shutdown")
	require.Equal(t, 1.0, testutil.ToFloat64(failures.WithLabelValues("retried")))
	require.Zero(t, testutil.ToFloat64(failures.WithLabelValues("lost")))
	unblock()
	requireNothingLeft(t, r, store, blob)
}

// A quota release still being retried when Shutdown's time runs out is
// abandoned, and counted so (outcome "abandoned"), once: not lost (its
// attempts did not all fail), not silently dropped. Here the retry's
// attempt waits for the community's media_usage row, which a transaction
// holds, when Shutdown is called with a context already ended.
// Mutation killed: Shutdown returning on its context without counting the
// retries it leaves (abandoned 0).
func TestMediaQuotaReleaseAbandonedAtShutdownIsCounted(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	store, err := media.NewFSStore(dir)
	require.NoError(t, err)
	r := mediaRelay(t, store)
	ctx := context.Background()
	blob := pngBlob(t, 4096)
	failures := r.Server.Metrics().MediaQuotaReleaseFailures
	unlock, replies := uploadAtTheBlobLock(t, r, blob)
	unblock := blockUploadRecords(t, dir, r.CommunityID)
	holder, err := r.Pool.Begin(ctx)
	require.NoError(t, err)
	defer holder.Rollback(ctx) //nolint:errcheck
	_, err = holder.Exec(ctx, `SELECT FROM media_usage WHERE community_id = $1 FOR UPDATE`, r.CommunityID)
	require.NoError(t, err)
	unlock()
	reply := <-replies
	require.Equal(t, http.StatusInternalServerError, reply.Status, "%s", reply.Body)
	require.Equal(t, 1.0, testutil.ToFloat64(failures.WithLabelValues("retried")), "the first attempt failed; the retry runs in the background")

	out, cancel := context.WithCancel(ctx)
	cancel()
	require.ErrorIs(t, r.Shutdown(out), context.Canceled)
	require.Equal(t, 1.0, testutil.ToFloat64(failures.WithLabelValues("abandoned")))
	require.NoError(t, holder.Rollback(ctx))
	// Once the abandoned retry has ended, nothing more is counted.
	require.NoError(t, r.Shutdown(ctx))
	require.Equal(t, 1.0, testutil.ToFloat64(failures.WithLabelValues("abandoned")))
	require.Zero(t, testutil.ToFloat64(failures.WithLabelValues("lost")))
	require.Equal(t, uploadCharge(blob), mediaUsage(t, db.New(r.Pool), r.CommunityID), "an abandoned release leaves the count high")
	unblock()
}

// nip01Prefix is every machine-readable prefix NIP-01 defines.
var nip01Prefix = regexp.MustCompile(`^(invalid|auth-required|restricted|blocked|rate-limited|duplicate|pow|error): `)

func requireNIP01Prefix(t *testing.T, reason, why string) {
	t.Helper()
	require.Regexp(t, nip01Prefix, reason, why)
}

// A relay without media answers every media route 404 behind a NIP-01
// prefix, and a delete whose NIP-98 claim fails in the database (its
// connection lost once the server ran it) is 503 "error: database
// unavailable; try again", as every route answers a lost database,
// holding no lease afterwards; so is an upload's, which stores and counts
// nothing.
// Mutations killed: either reason without its prefix; the upload's claim
// failure left to the generic answer ("error: could not reach the media
// store").
func TestMediaAnswersCarryANIP01Prefix(t *testing.T) {
	t.Parallel()
	off := relaytest.Start(t)
	blob := pngBlob(t, 100)
	key := relaytest.NewKey(t)
	for _, method := range []string{http.MethodPut, http.MethodDelete} {
		path := "/media/upload"
		if method == http.MethodDelete {
			path = "/media/" + hexSHA(blob)
		}
		got := mediaDo(t, off, method, "", path, blossomAuth(t, key, map[string]string{http.MethodPut: "upload", http.MethodDelete: "delete"}[method], []string{hexSHA(blob)}, nil), bytes.NewReader(blob), nil)
		require.Equal(t, http.StatusNotFound, got.Status, method)
		require.Equal(t, "blocked: media is not enabled on this relay", got.Error, method)
	}

	var cut atomic.Int32
	pool := dbtest.PoolOn(t, dbtest.URL(t), 8, dbtest.LoseAnswerTo("-- name: HTTPAuthReplayClaim", &cut))
	svc := media.NewService(mediaStores["fs"](t), media.Limits{MaxBytes: testMediaMaxBytes, AllowedTypes: config.DefaultMediaTypes, TempDir: t.TempDir()}, nil)
	r := relaytest.StartWith(t, pool, []relay.Option{relay.WithMedia(svc)})
	require.Equal(t, http.StatusOK, upload(t, r, "", key, blob).Status)
	path := "/media/" + hexSHA(blob)
	cut.Store(1)
	got := mediaDo(t, r, http.MethodDelete, "", path, authHeader(nip98(t, key, http.MethodDelete, r.HTTPURL+path, nil, nil)), nil, nil)
	require.Equal(t, http.StatusServiceUnavailable, got.Status, "%s", got.Body)
	require.Equal(t, dberr.UnavailableAnswer, got.Error)
	var leases int
	require.NoError(t, r.Pool.QueryRow(context.Background(), `SELECT count(*) FROM community_serving_write_leases`).Scan(&leases))
	require.Zero(t, leases)
	require.Equal(t, http.StatusOK, mediaDo(t, r, http.MethodGet, "", path, "", nil, nil).Status, "the refused delete removed nothing")

	// The same failure in a NIP-98 upload's claim blames the check, not
	// the media store, and leaves nothing.
	other := pngBlob(t, 100)
	cut.Store(1)
	got = mediaDo(t, r, http.MethodPut, "", "/media/upload", authHeader(nip98(t, key, http.MethodPut, r.HTTPURL+"/media/upload", other, nil)), bytes.NewReader(other), nil)
	require.Equal(t, http.StatusServiceUnavailable, got.Status, "%s", got.Body)
	require.Equal(t, dberr.UnavailableAnswer, got.Error)
	require.Equal(t, http.StatusNotFound, mediaDo(t, r, http.MethodGet, "", "/media/"+hexSHA(other), "", nil, nil).Status)
	require.Equal(t, uploadCharge(blob), mediaUsage(t, db.New(r.Pool), r.CommunityID), "only the first blob is counted")
	waitFor(t, func() bool {
		return r.Pool.QueryRow(context.Background(), `SELECT count(*) FROM community_serving_write_leases`).Scan(&leases) == nil && leases == 0
	})
}
