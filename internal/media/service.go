package media

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"mime"
	"net/http"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/google/uuid"

	"github.com/buzzrelay/buzz/internal/dberr"
)

// Refusals a client can cause; the HTTP layer maps each to its status.
var (
	ErrTooLarge       = errors.New("blob too large")
	ErrTypeNotAllowed = errors.New("media type not allowed")
	ErrHashMismatch   = errors.New("blob hash mismatch")
	ErrNotUploader    = errors.New("not the uploader")
	ErrEmpty          = errors.New("empty blob")
	// ErrBodyUnreadable: the request body failed before its end (the client
	// went away, or its read timed out); the store is not at fault.
	ErrBodyUnreadable = errors.New("the upload body could not be read")
	// ErrSpool: the relay's own temporary file failed (its disk is full, or
	// its directory is gone); the client is not at fault.
	ErrSpool = errors.New("the upload could not be spooled")
)

// referencingFailed marks an upload that failed while writing its upload
// record or sidecar: one of them may remain (their removal failed too).
type referencingFailed struct{ error }

func (e referencingFailed) Unwrap() error { return e.error }

// removalFailed marks a delete that failed after it removed an upload
// record or the sidecar.
type removalFailed struct{ error }

func (e removalFailed) Unwrap() error { return e.error }

// DeletedNothing reports whether the delete that failed with err failed
// before removing anything, so the community holds what it held. The
// relay then lets the client send the same request again.
func DeletedNothing(err error) bool {
	var rf removalFailed
	return !errors.As(err, &rf)
}

// StoredNothing reports whether the upload that failed with err failed
// before writing its upload record and sidecar, so its community holds
// nothing of it (a blob it wrote is removed again, or left as unreferenced
// space). The relay then lets the client send the same request again.
func StoredNothing(err error) bool {
	var rf referencingFailed
	return !errors.As(err, &rf)
}

// Limits bound what an upload may be.
type Limits struct {
	MaxBytes     int64    // largest blob accepted
	AllowedTypes []string // media types (no parameters) accepted
	TempDir      string   // where an upload is spooled while it is hashed; "" = os.TempDir()
}

// Descriptor is what the relay knows of one community's blob.
type Descriptor struct {
	SHA256   string `json:"sha256"`
	Size     int64  `json:"size"`
	Type     string `json:"type"`
	Uploaded int64  `json:"uploaded"`
	Blob     string `json:"blob"` // the shared blob's key
	// Charged is what the sidecar counts against its community's quota,
	// given back when it is removed; 0 in a sidecar written before the
	// quota counted objects, which counted Size.
	Charged int64 `json:"charged,omitempty"`
}

// charged is what removing the sidecar d gives back to the quota.
func (d Descriptor) charged() int64 {
	if d.Charged > 0 {
		return d.Charged
	}
	return d.Size
}

// uploadRecord attributes one upload of a blob in one community.
type uploadRecord struct {
	Pubkey   string `json:"pubkey"`
	SHA256   string `json:"sha256"`
	Uploaded int64  `json:"uploaded"`
	// Charged is what the record counts against the quota (ObjectCharge);
	// 0 in a record written before records were counted.
	Charged int64 `json:"charged,omitempty"`
}

// Service stores and serves blobs per community over one Store.
type Service struct {
	store  Store
	limits Limits
	now    func() time.Time
	quota  Quota // nil: no quota
	// Uploads and deletes of one hash serialize on its lock, so this
	// process never deletes a blob between another upload's check that it
	// exists and the write of that upload's sidecar. Different hashes never
	// wait for each other, however long a blob takes to store.
	locksMu sync.Mutex
	locks   map[string]*hashLock
	// blobLock does the same across relay processes (UseBlobLock).
	blobLock BlobLock
	// commitGuard confirms, right before an upload writes its upload
	// record and sidecar, that it may still (UseCommitGuard).
	commitGuard CommitGuard
	// onReference is told of each blob an upload made its community
	// reference (UseOnReference).
	onReference OnReference
	log         *slog.Logger
}

// OnReference is told, after an upload's sidecar made its community
// reference blob, that the blob is referenced again.
type OnReference func(ctx context.Context, blob string) error

