package media_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/buzzrelay/buzz/internal/logtest"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/buzzrelay/buzz/internal/dbtest"
	"github.com/buzzrelay/buzz/internal/media"
)

var sweepLimits = media.Limits{MaxBytes: 1 << 20, AllowedTypes: []string{"text/plain"}}

// sweeper sweeps svc's store with no grace, in one batch.
func sweeper(svc *media.Service, pool *pgxpool.Pool) *media.Sweeper {
	return &media.Sweeper{Service: svc, Pool: pool, Claimant: uuid.New(), Batch: 1000}
}

// sweepAll runs one sweep of svc's store with no grace: every blob no
// community references goes.
func sweepAll(t *testing.T, svc *media.Service, pool *pgxpool.Pool) media.SweepStats {
	t.Helper()
	st, err := sweeper(svc, pool).Sweep(context.Background())
	require.NoError(t, err)
	require.True(t, st.Claimed)
	return st
}

func blobExists(t *testing.T, store media.Store, sha string) bool {
	t.Helper()
	_, err := store.Stat(context.Background(), sha+".txt")
	if errors.Is(err, media.ErrNotFound) {
		return false
	}
	require.NoError(t, err)
	return true
}

// A delete only unbinds its community: the blob stays until a sweep finds
// that no community references it, for the grace period. Then it goes; a
// blob another community still references stays.
// Mutations killed: the sweep's removal not looking at the other
// communities' sidecars (the shared blob goes); the grace ignored (the
// blob goes on the first sweep); a delete that still removes the blob.
func TestSweepRemovesOnlyUnreferencedBlobs(t *testing.T) {
	t.Parallel()
	for name, open := range stores {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			pool := dbtest.Pool(t)
			store := open(t)
			limits := sweepLimits
			limits.TempDir = t.TempDir()
			svc := media.NewService(store, limits, nil)
			svc.UseBlobLock(media.AdvisoryBlobLock(pool))
			var clock atomic.Int64
			clock.Store(time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC).Unix())
			svc.UseClock(func() time.Time { return time.Unix(clock.Load(), 0) })
			here, elsewhere := uuid.New(), uuid.New()
			shared, err := svc.Upload(ctx, here, "alice", strings.NewReader("bytes two communities hold"), nil)
			require.NoError(t, err)
			_, err = svc.Upload(ctx, elsewhere, "bob", strings.NewReader("bytes two communities hold"), nil)
			require.NoError(t, err)
			mine, err := svc.Upload(ctx, here, "alice", strings.NewReader("bytes only one community holds"), nil)
			require.NoError(t, err)
			require.NoError(t, svc.Delete(ctx, here, shared.SHA256, "alice"))
			require.NoError(t, svc.Delete(ctx, here, mine.SHA256, "alice"))
			require.True(t, blobExists(t, store, mine.SHA256), "a delete leaves the blob to the sweep")

			sw := &media.Sweeper{Service: svc, Pool: pool, Claimant: uuid.New(), Grace: time.Hour, Batch: 1000}
			st, err := sw.Sweep(ctx)
			require.NoError(t, err)
			require.Equal(t, media.SweepStats{Claimed: true, Looked: 2, Marked: 1}, st)
			require.True(t, blobExists(t, store, mine.SHA256), "unreferenced for less than the grace: kept")

			clock.Add(int64(time.Hour / time.Second))
			st, err = sw.Sweep(ctx)
			require.NoError(t, err)
			require.Equal(t, media.SweepStats{Claimed: true, Looked: 2, Marked: 1, Removed: 1}, st)
			require.False(t, blobExists(t, store, mine.SHA256), "unreferenced for the grace: removed")
			require.True(t, blobExists(t, store, shared.SHA256), "another community references it")
			_, obj, err := svc.Open(ctx, elsewhere, shared.SHA256)
			require.NoError(t, err)
			obj.Close()

			clock.Add(int64(time.Hour / time.Second))
			st, err = sw.Sweep(ctx)
			require.NoError(t, err)
			require.Equal(t, media.SweepStats{Claimed: true, Looked: 1}, st, "nothing left to remove")
		})
	}
}

