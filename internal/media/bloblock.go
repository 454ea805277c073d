package media

import (
	"context"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// BlobLock holds the lock of every hash in shas, across every relay
// process that shares it, until unlock is called. Two steps race on a blob
// that several communities share: an upload's check that the blob exists
// followed by the write of its community's sidecar, and a delete's check
// that no community has a sidecar left followed by the removal of the
// blob. Run under one BlobLock, a delete never removes a blob that an
// upload is about to reference. The Service's own per-hash lock already
// serializes one process's requests; this is for the others.
type BlobLock func(ctx context.Context, shas []string) (unlock func(), err error)

// blobLockClass is the first key of every blob lock (two-key advisory
// locks live apart from the one-key locks other parts of the relay take).
// It spells "blob".
const blobLockClass int32 = 0x626c6f62

// blobLockKey is a hash's second key: its first four bytes. Two hashes
// that share them only wait for each other.
func blobLockKey(sha string) (int32, error) {
	b, err := hex.DecodeString(sha[:min(len(sha), 8)])
	if err != nil || len(b) != 4 {
		return 0, fmt.Errorf("media: %q is not a SHA-256 to lock", sha)
	}
	return int32(binary.BigEndian.Uint32(b)), nil
}

// unlockTimeout bounds giving the locks back; past it the session is
// closed, which gives them back too.
const unlockTimeout = 5 * time.Second

// AdvisoryBlobLock is a BlobLock of PostgreSQL session advisory locks on
// one connection of pool, held while the caller works on the object store
// (a sidecar write, a check of the communities' sidecars and a delete):
// short steps, but outside any transaction, so the connection is not idle
// in a transaction meanwhile. The keys are taken in ascending order, so two
// holders of several never deadlock.
func AdvisoryBlobLock(pool *pgxpool.Pool) BlobLock {
	return func(ctx context.Context, shas []string) (func(), error) {
		keys := make([]int32, 0, len(shas))
		for _, sha := range shas {
			k, err := blobLockKey(sha)
			if err != nil {
				return nil, err
			}
			keys = append(keys, k)
		}
		slices.Sort(keys)
		keys = slices.Compact(keys)
		conn, err := pool.Acquire(ctx)
		if err != nil {
			return nil, fmt.Errorf("media: blob lock: %w", err)
		}
		unlock := func() {
			ctx, cancel := context.WithTimeout(context.Background(), unlockTimeout)
			defer cancel()
			if _, err := conn.Exec(ctx, "-- name: MediaBlobUnlock\nSELECT pg_advisory_unlock_all()"); err != nil {
				// A session that may still hold a lock must not go back
				// to the pool: closing it gives every lock back.
				_ = conn.Conn().Close(ctx)
			}
			conn.Release()
		}
		for _, k := range keys {
			// One statement per key, in order: a set-returning statement
			// would not promise the order its rows lock in.
			if _, err := conn.Exec(ctx, "-- name: MediaBlobLock\nSELECT pg_advisory_lock($1::int, $2::int)", blobLockClass, k); err != nil {
				unlock()
				return nil, fmt.Errorf("media: blob lock: %w", err)
			}
		}
		return unlock, nil
	}
}

// noBlobLock is the BlobLock of a Service no other process shares a store
// with.
func noBlobLock(context.Context, []string) (func(), error) { return func() {}, nil }