// onReferenceTimeout bounds telling onReference. The upload's answer waits
// for it (the relay's hook waits for a read slot, as the upload's quota
// reservation did before), and a client gone meanwhile does not cut it
// short: the reference was made.
const onReferenceTimeout = 10 * time.Second

// CommitGuard is asked right before an upload makes its blob visible (its
// upload record and sidecar, under the blob lock) whether it still may,
// and returns the context to write them under, which done ends. An error
// refuses the upload: it stores nothing, and whatever it wrote is removed.
type CommitGuard func(ctx context.Context) (commitCtx context.Context, done context.CancelFunc, err error)

func noCommitGuard(ctx context.Context) (context.Context, context.CancelFunc, error) {
	return ctx, func() {}, nil
}

// hashLock is one hash's lock and how many requests hold or await it.
type hashLock struct {
	sync.Mutex
	users int
}

// NewService serves blobs from store; now is the relay's clock.
func NewService(store Store, limits Limits, now func() time.Time) *Service {
	if now == nil {
		now = time.Now
	}
	return &Service{store: store, limits: limits, now: now, locks: map[string]*hashLock{}, blobLock: noBlobLock, commitGuard: noCommitGuard, log: slog.New(slog.DiscardHandler)}
}

// UseBlobLock makes uploads and deletes of a shared blob serialize with
// every other relay process on the same store (AdvisoryBlobLock); call it
// before serving.
func (s *Service) UseBlobLock(l BlobLock) { s.blobLock = l }

// UseCommitGuard makes every upload ask g before it writes its upload
// record and sidecar; call it before serving.
func (s *Service) UseCommitGuard(g CommitGuard) { s.commitGuard = g }

// UseOnReference makes every upload that references a blob in its
// community for the first time tell fn (ForgetUnreferenced); call it
// before serving.
func (s *Service) UseOnReference(fn OnReference) { s.onReference = fn }

// UseLogger makes the service log what fails where no request sees it (a
// blob's removal); call it before serving.
func (s *Service) UseLogger(l *slog.Logger) { s.log = l }

// UseClock makes the service tell upload times by now (the relay's one
// clock); call it before serving.
func (s *Service) UseClock(now func() time.Time) { s.now = now }

// UseQuota makes uploads reserve their bytes with q and deletes release
// them; call it before serving.
func (s *Service) UseQuota(q Quota) { s.quota = q }

// Limits reports the service's upload bounds.
func (s *Service) Limits() Limits { return s.limits }

// lock takes sha's lock and returns its release; the entry lives only
// while someone holds or awaits it.
func (s *Service) lock(sha string) func() {
	s.locksMu.Lock()
	l := s.locks[sha]
	if l == nil {
		l = &hashLock{}
		s.locks[sha] = l
	}
	l.users++
	s.locksMu.Unlock()
	l.Lock()
	return func() {
		l.Unlock()
		s.locksMu.Lock()
		if l.users--; l.users == 0 {
			delete(s.locks, sha)
		}
		s.locksMu.Unlock()
	}
}

// sniffLen is how much of a blob http.DetectContentType looks at.
const sniffLen = 512

// Check reports whether the store can serve.
func (s *Service) Check(ctx context.Context) error { return s.store.Check(ctx) }

