package deletion

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/buzzrelay/buzz/internal/db"
	"github.com/buzzrelay/buzz/internal/dberr"
	"github.com/buzzrelay/buzz/internal/media"
)

// chunkWriter streams keys into manifest chunks of at most size keys, one
// transaction per chunk under the executor's verified lease. A chunk never
// spans prefixes.
type chunkWriter struct {
	e      *Executor
	ctx    context.Context
	l      lease
	size   int
	next   int64
	prefix string
	class  string
	buf    []string
}

func (w *chunkWriter) start(prefix, class string) error {
	if err := w.flush(); err != nil {
		return err
	}
	w.prefix, w.class = prefix, class
	return nil
}

func (w *chunkWriter) add(key string) error {
	w.buf = append(w.buf, key)
	if len(w.buf) >= w.size {
		return w.flush()
	}
	return nil
}

func (w *chunkWriter) flush() error {
	if len(w.buf) == 0 {
		return nil
	}
	keys, err := json.Marshal(w.buf)
	if err != nil {
		return err
	}
	err = w.e.inTx(w.ctx, func(q *db.Queries, _ pgx.Tx) error {
		if _, err := q.DeletionRequestEnterExecutor(w.ctx, db.DeletionRequestEnterExecutorParams{ID: w.l.id, Owner: w.l.owner, Generation: w.l.gen, Stage: StageFenced}); err != nil {
			return err
		}
		return q.DeletionManifestChunkInsert(w.ctx, db.DeletionManifestChunkInsertParams{
			RequestID: w.l.id, ChunkNo: w.next, Prefix: w.prefix, KeyClass: w.class, Keys: keys})
	})
	if err != nil {
		return err
	}
	w.next++
	w.buf = w.buf[:0]
	return nil
}

// buildManifest lists the community's objects now that writers are fenced
// and drained, into chunks: first the shared blobs its sidecars point to
// (candidates: each is deleted only if no other community references it),
// then its sidecars, then its upload records. Memory holds one chunk and
// one listing page, whatever the community's size. The chunks are then
// read back and must hash exactly to the summary returned.
func (e *Executor) buildManifest(ctx context.Context, l lease) (StorageManifest, error) {
	if err := e.inTx(ctx, func(q *db.Queries, _ pgx.Tx) error {
		if _, err := q.DeletionRequestEnterExecutor(ctx, db.DeletionRequestEnterExecutorParams{ID: l.id, Owner: l.owner, Generation: l.gen, Stage: StageFenced}); err != nil {
			return err
		}
		_, err := q.DeletionManifestChunksClear(ctx, l.id)
		return err
	}); err != nil {
		return StorageManifest{}, err
	}
	w := &chunkWriter{e: e, ctx: ctx, l: l, size: e.cfg.ManifestChunkKeys}
	manifest := StorageManifest{Version: StorageManifestVersion}
	prefixes := media.CommunityPrefixes(l.community)

	blobs := newKeyDigest()
	if err := w.start(SharedBlobPrefix, ClassSharedBlob); err != nil {
		return manifest, err
	}
	if e.store != nil {
		err := e.store.Walk(ctx, prefixes[0], "", func(key string, _ int64) error {
			shape, _, ok := media.ClassifyCommunityKey(l.community, key)
			if !ok || shape != media.ShapeSidecar {
				return permanent("unknown object key shape under %s: %q", prefixes[0], key)
			}
			blob, err := media.SidecarBlob(ctx, e.store, key)
			if errors.Is(err, media.ErrNotFound) {
				return nil
			}
			if err != nil {
				return err
			}
			// Sidecar keys ascend by hash, so their blob keys do too.
			if err := blobs.add(blob, 0); err != nil {
				return err
			}
			return w.add(blob)
		})
		if err != nil {
			return manifest, err
		}
	}
	manifest.Prefixes = append(manifest.Prefixes, blobs.summary(SharedBlobPrefix, ClassSharedBlob))

	for _, prefix := range prefixes {
		if err := w.start(prefix, ClassBinding); err != nil {
			return manifest, err
		}
		d := newKeyDigest()
		if e.store != nil {
			err := e.store.Walk(ctx, prefix, "", func(key string, size int64) error {
				if _, _, ok := media.ClassifyCommunityKey(l.community, key); !ok {
					return permanent("unknown object key shape under %s: %q", prefix, key)
				}
				if err := d.add(key, size); err != nil {
					return err
				}
				return w.add(key)
			})
			if err != nil {
				return manifest, err
			}
		}
		manifest.Prefixes = append(manifest.Prefixes, d.summary(prefix, ClassBinding))
	}
	if err := w.flush(); err != nil {
		return manifest, err
	}
	return manifest, e.checkChunks(ctx, l, manifest, w.next)
}