// A sweep removing an unreferenced blob races uploads of the same bytes,
// on its own relay process and on another sharing the store and the
// database, in parallel, round after round. Whoever wins, the community
// that uploaded ends with its sidecar and the blob it names.
// Mutations killed: the sweep's removal without the blob lock, or without
// looking again for a sidecar under it (a sidecar naming a removed blob).
func TestSweepRacingAnUploadOfTheSameBytesKeepsTheBlob(t *testing.T) {
	t.Parallel()
	for name, open := range stores {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			pool := dbtest.Pool(t)
			store := open(t)
			limits := sweepLimits
			limits.TempDir = t.TempDir()
			sweeping := media.NewService(store, limits, nil)
			sweeping.UseBlobLock(media.AdvisoryBlobLock(pool))
			other := media.NewService(store, limits, nil)
			other.UseBlobLock(media.AdvisoryBlobLock(pool))
			sw := sweeper(sweeping, pool)
			removed := 0
			const rounds = 60
			for round := range rounds {
				uploader := []*media.Service{sweeping, other}[round%2]
				community := uuid.New()
				body := fmt.Sprintf("round %d of the race", round)
				d, err := uploader.Upload(ctx, community, "alice", strings.NewReader(body), nil)
				require.NoError(t, err)
				require.NoError(t, uploader.Delete(ctx, community, d.SHA256, "alice"))

				var wg sync.WaitGroup
				var st media.SweepStats
				var sweepErr, uploadErr error
				start := make(chan struct{})
				wg.Go(func() { <-start; st, sweepErr = sw.Sweep(ctx) })
				wg.Go(func() {
					<-start
					_, uploadErr = uploader.Upload(ctx, community, "alice", strings.NewReader(body), nil)
				})
				close(start)
				wg.Wait()
				require.NoError(t, sweepErr)
				require.NoError(t, uploadErr)
				removed += st.Removed

				_, obj, err := uploader.Open(ctx, community, d.SHA256)
				require.NoError(t, err, "round %d: the upload's sidecar names a blob that is gone", round)
				got, err := io.ReadAll(obj)
				obj.Close()
				require.NoError(t, err)
				require.Equal(t, body, string(got))
				require.NoError(t, uploader.Delete(ctx, community, d.SHA256, "alice"))
			}
			t.Logf("the sweep removed the blob before the upload in %d of %d rounds", removed, rounds)
		})
	}
}

// countBlobDeletes counts the store's deletes of blobs (keys not under
// "_").
type countBlobDeletes struct {
	media.Store
	n *atomic.Int64
}

func (c countBlobDeletes) Delete(ctx context.Context, key string) error {
	if !strings.HasPrefix(key, "_") {
		c.n.Add(1)
	}
	return c.Store.Delete(ctx, key)
}

