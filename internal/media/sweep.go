package media

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/buzzrelay/buzz/internal/db"
)

// Sweeper removes blobs that no community references any more: a delete
// only unbinds its community (its upload records and sidecar), and a
// relay killed between storing a blob and referencing it, or a removal
// that failed, leaves one too. Each Sweep is one batch; the relay runs one
// every BUZZ_MEDIA_SWEEP_INTERVAL. Relay processes sharing the database
// take turns through one claim row, so one sweeps at a time.
type Sweeper struct {
	Service *Service
	Pool    *pgxpool.Pool
	// Claimant names this process in the claim.
	Claimant uuid.UUID
	// Grace: a blob is removed only once sweeps found it unreferenced for
	// this long, so a delete followed by a quick upload of the same bytes
	// does not remove and rewrite it.
	Grace time.Duration
	// Batch bounds the blob keys one sweep looks at, and the blobs it
	// removes.
	Batch int
}

// ForgetUnreferenced is an OnReference that forgets the sweep's note of
// the blob (media_unreferenced_blobs): the note keeps when the sweep first
// found the blob unreferenced, so a blob referenced and unreferenced again
// between two looks of the sweep would keep its old time and be removed
// sooner than the grace after its last reference went. Forgotten, it is
// noted anew the next time the sweep finds it unreferenced.
func ForgetUnreferenced(pool *pgxpool.Pool) OnReference {
	return func(ctx context.Context, blob string) error {
		return db.New(pool).MediaUnreferencedBlobsForget(ctx, []string{blob})
	}
}

// sweepLease bounds how long one sweep holds the claim; a sweep's work runs
// within it, so a process that died mid-sweep holds up the others at most
// this long.
const sweepLease = 5 * time.Minute

// SweepStats says what one Sweep did.
type SweepStats struct {
	Claimed bool // false: another process holds the claim; nothing was done
	Looked  int  // blob keys looked at
	Marked  int  // of those, found referenced by no community
	Removed int  // blobs removed
	Failed  int  // removals that failed (logged; retried by the next sweep)
}

// errBatchFull stops a walk once a batch has its keys.
var errBatchFull = errors.New("batch full")

// passedDir stops a walk at the first key under a top-level directory.
type passedDir struct{ dir string }

func (passedDir) Error() string { return "passed a directory" }

// nextBlobKeys returns up to n blob keys after cursor, in key order. Blobs
// sit at the top of the store, and the community prefixes sort among them
// ("_" falls between the digits and the letters): at the first key under
// a top-level directory the walk starts again after all of its keys, so a
// call lists about n keys plus one per directory it passes, however large
// the store.
func nextBlobKeys(ctx context.Context, store Store, cursor string, n int) ([]string, error) {
	var keys []string
	for {
		err := store.Walk(ctx, "", cursor, func(key string, _ int64) error {
			if key <= cursor {
				return nil // the store starts after it; cheap to be sure
			}
			if dir, _, nested := strings.Cut(key, "/"); nested {
				return passedDir{dir}
			}
			cursor = key
			if !IsBlobKey(key) {
				return nil
			}
			keys = append(keys, key)
			if len(keys) == n {
				return errBatchFull
			}
			return nil
		})
		var passed passedDir
		switch {
		case errors.As(err, &passed):
			// Every key under dir+"/" sorts before dir+"0", the next byte.
			cursor = passed.dir + "0"
		case err == nil, errors.Is(err, errBatchFull):
			return keys, nil
		default:
			return nil, err
		}
	}
}