// Upload spools body to a temporary file while hashing it, refuses it if
// it exceeds the size limit or its sniffed type is not allowed, asks
// accept (nil = accept all) whether the request may store these bytes,
// then stores the blob (once for all communities), this community's
// sidecar, and an upload record for uploader.
func (s *Service) Upload(ctx context.Context, community uuid.UUID, uploader string, requestBody io.Reader, accept func(sha string) error) (_ Descriptor, failed error) {
	body := &bodyReader{r: requestBody}
	head := make([]byte, sniffLen)
	n, err := io.ReadFull(body, head)
	if err != nil && !errors.Is(err, io.ErrUnexpectedEOF) && !errors.Is(err, io.EOF) {
		return Descriptor{}, body.failed(err)
	}
	head = head[:n]
	if n == 0 {
		return Descriptor{}, fmt.Errorf("%w: the request has no body", ErrEmpty)
	}
	if int64(n) > s.limits.MaxBytes {
		return Descriptor{}, fmt.Errorf("%w: the limit is %d bytes", ErrTooLarge, s.limits.MaxBytes)
	}
	mediaType := sniffType(head)
	if !slices.Contains(s.limits.AllowedTypes, mediaType) {
		return Descriptor{}, fmt.Errorf("%w: the content is %s; allowed: %s", ErrTypeNotAllowed, mediaType, strings.Join(s.limits.AllowedTypes, ", "))
	}

	tmp, err := os.CreateTemp(s.limits.TempDir, "buzz-upload-*")
	if err != nil {
		return Descriptor{}, fmt.Errorf("%w: %w", ErrSpool, err)
	}
	// Unlinked at once: the spool is only ever used through this open
	// file, whose bytes the kernel frees when it is closed, however the
	// process ends. Removed at the end instead, every upload in flight
	// when a relay was killed (kill -9, out of memory) stayed on disk for
	// good, up to BUZZ_MEDIA_MAX_BYTES each.
	unlinked := os.Remove(tmp.Name()) == nil
	defer func() {
		tmp.Close()
		if !unlinked {
			os.Remove(tmp.Name())
		}
	}()
	hash := sha256.New()
	sink := io.MultiWriter(tmp, hash)
	if _, err := sink.Write(head); err != nil {
		return Descriptor{}, fmt.Errorf("%w: %w", ErrSpool, err)
	}
	// One byte past the limit tells an oversized body from one exactly at it.
	rest, err := io.Copy(sink, io.LimitReader(body, s.limits.MaxBytes-int64(n)+1))
	if err != nil {
		var tooLarge *http.MaxBytesError
		if errors.As(err, &tooLarge) {
			return Descriptor{}, fmt.Errorf("%w: the limit is %d bytes", ErrTooLarge, s.limits.MaxBytes)
		}
		return Descriptor{}, body.failed(err)
	}
	size := int64(n) + rest
	if size > s.limits.MaxBytes {
		return Descriptor{}, fmt.Errorf("%w: the limit is %d bytes", ErrTooLarge, s.limits.MaxBytes)
	}
	sha := hex.EncodeToString(hash.Sum(nil))
	if accept != nil {
		if err := accept(sha); err != nil {
			return Descriptor{}, err
		}
	}

	now := s.now()
	unlock := s.lock(sha)
	defer unlock()
	key := blobKey(sha, mediaType) // the key of these bytes, unless a sidecar names one
	// The upload counts against its community its upload record
	// (ObjectCharge) and, from the community's first reference to the blob
	// (the sidecar this upload writes) on, the blob (BlobCharge). Whether
	// the sidecar is new is decided under the blob lock, where every
	// process writes and removes sidecars; a guess from before it reserves
	// early, so that an upload refused for the quota is refused before the
	// store sees a byte. What is reserved and not kept (an object the
	// upload did not write, or removed again) is given back.
	var reserved, kept int64
	defer func() {
		if reserved > kept {
			// The client may be gone: give the bytes back anyway.
			_ = s.quota.Release(context.WithoutCancel(ctx), community, reserved-kept)
		}
	}()
	reserve := func(n int64) error {
		if s.quota == nil {
			return nil
		}
		if err := s.quota.Reserve(ctx, community, n); err != nil {
			return err
		}
		reserved += n
		return nil
	}
	newHere, blobReserved := false, false // newHere: as far as the guess can tell, this community's first upload of the blob
	if guess, err := s.readSidecar(ctx, community, sha); errors.Is(err, ErrNotFound) {
		if err := reserve(BlobCharge(size) + ObjectCharge); err != nil {
			return Descriptor{}, err
		}
		newHere, blobReserved = true, true
	} else if err != nil {
		return Descriptor{}, err
	} else {
		if err := reserve(ObjectCharge); err != nil {
			return Descriptor{}, err
		}
		key = guess.Blob
	}
	// A blob this upload wrote and then failed to reference would be named
	// by no sidecar: no delete and no community deletion would ever reach
	// it, and its bytes would count against no quota (a client hanging up
	// while its blob is stored ends the request's context: one hang-up per
	// blob would fill the store). It is removed, unless another community
	// references it by then; the client may be gone, so whatever happens.
	wroteBlob := ""
	defer func() {
		if failed != nil && wroteBlob != "" {
			ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), abandonedBlobTimeout)
			defer cancel()
			// Not logged when the blob lock could not be taken for a
			// database outage: every upload that fails in an outage fails
			// here too, the outage is logged once by the relay, and the
			// sweep removes the blob. The store's own failures are logged:
			// its network errors would pass for an unreachable database.
			if err := s.deleteUnreferencedBlob(ctx, sha, wroteBlob); err != nil &&
				!(errors.Is(err, errBlobLockNotTaken) && dberr.IsUnreachable(err)) {
				s.log.Warn("media: could not remove the blob of a failed upload; the sweep will", "blob", wroteBlob, "err", err)
			}
		}
	}()
	ensureBlob := func(key string, always bool) error {
		wrote, err := s.ensureBlob(ctx, key, tmp, size, mediaType, always)
		if wrote {
			wroteBlob = key
		}
		return err
	}
	// The blob is written before the blob lock, which is then held only
	// for the short check and the writes of the upload record and the
	// sidecar: a delete elsewhere that removed the blob meanwhile is seen
	// under the lock, and the blob written again. It is written even when
	// the store holds it already (same hash, same bytes), unless this
	// community does: skipping the write of a blob only other communities
	// hold would answer measurably sooner (on the dev box's disk, 30-80 ms
	// sooner for 32 MiB), telling the uploader that someone elsewhere on
	// the relay stored this file. Within its own community an upload
	// learns nothing so: anyone with the bytes may GET them by their hash.
	if err := ensureBlob(key, newHere); err != nil {
		return Descriptor{}, err
	}
	for {
		unlockBlob, err := s.blobLock(ctx, []string{sha})
		if err != nil {
			return Descriptor{}, err
		}
		d, err := s.readSidecar(ctx, community, sha)
		first := errors.Is(err, ErrNotFound)
		if first && s.quota != nil && !blobReserved {
			// The sidecar went since the guess (a delete elsewhere): reserve,
			// outside the lock (another connection of the same pool), and
			// look again; reserved, the next look decides either way.
			unlockBlob()
			if err := reserve(BlobCharge(size)); err != nil {
				return Descriptor{}, err
			}
			blobReserved = true
			continue
		}
		if first {
			d, err = Descriptor{SHA256: sha, Size: size, Type: mediaType, Uploaded: now.Unix(), Blob: blobKey(sha, mediaType), Charged: BlobCharge(size)}, nil
		}
		if err == nil {
			err = ensureBlob(d.Blob, false)
		}
		if err == nil {
			var commitCtx context.Context
			var done context.CancelFunc
			if commitCtx, done, err = s.commitGuard(ctx); err == nil {
				var recordKept, sidecarKept bool
				recordKept, sidecarKept, err = s.reference(commitCtx, community, d, uploader, now, first)
				done()
				if recordKept {
					kept += ObjectCharge
				}
				if sidecarKept {
					kept += d.Charged
				}
				if err != nil {
					err = referencingFailed{err}
				}
			}
		}
		unlockBlob()
		if err != nil {
			return Descriptor{}, err
		}
		if first && s.onReference != nil {
			// After the blob lock: the relay's hook takes a database
			// connection of its own. A failure leaves the sweep's older
			// note; the removal still looks for references first.
			ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), onReferenceTimeout)
			if err := s.onReference(ctx, d.Blob); err != nil {
				s.log.Warn("media: could not forget the sweep's note of a blob referenced again", "blob", d.Blob, "err", err)
			}
			cancel()
		}
		return d, nil
	}
}