// Two relay processes sweep one store at once, again and again: every
// unreferenced blob is removed exactly once (one store delete each), and
// the blob another community references is never removed.
// Mutations killed: the claim granted to any process (both sweep; with
// the removal's look for the blob gone too, each blob is deleted twice).
func TestTwoSweepersRemoveEachBlobOnce(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := dbtest.Pool(t)
	fs, err := media.NewFSStore(t.TempDir())
	require.NoError(t, err)
	var deletes atomic.Int64
	store := countBlobDeletes{Store: fs, n: &deletes}
	limits := sweepLimits
	limits.TempDir = t.TempDir()
	var processes [2]*media.Service
	var sweepers [2]*media.Sweeper
	for i := range processes {
		processes[i] = media.NewService(store, limits, nil)
		processes[i].UseBlobLock(media.AdvisoryBlobLock(pool))
		sweepers[i] = &media.Sweeper{Service: processes[i], Pool: pool, Claimant: uuid.New(), Batch: 7}
	}
	community, keeper := uuid.New(), uuid.New()
	const blobs = 40
	for i := range blobs {
		d, err := processes[0].Upload(ctx, community, "alice", strings.NewReader(fmt.Sprintf("blob %d", i)), nil)
		require.NoError(t, err)
		require.NoError(t, processes[0].Delete(ctx, community, d.SHA256, "alice"))
	}
	kept, err := processes[1].Upload(ctx, keeper, "bob", strings.NewReader("the blob that stays"), nil)
	require.NoError(t, err)

	var removed, claimed atomic.Int64
	for range 30 {
		var wg sync.WaitGroup
		start := make(chan struct{})
		for _, sw := range sweepers {
			wg.Go(func() {
				<-start
				st, err := sw.Sweep(ctx)
				require.NoError(t, err)
				removed.Add(int64(st.Removed))
				if st.Claimed {
					claimed.Add(1)
				}
			})
		}
		close(start)
		wg.Wait()
	}
	require.EqualValues(t, blobs, removed.Load())
	require.EqualValues(t, blobs, deletes.Load(), "each blob deleted once")
	require.True(t, blobExists(t, fs, kept.SHA256))
	keys, err := fs.List(ctx, "")
	require.NoError(t, err)
	require.Len(t, keys, 3, "the kept blob, its sidecar and its upload record: %v", keys)
	t.Logf("%d of 60 sweeps claimed", claimed.Load())
}

// failBlobDeletes fails the store's deletes of blobs while failing is set.
type failBlobDeletes struct {
	media.Store
	failing *atomic.Bool
}

func (f failBlobDeletes) Delete(ctx context.Context, key string) error {
	if !strings.HasPrefix(key, "_") && f.failing.Load() {
		return errors.New("the store refused the delete")
	}
	return f.Store.Delete(ctx, key)
}

// A removal the store refuses is logged, with the blob and the store's
// error, and tried again by the next sweep: the blob stays noted as
// unreferenced since it was first found so, so the next sweep removes it
// without waiting another grace.
// Mutations killed: a failed removal not logged; a failed removal
// forgotten with the settled ones (the next sweep finds the blob anew and
// keeps it for another grace).
func TestSweepLogsAFailedRemovalAndTriesItAgain(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := dbtest.Pool(t)
	fs, err := media.NewFSStore(t.TempDir())
	require.NoError(t, err)
	var failing atomic.Bool
	limits := sweepLimits
	limits.TempDir = t.TempDir()
	svc := media.NewService(failBlobDeletes{Store: fs, failing: &failing}, limits, nil)
	svc.UseBlobLock(media.AdvisoryBlobLock(pool))
	var logs logtest.Buffer
	svc.UseLogger(slog.New(slog.NewTextHandler(&logs, nil)))
	var clock atomic.Int64
	clock.Store(time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC).Unix())
	svc.UseClock(func() time.Time { return time.Unix(clock.Load(), 0) })
	community := uuid.New()
	d, err := svc.Upload(ctx, community, "alice", strings.NewReader("a blob the store will not let go"), nil)
	require.NoError(t, err)
	require.NoError(t, svc.Delete(ctx, community, d.SHA256, "alice"))

	sw := &media.Sweeper{Service: svc, Pool: pool, Claimant: uuid.New(), Grace: time.Hour, Batch: 1000}
	st, err := sw.Sweep(ctx)
	require.NoError(t, err)
	require.Equal(t, 1, st.Marked)

	clock.Add(int64(time.Hour / time.Second))
	failing.Store(true)
	st, err = sw.Sweep(ctx)
	require.NoError(t, err)
	require.Equal(t, media.SweepStats{Claimed: true, Looked: 1, Marked: 1, Failed: 1}, st)
	require.Contains(t, logs.String(), "could not remove an unreferenced blob")
	require.Contains(t, logs.String(), d.SHA256+".txt")
	require.Contains(t, logs.String(), "the store refused the delete")
	require.True(t, blobExists(t, fs, d.SHA256))

	failing.Store(false)
	clock.Add(1)
	st, err = sw.Sweep(ctx)
	require.NoError(t, err)
	require.Equal(t, 1, st.Removed, "the next sweep tries again")
	require.False(t, blobExists(t, fs, d.SHA256))
}