// checkChunks reads the stored chunks back, one at a time, and requires
// them to be contiguous, grouped in manifest prefix order, owned by their
// prefix, and to hash exactly to the per-prefix summaries.
func (e *Executor) checkChunks(ctx context.Context, l lease, m StorageManifest, chunks int64) error {
	q := db.New(e.pool)
	digests := make([]*keyDigest, len(m.Prefixes))
	for i := range digests {
		digests[i] = newKeyDigest()
	}
	at := 0
	for n := int64(0); n < chunks; n++ {
		c, err := q.DeletionManifestChunk(ctx, db.DeletionManifestChunkParams{RequestID: l.id, ChunkNo: n})
		if dberr.IsNotFound(err) {
			return permanent("manifest chunk %d is missing", n)
		}
		if err != nil {
			return err
		}
		for at < len(m.Prefixes) && m.Prefixes[at].Prefix != c.Prefix {
			at++
		}
		if at == len(m.Prefixes) || m.Prefixes[at].Class != c.KeyClass {
			return permanent("manifest chunk %d has prefix %q out of manifest order", n, c.Prefix)
		}
		var keys []string
		if err := json.Unmarshal(c.Keys, &keys); err != nil || len(keys) == 0 {
			return permanent("manifest chunk %d does not decode to keys", n)
		}
		for _, key := range keys {
			if !ownedBy(l, c.KeyClass, c.Prefix, key) {
				return permanent("manifest chunk %d holds key %q outside its prefix", n, key)
			}
			if err := digests[at].add(key, 0); err != nil {
				return err
			}
		}
	}
	for i, p := range m.Prefixes {
		got := digests[i].summary(p.Prefix, p.Class)
		if got.ObjectCount != p.ObjectCount || got.KeysDigest != p.KeysDigest {
			return permanent("manifest chunks of %q do not hash to their summary (%d keys, want %d)", p.Prefix, got.ObjectCount, p.ObjectCount)
		}
	}
	return nil
}

func ownedBy(l lease, class, prefix, key string) bool {
	if class == ClassSharedBlob {
		return media.IsBlobKey(key)
	}
	_, _, ok := media.ClassifyCommunityKey(l.community, key)
	return ok && strings.HasPrefix(key, prefix)
}

// removeBindings deletes the manifest's objects chunk by chunk, stamping
// each chunk after its objects are gone: the community's own keys first,
// its shared-blob candidates last (DeletionManifestNextUndeleted says why).
// A crash between the deletion and the stamp is safe: the next owner
// deletes the chunk again, and keys already gone count as missing.
func (e *Executor) removeBindings(ctx context.Context, l lease, row db.CommunityDeletionRequest) error {
	q := db.New(e.pool)
	progress, err := q.DeletionManifestProgress(ctx, l.id)
	if err != nil {
		return err
	}
	var deletedNow, missing, kept int64
	for {
		c, err := q.DeletionManifestNextUndeleted(ctx, l.id)
		if dberr.IsNotFound(err) {
			break
		}
		if err != nil {
			return err
		}
		var keys []string
		if err := json.Unmarshal(c.Keys, &keys); err != nil {
			return permanent("manifest chunk %d does not decode: %v", c.ChunkNo, err)
		}
		for _, key := range keys {
			if !ownedBy(l, c.KeyClass, c.Prefix, key) {
				return permanent("manifest chunk %d holds key %q outside its prefix", c.ChunkNo, key)
			}
		}
		if _, err := q.DeletionRequestVerifyLease(ctx, db.DeletionRequestVerifyLeaseParams{ID: l.id, Owner: l.owner, Generation: l.gen, Stage: StageDrained}); err != nil {
			return err
		}
		del, miss, keep, err := e.deleteChunk(ctx, l, c.KeyClass, keys)
		if err != nil {
			return fmt.Errorf("delete chunk %d: %w", c.ChunkNo, err)
		}
		if int(del+miss+keep) != len(keys) {
			return fmt.Errorf("delete chunk %d: %d of %d keys acknowledged", c.ChunkNo, del+miss+keep, len(keys))
		}
		if e.cfg.PauseBeforeStampFile != "" {
			// Crash tests: the objects are gone, the stamp is not written.
			_ = os.WriteFile(e.cfg.PauseBeforeStampFile, []byte(fmt.Sprint(c.ChunkNo)), 0o600)
			<-ctx.Done()
			return ctx.Err()
		}
		detail, _ := json.Marshal(map[string]any{"prefix": c.Prefix, "class": c.KeyClass, "keys": len(keys),
			"deleted": del, "already_missing": miss, "kept_shared": keep})
		if err := q.DeletionManifestChunkStamp(ctx, db.DeletionManifestChunkStampParams{ID: l.id, Owner: l.owner, Generation: l.gen, ChunkNo: c.ChunkNo, Detail: detail}); err != nil {
			return err
		}
		deletedNow += del
		missing += miss
		kept += keep
		progress.DeletedChunks++
		progress.DeletedKeys += int64(len(keys))
		e.report(Progress{RequestID: l.id, Stage: StageDrained, Step: "delete objects", Chunk: progress.DeletedChunks,
			Chunks: progress.Chunks, ObjectsDeleted: progress.DeletedKeys, ObjectsTotal: progress.Keys, Generation: l.gen})
	}
	if e.store != nil {
		for _, prefix := range media.CommunityPrefixes(l.community) {
			if err := e.store.PruneEmpty(ctx, prefix); err != nil {
				return fmt.Errorf("prune %s: %w", prefix, err)
			}
		}
	}
	detail, _ := json.Marshal(map[string]any{"deleted_keys": progress.Keys, "removed_now": deletedNow,
		"already_missing": missing, "kept_shared": kept, "chunks": progress.Chunks})
	return e.inTx(ctx, func(q *db.Queries, _ pgx.Tx) error {
		if _, err := q.DeletionRequestEnterExecutor(ctx, db.DeletionRequestEnterExecutorParams{ID: l.id, Owner: l.owner, Generation: l.gen, Stage: StageDrained}); err != nil {
			return err
		}
		if _, err := q.DeletionRequestAdvance(ctx, db.DeletionRequestAdvanceParams{ID: l.id, Owner: l.owner, Generation: l.gen, FromStage: StageDrained}); err != nil {
			return err
		}
		return q.DeletionCheckpointUpsert(ctx, db.DeletionCheckpointUpsertParams{RequestID: l.id, Stage: StageDrained, UnitKey: "remove_storage_bindings",
			Status: "completed", Generation: l.gen, Detail: detail})
	})
}