// reference writes uploader's upload record of d in community, then the
// community's sidecar d when first, under the blob lock: a delete of the
// same blob in the same community on another relay process lists the
// upload records under it too, so it sees this upload's record whenever it
// could have seen its sidecar (or it would remove the sidecar the upload
// just answered for). The record comes first so that a relay killed
// between the two leaves a record without a sidecar (the blob is not
// served here, and the next upload of it writes the sidecar), never a
// sidecar without a record, which would serve and count the blob while no
// member could delete it. recordKept and sidecarKept say which of the two
// stay, and so stay counted.
//
// A write that reports failure may still have been stored: an S3 PUT the
// store completed after the client's hang-up cancelled the relay's wait
// for it. So every object a failed reference tried to write is removed
// again, whatever its own write answered, on a context the client's
// hang-up does not end.
func (s *Service) reference(ctx context.Context, community uuid.UUID, d Descriptor, uploader string, now time.Time, first bool) (recordKept, sidecarKept bool, _ error) {
	cleanup := context.WithoutCancel(ctx)
	rec := uploadRecord{Pubkey: uploader, SHA256: d.SHA256, Uploaded: now.Unix(), Charged: ObjectCharge}
	recKey := uploadsPrefix(community, d.SHA256) + newULID(now) + ".json"
	if err := s.putJSON(ctx, recKey, rec); err != nil {
		// A record left would name this uploader for a blob the upload
		// failed to store here. The write may still have stored it (see
		// above): one whose removal fails too stays counted, since its
		// charge, written in it, is given back when it is deleted.
		recordLeft := s.store.Delete(cleanup, recKey) != nil
		return recordLeft, false, fmt.Errorf("store upload record: %w", err)
	}
	if !first {
		return true, false, nil
	}
	if err := s.putJSON(ctx, sidecarKey(community, d.SHA256), d); err != nil {
		// The sidecar would keep the blob readable here, uncounted once
		// the reservation is given back: remove it, then the record. If
		// the sidecar's removal fails, both stay, and stay counted (the
		// count errs high, never low): the record is how the uploader may
		// still delete the blob.
		if s.store.Delete(cleanup, sidecarKey(community, d.SHA256)) != nil {
			return true, true, fmt.Errorf("store sidecar: %w", err)
		}
		recordLeft := s.store.Delete(cleanup, recKey) != nil
		return recordLeft, false, fmt.Errorf("store sidecar: %w", err)
	}
	return true, true, nil
}