// failDeletesOf fails the store's deletes of the keys in keys.
type failDeletesOf struct {
	media.Store
	keys map[string]bool
}

func (f failDeletesOf) Delete(ctx context.Context, key string) error {
	if f.keys[key] {
		return errors.New("the store refused the delete")
	}
	return f.Store.Delete(ctx, key)
}

// Blobs whose removal keeps failing do not take every batch: once failed,
// a blob is tried after the due blobs that never failed. Two blobs the
// store never lets go fill a batch of two, the first due; the sweep after
// them removes the third.
// Mutation killed: the due list by first sight alone (the two failing
// blobs were the whole batch of every sweep, and the third never went).
func TestSweepFailingRemovalsDoNotStarveTheOthers(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := dbtest.Pool(t)
	fs, err := media.NewFSStore(t.TempDir())
	require.NoError(t, err)
	refused := map[string]bool{}
	limits := sweepLimits
	limits.TempDir = t.TempDir()
	svc := media.NewService(failDeletesOf{Store: fs, keys: refused}, limits, nil)
	svc.UseBlobLock(media.AdvisoryBlobLock(pool))
	svc.UseLogger(slog.New(slog.NewTextHandler(io.Discard, nil)))
	var clock atomic.Int64
	clock.Store(time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC).Unix())
	svc.UseClock(func() time.Time { return time.Unix(clock.Load(), 0) })
	community := uuid.New()
	var keys []string
	for i := range 3 {
		d, err := svc.Upload(ctx, community, "alice", strings.NewReader(fmt.Sprintf("blob %d", i)), nil)
		require.NoError(t, err)
		require.NoError(t, svc.Delete(ctx, community, d.SHA256, "alice"))
		keys = append(keys, d.SHA256+".txt")
	}
	slices.Sort(keys)
	// Noted at one time, they are due in key order: the first two fail.
	refused[keys[0]], refused[keys[1]] = true, true

	sw := &media.Sweeper{Service: svc, Pool: pool, Claimant: uuid.New(), Grace: time.Hour, Batch: 2}
	marked := 0
	for range 2 {
		st, err := sw.Sweep(ctx)
		require.NoError(t, err)
		marked += st.Marked
	}
	require.Equal(t, 3, marked)

	clock.Add(int64(time.Hour / time.Second))
	st, err := sw.Sweep(ctx)
	require.NoError(t, err)
	require.Equal(t, 2, st.Failed, "the two oldest due, both refused")
	require.Zero(t, st.Removed)

	clock.Add(1)
	st, err = sw.Sweep(ctx)
	require.NoError(t, err)
	require.Equal(t, 1, st.Removed, "the blob that never failed goes before the failed ones are tried again")
	require.Equal(t, 1, st.Failed, "one failed blob is tried again in the batch's other place")
	require.False(t, blobExists(t, fs, strings.TrimSuffix(keys[2], ".txt")))
}

// holdWalk holds the store's first walk until release is closed; entered
// receives as each walk begins.
type holdWalk struct {
	media.Store
	walks   *atomic.Int32
	entered chan struct{}
	release chan struct{}
}

func (h holdWalk) Walk(ctx context.Context, prefix, after string, fn func(key string, size int64) error) error {
	h.entered <- struct{}{}
	if h.walks.Add(1) == 1 {
		<-h.release
	}
	return h.Store.Walk(ctx, prefix, after, fn)
}