// Sweep runs one batch: it claims the sweep, looks at the next Batch blob
// keys of its pass over the store and notes which no community references
// (forgetting those referenced again), then removes up to Batch noted
// blobs that stayed unreferenced for Grace, each under the hash's locks
// and only if, looked at again there, no community references it. An
// upload of the same bytes elsewhere either referenced the blob before
// (it stays) or looks for the blob under the blob lock after (and writes
// it again). A failed removal is logged and stays noted, so a later
// sweep tries it again, after the blobs that never failed.
//
// Its work stops when ctx ends or its time within the lease runs out (a
// shutdown, lookups slower than the batch allows: one per community for
// each key, a round trip each on S3): what it looked at by then is noted
// and its cursor moves past it, so the next sweep goes on from there
// rather than looking at the same keys again, and the claim is given back.
func (sw *Sweeper) Sweep(ctx context.Context) (st SweepStats, err error) {
	// Records what the work found even after ctx ended, each write within
	// its own bound.
	uncancelled := context.WithoutCancel(ctx)
	record := func(write func(context.Context) error) error {
		ctx, cancel := context.WithTimeout(uncancelled, 10*time.Second)
		defer cancel()
		return write(ctx)
	}
	ctx, cancel := context.WithTimeout(ctx, sweepLease-time.Minute)
	defer cancel()
	q := db.New(sw.Pool)
	s := sw.Service
	now := s.now()
	claim, err := q.MediaBlobSweepClaim(ctx, db.MediaBlobSweepClaimParams{Claimant: sw.Claimant, Now: &now, LeaseSeconds: int32(sweepLease / time.Second)})
	if errors.Is(err, pgx.ErrNoRows) {
		return st, nil
	}
	if err != nil {
		return st, fmt.Errorf("media sweep: claim: %w", err)
	}
	st.Claimed = true
	cursor, passStarted := claim.PassCursor, now
	if cursor != "" && claim.PassStartedAt != nil {
		passStarted = *claim.PassStartedAt
	}
	givenBack := passStarted
	defer func() {
		if err != nil {
			// Given back where it stood, for the next sweep (anyone's)
			// rather than at the lease's end.
			_ = record(func(ctx context.Context) error {
				_, err := q.MediaBlobSweepFinish(ctx, db.MediaBlobSweepFinishParams{PassCursor: claim.PassCursor, PassStartedAt: givenBack, Claimant: sw.Claimant})
				return err
			})
		}
	}()

	keys, err := nextBlobKeys(ctx, s.store, cursor, sw.Batch)
	if err != nil {
		return st, fmt.Errorf("media sweep: list blobs: %w", err)
	}
	passEnded := len(keys) < sw.Batch

	communities, err := CommunitiesWithMedia(ctx, s.store)
	if err != nil {
		return st, fmt.Errorf("media sweep: %w", err)
	}
	var unreferenced, referenced []string
	for i, key := range keys {
		ref, err := BlobReferenced(ctx, s.store, key, communities, uuid.Nil)
		if err != nil && ctx.Err() != nil {
			// Out of time: the keys looked at so far count, the rest
			// wait for the next sweep.
			keys, passEnded = keys[:i], false
			break
		}
		if err != nil {
			return st, fmt.Errorf("media sweep: %w", err)
		}
		if ref {
			referenced = append(referenced, key)
		} else {
			unreferenced = append(unreferenced, key)
		}
	}
	st.Looked = len(keys)
	if err := record(func(ctx context.Context) error { return q.MediaUnreferencedBlobsForget(ctx, referenced) }); err != nil {
		return st, fmt.Errorf("media sweep: forget referenced blobs: %w", err)
	}
	if err := record(func(ctx context.Context) error {
		_, err := q.MediaUnreferencedBlobsMark(ctx, db.MediaUnreferencedBlobsMarkParams{Now: &now, BlobKeys: unreferenced})
		return err
	}); err != nil {
		return st, fmt.Errorf("media sweep: note unreferenced blobs: %w", err)
	}
	st.Marked = len(unreferenced)

	var due []string
	if ctx.Err() == nil {
		if due, err = q.MediaUnreferencedBlobsDue(ctx, db.MediaUnreferencedBlobsDueParams{Cutoff: now.Add(-sw.Grace), MaxRows: int32(sw.Batch)}); err != nil && ctx.Err() == nil {
			return st, fmt.Errorf("media sweep: due blobs: %w", err)
		}
	}
	var settled, failed []string // settled: removed, gone, or referenced again
	for _, key := range due {
		removed, err := s.removeIfUnreferenced(ctx, key)
		if err != nil && ctx.Err() != nil {
			break // out of time, not a failure: the next sweep goes on
		}
		if err != nil {
			failed = append(failed, key)
			s.log.Error("media sweep: could not remove an unreferenced blob; the next sweep tries again", "blob", key, "err", err)
			continue
		}
		if removed {
			st.Removed++
		}
		settled = append(settled, key)
	}
	if err := record(func(ctx context.Context) error { return q.MediaUnreferencedBlobsForget(ctx, settled) }); err != nil {
		return st, fmt.Errorf("media sweep: forget removed blobs: %w", err)
	}
	st.Failed = len(failed)
	if err := record(func(ctx context.Context) error {
		return q.MediaUnreferencedBlobsRemovalFailed(ctx, db.MediaUnreferencedBlobsRemovalFailedParams{Now: &now, BlobKeys: failed})
	}); err != nil {
		return st, fmt.Errorf("media sweep: note failed removals: %w", err)
	}

	switch {
	case passEnded:
		if err := record(func(ctx context.Context) error { return q.MediaUnreferencedBlobsForgetUnseen(ctx, passStarted) }); err != nil {
			return st, fmt.Errorf("media sweep: forget blobs gone: %w", err)
		}
		cursor, passStarted = "", now
	case len(keys) > 0:
		cursor = keys[len(keys)-1]
	}
	if err := record(func(ctx context.Context) error {
		_, err := q.MediaBlobSweepFinish(ctx, db.MediaBlobSweepFinishParams{PassCursor: cursor, PassStartedAt: passStarted, Claimant: sw.Claimant})
		return err
	}); err != nil {
		return st, fmt.Errorf("media sweep: finish: %w", err)
	}
	return st, nil
}

// removeIfUnreferenced removes the blob at key under its hash's lock of
// this process (an upload of it here is not in progress) and its blob lock
// (nor on another process between its look for the blob and its sidecar's
// write), unless a community references it. removed is false when it is
// referenced, or already gone.
func (s *Service) removeIfUnreferenced(ctx context.Context, key string) (removed bool, _ error) {
	sha, _, _ := strings.Cut(key, ".")
	unlock := s.lock(sha)
	defer unlock()
	unlockBlob, err := s.blobLock(ctx, []string{sha})
	if err != nil {
		return false, err
	}
	defer unlockBlob()
	referenced, err := s.referenced(ctx, sha)
	if err != nil || referenced {
		return false, err
	}
	// Gone already (an earlier sweep whose claim lapsed mid-way, a
	// community's deletion): nothing to remove, and not counted again.
	if _, err := s.store.Stat(ctx, key); errors.Is(err, ErrNotFound) {
		return false, nil
	} else if err != nil {
		return false, fmt.Errorf("stat blob: %w", err)
	}
	if err := s.store.Delete(ctx, key); err != nil {
		return false, fmt.Errorf("delete blob: %w", err)
	}
	return true, nil
}