// deleteChunk deletes a chunk's keys. A shared blob is deleted only when
// no other community has a sidecar for it, checked just before under the
// blob's lock (the communities with media listed once per group of
// blobLocksAtOnce keys, not once per blob).
func (e *Executor) deleteChunk(ctx context.Context, l lease, class string, keys []string) (deleted, missing, kept int64, err error) {
	if e.store == nil {
		return 0, 0, 0, permanent("the manifest lists objects but no object store is configured")
	}
	if class == ClassBinding {
		d, m, err := e.store.DeleteKeys(ctx, keys)
		return int64(d), int64(m), 0, err
	}
	// A chunk holds up to BUZZ_DELETION_MANIFEST_CHUNK_KEYS keys (10,000 by
	// default), and each blob lock is an entry in PostgreSQL's shared lock
	// table (64 x max_connections entries by default, for the whole
	// cluster): its shared blobs are decided blobLocksAtOnce at a time.
	for start := 0; start < len(keys); start += blobLocksAtOnce {
		d, m, k, err := e.deleteSharedBlobs(ctx, l, keys[start:min(start+blobLocksAtOnce, len(keys))])
		deleted, missing, kept = deleted+d, missing+m, kept+k
		if err != nil {
			return deleted, missing, kept, err
		}
	}
	return deleted, missing, kept, nil
}

// blobLocksAtOnce bounds the blob locks a deletion holds at once.
const blobLocksAtOnce = 64

// deleteSharedBlobs deletes those of keys no other community references.
func (e *Executor) deleteSharedBlobs(ctx context.Context, l lease, keys []string) (deleted, missing, kept int64, err error) {
	// Under the blob locks, an upload elsewhere has either written its
	// sidecar (listed below, so the blob is kept) or not yet checked that
	// the blob exists (it writes the blob again). The communities are
	// listed under the locks for that reason: once per group.
	var shas []string
	for _, key := range keys {
		if sha, _, ok := media.ParseBlobName(key); ok {
			shas = append(shas, sha) // only blobs an upload can write race with one
		}
	}
	unlock, err := media.AdvisoryBlobLock(e.pool)(ctx, shas)
	if err != nil {
		return 0, 0, 0, err
	}
	defer unlock()
	communities, err := media.CommunitiesWithMedia(ctx, e.store)
	if err != nil {
		return 0, 0, 0, err
	}
	var doomed []string
	for _, key := range keys {
		referenced, err := media.BlobReferenced(ctx, e.store, key, communities, l.community)
		if err != nil {
			return 0, 0, 0, err
		}
		if referenced {
			kept++
		} else {
			doomed = append(doomed, key)
		}
	}
	d, m, err := e.store.DeleteKeys(ctx, doomed)
	return int64(d), int64(m), kept, err
}