// abandonedBlobTimeout bounds removing the blob of a failed upload.
const abandonedBlobTimeout = 30 * time.Second

// ensureBlob writes the spooled blob under key unless the store holds it
// (always: whether it does or not), and says whether it tried to (a failed
// Put may still have stored it). It also restores a blob a delete on
// another relay process removed while this community still had its
// sidecar (before blob locks, or without).
func (s *Service) ensureBlob(ctx context.Context, key string, spool io.ReadSeeker, size int64, mediaType string, always bool) (wrote bool, _ error) {
	if !always {
		_, err := s.store.Stat(ctx, key)
		if err == nil {
			return false, nil
		}
		if !errors.Is(err, ErrNotFound) {
			return false, fmt.Errorf("stat blob: %w", err)
		}
	}
	if _, err := spool.Seek(0, io.SeekStart); err != nil {
		return false, err
	}
	if err := s.store.Put(ctx, key, spool, size, mediaType); err != nil {
		return true, fmt.Errorf("store blob: %w", err)
	}
	return true, nil
}

// sniffType is the media type of a blob's first bytes, without parameters.
func sniffType(head []byte) string {
	t, _, err := mime.ParseMediaType(http.DetectContentType(head))
	if err != nil {
		return "application/octet-stream"
	}
	return t
}

// Open returns community's descriptor of sha and its bytes; ErrNotFound
// when the community has no such blob (even if another community has).
func (s *Service) Open(ctx context.Context, community uuid.UUID, sha string) (Descriptor, Object, error) {
	d, err := s.readSidecar(ctx, community, sha)
	if err != nil {
		return Descriptor{}, nil, err
	}
	obj, _, err := s.store.Open(ctx, d.Blob)
	if err != nil {
		return Descriptor{}, nil, err
	}
	return d, obj, nil
}