// While one process sweeps, another's sweep finds the claim taken and does
// nothing: it does not even list the store. Once the first is done, the
// claim is free again.
// Mutation killed: the claim granted whoever holds it (the second sweep
// runs beside the first).
func TestSweepIsClaimedByOneProcessAtATime(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := dbtest.Pool(t)
	fs, err := media.NewFSStore(t.TempDir())
	require.NoError(t, err)
	held := holdWalk{Store: fs, walks: new(atomic.Int32), entered: make(chan struct{}, 3), release: make(chan struct{})}
	limits := sweepLimits
	limits.TempDir = t.TempDir()
	first, second := media.NewService(held, limits, nil), media.NewService(held, limits, nil)
	done := make(chan error, 1)
	go func() { _, err := sweeper(first, pool).Sweep(ctx); done <- err }()
	<-held.entered

	st, err := sweeper(second, pool).Sweep(ctx)
	require.NoError(t, err)
	require.Equal(t, media.SweepStats{}, st, "the claim is taken")
	require.Empty(t, held.entered, "the second sweep did not list the store")
	close(held.release)
	require.NoError(t, <-done)

	st, err = sweeper(second, pool).Sweep(ctx)
	require.NoError(t, err)
	require.True(t, st.Claimed, "the first sweep gave the claim back")
}

// countWalk counts the keys the store's walks hand to their callers.
type countWalk struct {
	media.Store
	visited *atomic.Int64
}

func (c countWalk) Walk(ctx context.Context, prefix, after string, fn func(key string, size int64) error) error {
	return c.Store.Walk(ctx, prefix, after, func(key string, size int64) error {
		c.visited.Add(1)
		return fn(key, size)
	})
}

// Each sweep lists the store from where the last one stopped: over a pass
// of three batches of blobs, each referenced by a community (so the
// community prefixes hold two keys per blob), every sweep lists its batch
// and, passing a community prefix, one key of it; the pass lists each
// blob once and each prefix's first key once, on both stores.
// Mutations killed: Walk ignoring after (the third sweep lists all three
// batches and the prefixes); the sweep skipping the keys under a community
// prefix one by one instead of starting again after it.
func TestSweepListsFromWhereItStopped(t *testing.T) {
	t.Parallel()
	const batch, blobs = 10, 30
	for name, open := range stores {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			pool := dbtest.Pool(t)
			visited := new(atomic.Int64)
			store := countWalk{Store: open(t), visited: visited}
			limits := sweepLimits
			limits.TempDir = t.TempDir()
			svc := media.NewService(store, limits, nil)
			community := uuid.New()
			for i := range blobs {
				_, err := svc.Upload(ctx, community, "alice", strings.NewReader(fmt.Sprintf("blob %d", i)), nil)
				require.NoError(t, err)
			}
			sw := &media.Sweeper{Service: svc, Pool: pool, Claimant: uuid.New(), Grace: time.Hour, Batch: batch}
			var total int64
			for i, looked := range []int{batch, batch, batch, 0} {
				visited.Store(0)
				st, err := sw.Sweep(ctx)
				require.NoError(t, err)
				require.Equal(t, looked, st.Looked, "sweep %d", i+1)
				// CommunitiesWithMedia lists _meta/'s children, not through Walk.
				require.LessOrEqual(t, visited.Load(), int64(batch+2), "sweep %d lists its batch and at most one key of each community prefix", i+1)
				total += visited.Load()
			}
			require.Equal(t, int64(blobs+2), total, "a pass lists each blob and each community prefix's first key once")
		})
	}
}

// slowStats answers every Stat after a delay, as a remote store does.
type slowStats struct {
	media.Store
	delay time.Duration
}

func (s slowStats) Stat(ctx context.Context, key string) (media.Info, error) {
	select {
	case <-time.After(s.delay):
	case <-ctx.Done():
		return media.Info{}, ctx.Err()
	}
	return s.Store.Stat(ctx, key)
}