// Delete removes uploader's upload records of sha in community. When no
// other member's record remains, the community's sidecar goes too. The
// blob itself stays for the Sweeper, which removes it once no community
// has referenced it for its grace: removed here, the delete's work (and an
// upload of the same bytes waiting on the hash's locks meanwhile) told the
// deleter whether another community holds the bytes. Upload records
// left without a sidecar (an upload or a delete cut short between its two
// steps) are removed too: the blob is not served then, but they count
// against the quota and keep the sidecar of a later upload by another
// member in place. ErrNotFound: the community has no such blob, nor
// uploader's records of it; ErrNotUploader: it has, but uploader never
// uploaded it here.
func (s *Service) Delete(ctx context.Context, community uuid.UUID, sha, uploader string) error {
	// A community with no sidecar of sha and no record of it has nothing
	// to delete: answered before the blob's locks, which the sweep's
	// removal of the blob holds for as long as it takes.
	if _, err := s.readSidecar(ctx, community, sha); errors.Is(err, ErrNotFound) {
		records, lerr := s.store.List(ctx, uploadsPrefix(community, sha))
		if lerr != nil {
			// Not ErrNotFound: the member's records may be there, and
			// the same delete sent again removes them.
			return fmt.Errorf("list upload records: %w", lerr)
		}
		if len(records) == 0 {
			return err
		}
	}
	unlock := s.lock(sha)
	// Under the blob lock from the listing of the upload records on: an
	// upload on another relay process writes its sidecar and record under
	// it, so the listing never misses the record of an upload whose
	// sidecar this delete would remove.
	unlockBlob, err := s.blobLock(ctx, []string{sha})
	if err != nil {
		unlock()
		return err
	}
	released, removed, err := s.deleteUnderBlobLock(ctx, community, sha, uploader)
	unlockBlob()
	unlock()
	if released > 0 && s.quota != nil {
		// After the lock: the release is a transaction on another
		// connection of the same pool.
		if qerr := s.quota.Release(context.WithoutCancel(ctx), community, released); qerr != nil && err == nil {
			err = fmt.Errorf("release the blob's bytes from the community's media quota: %w", qerr)
		}
	}
	if err != nil && removed {
		err = removalFailed{err}
	}
	return err
}

// deleteUnderBlobLock is Delete's work under the blob lock; released is
// what to give back to the community's quota: the charges of the upload
// records it removed, and of the sidecar once that is gone. removed says
// whether it removed anything.
func (s *Service) deleteUnderBlobLock(ctx context.Context, community uuid.UUID, sha, uploader string) (released int64, removed bool, _ error) {
	// Without a sidecar, records are what an upload or delete cut short
	// left: under the blob lock no upload is between writing its record
	// and its sidecar.
	d, err := s.readSidecar(ctx, community, sha)
	sidecar := err == nil
	if err != nil && !errors.Is(err, ErrNotFound) {
		return 0, false, err
	}
	keys, err := s.store.List(ctx, uploadsPrefix(community, sha))
	if err != nil {
		return 0, false, fmt.Errorf("list upload records: %w", err)
	}
	var mine []string
	var charged []int64 // of mine
	others := 0
	for _, key := range keys {
		var rec uploadRecord
		if err := s.readJSON(ctx, key, &rec); err != nil {
			return 0, false, fmt.Errorf("read upload record: %w", err)
		}
		if rec.Pubkey == uploader {
			mine, charged = append(mine, key), append(charged, rec.Charged)
		} else {
			others++
		}
	}
	if len(mine) == 0 && !sidecar {
		return 0, false, ErrNotFound
	}
	if len(mine) == 0 {
		return 0, false, fmt.Errorf("%w: only a member who uploaded this blob here may delete it", ErrNotUploader)
	}
	// The sidecar goes before the records, the reverse of an upload's
	// writes: a delete cut short between the two (kill -9, a store
	// error) leaves records without a sidecar (the blob is not served
	// here, and the retry removes them), never a sidecar without the
	// deleter's records, which served and counted the blob while every
	// member's delete, the retry included, was refused as not the
	// uploader's. Each object removed gives back its charge, even when a
	// later step fails. A first removal that reports failure may still
	// have happened (an S3 DELETE completed after the relay stopped
	// waiting): taken for nothing removed all the same, since the same
	// delete sent again only finishes what it began.
	if sidecar && others == 0 {
		if err := s.store.Delete(ctx, sidecarKey(community, sha)); err != nil {
			return 0, false, fmt.Errorf("delete sidecar: %w", err)
		}
		released, removed = d.charged(), true
	}
	for i, key := range mine {
		if err := s.store.Delete(ctx, key); err != nil {
			return released, removed, fmt.Errorf("delete upload record: %w", err)
		}
		released, removed = released+charged[i], true
	}
	return released, removed, nil
}

// errBlobLockNotTaken marks deleteUnreferencedBlob's failure to take the
// blob lock (a database statement in the relay) apart from the store's.
var errBlobLockNotTaken = errors.New("blob lock not taken")

// deleteUnreferencedBlob deletes the blob at key, under the blob lock,
// unless a community has a sidecar for sha.
func (s *Service) deleteUnreferencedBlob(ctx context.Context, sha, key string) error {
	unlockBlob, err := s.blobLock(ctx, []string{sha})
	if err != nil {
		return fmt.Errorf("%w: %w", errBlobLockNotTaken, err) // the blob stays: only space
	}
	defer unlockBlob()
	return s.deleteIfUnreferenced(ctx, sha, key)
}

// deleteIfUnreferenced deletes the blob at key unless a community has a
// sidecar for sha; the caller holds the blob lock, so an upload elsewhere
// has either written its sidecar (the blob stays) or not yet looked for
// the blob (it writes it again).
func (s *Service) deleteIfUnreferenced(ctx context.Context, sha, key string) error {
	referenced, err := s.referenced(ctx, sha)
	if err != nil || referenced {
		// An unreferenced blob left behind is only space; a referenced
		// one deleted would break another community.
		return err
	}
	if err := s.store.Delete(ctx, key); err != nil {
		return fmt.Errorf("delete blob: %w", err)
	}
	return nil
}

// referenced reports whether any community still has a sidecar for sha.
// It costs one listing plus one stat per community with media, paid only
// by a delete that removes a community's last reference.
func (s *Service) referenced(ctx context.Context, sha string) (bool, error) {
	communities, err := CommunitiesWithMedia(ctx, s.store)
	if err != nil {
		return false, err
	}
	return BlobReferenced(ctx, s.store, sha, communities, uuid.Nil)
}

func (s *Service) readSidecar(ctx context.Context, community uuid.UUID, sha string) (Descriptor, error) {
	var d Descriptor
	if err := s.readJSON(ctx, sidecarKey(community, sha), &d); err != nil {
		return Descriptor{}, err
	}
	return d, nil
}

// maxRecordBytes bounds a sidecar or upload record read back.
const maxRecordBytes = 64 << 10

func (s *Service) readJSON(ctx context.Context, key string, v any) error {
	obj, _, err := s.store.Open(ctx, key)
	if err != nil {
		return err
	}
	defer obj.Close()
	raw, err := io.ReadAll(io.LimitReader(obj, maxRecordBytes))
	if err != nil {
		return err
	}
	if err := json.Unmarshal(raw, v); err != nil {
		return fmt.Errorf("%s: %w", key, err)
	}
	return nil
}

func (s *Service) putJSON(ctx context.Context, key string, v any) error {
	raw, err := json.Marshal(v)
	if err != nil {
		return err
	}
	return s.store.Put(ctx, key, bytes.NewReader(raw), int64(len(raw)), "application/json")
}

// bodyReader remembers the request body's own failure, so that a failed
// copy can blame the client's body rather than the spool it was written to.
type bodyReader struct {
	r   io.Reader
	err error
}

func (b *bodyReader) Read(p []byte) (int, error) {
	n, err := b.r.Read(p)
	if err != nil && err != io.EOF {
		b.err = err
	}
	return n, err
}

// failed classifies err, which ended reading or spooling the upload.
func (b *bodyReader) failed(err error) error {
	if b.err != nil {
		return fmt.Errorf("%w: %w", ErrBodyUnreadable, b.err)
	}
	return fmt.Errorf("%w: %w", ErrSpool, err)
}