// A sweep whose lookups outlast its time (one per community for each key,
// a round trip each on S3) keeps what it looked at: the keys are noted and
// its cursor moves past them, so the sweeps after it go on through the
// store instead of each looking at the same first keys until its time runs
// out again. Mutation killed: the sweep fails whole at its deadline (no
// key is ever recorded, the cursor never moves).
func TestSweepOutOfTimeKeepsWhatItLookedAt(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := dbtest.Pool(t)
	limits := sweepLimits
	limits.TempDir = t.TempDir()
	store := slowStats{Store: stores["fs"](t), delay: 20 * time.Millisecond}
	svc := media.NewService(store, limits, nil)
	const communities, perCommunity = 10, 2
	for c := range communities {
		community := uuid.New()
		for i := range perCommunity {
			_, err := svc.Upload(ctx, community, "alice", strings.NewReader(fmt.Sprintf("blob %d of %d", i, c)), nil)
			require.NoError(t, err)
		}
	}
	sw := &media.Sweeper{Service: svc, Pool: pool, Claimant: uuid.New(), Grace: time.Hour, Batch: 1000}
	looked := 0
	for sweeps := 0; looked < communities*perCommunity; sweeps++ {
		require.Less(t, sweeps, communities*perCommunity, "the sweeps never got through the store")
		// Less time than the batch's lookups take (about 100 ms a key).
		short, cancel := context.WithTimeout(ctx, time.Second)
		st, err := sw.Sweep(short)
		cancel()
		require.NoError(t, err)
		require.True(t, st.Claimed, "the sweep before gave the claim back")
		looked += st.Looked
	}
	require.Equal(t, communities*perCommunity, looked, "each key looked at once over the pass")
}

// A blob the sweep noted unreferenced, then referenced again by an upload
// and unreferenced by a delete before the next sweep, gets the whole grace
// from when the sweep finds it unreferenced again: the upload forgot the
// note (ForgetUnreferenced), so the old time does not count.
// Mutation killed: the upload not forgetting the note (the blob went at
// the first sweep an hour after the first note, 20 minutes after the
// sweep found it unreferenced again).
func TestSweepGraceStartsAgainAfterABlobIsReferencedAgain(t *testing.T) {
	t.Parallel()
	for name, open := range stores {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			pool := dbtest.Pool(t)
			store := open(t)
			limits := sweepLimits
			limits.TempDir = t.TempDir()
			svc := media.NewService(store, limits, nil)
			svc.UseBlobLock(media.AdvisoryBlobLock(pool))
			svc.UseOnReference(media.ForgetUnreferenced(pool))
			var clock atomic.Int64
			clock.Store(time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC).Unix())
			svc.UseClock(func() time.Time { return time.Unix(clock.Load(), 0) })
			minutes := func(n int) { clock.Add(int64(n) * 60) }
			community := uuid.New()
			const body = "bytes uploaded, deleted, uploaded and deleted again"
			d, err := svc.Upload(ctx, community, "alice", strings.NewReader(body), nil)
			require.NoError(t, err)
			require.NoError(t, svc.Delete(ctx, community, d.SHA256, "alice"))

			sw := &media.Sweeper{Service: svc, Pool: pool, Claimant: uuid.New(), Grace: time.Hour, Batch: 1000}
			st, err := sw.Sweep(ctx) // noted now
			require.NoError(t, err)
			require.Equal(t, media.SweepStats{Claimed: true, Looked: 1, Marked: 1}, st)

			minutes(50)
			_, err = svc.Upload(ctx, community, "alice", strings.NewReader(body), nil)
			require.NoError(t, err)
			require.NoError(t, svc.Delete(ctx, community, d.SHA256, "alice"))
			st, err = sw.Sweep(ctx) // noted again, 50 minutes on
			require.NoError(t, err)
			require.Equal(t, media.SweepStats{Claimed: true, Looked: 1, Marked: 1}, st)

			minutes(20) // 70 minutes after the first note, 20 after the second
			st, err = sw.Sweep(ctx)
			require.NoError(t, err)
			require.Zero(t, st.Removed, "removed 20 minutes after it was found unreferenced again")
			require.True(t, blobExists(t, store, d.SHA256))

			minutes(40) // the grace after the second note
			st, err = sw.Sweep(ctx)
			require.NoError(t, err)
			require.Equal(t, 1, st.Removed, "unreferenced for the grace: removed")
			require.False(t, blobExists(t, store, d.SHA256))
		})
	}
}
