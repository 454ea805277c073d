package media

import (
	"context"
	"errors"
	"fmt"

	"github.com/google/uuid"

	"github.com/buzzrelay/buzz/internal/db"
	"github.com/buzzrelay/buzz/internal/dberr"
)

// ErrQuotaExceeded: storing the blob would take its community past its
// media quota.
var ErrQuotaExceeded = errors.New("the community's media storage is full")

// ObjectCharge is what the quota counts for each object an upload writes
// (its upload record, its community's sidecar), and the unit a blob's
// size is rounded up to: a file takes at least a block of disk (and an
// inode), an S3 object a request and its metadata, however few its bytes.
// Counted by bytes alone, keys that cost nothing wrote upload records of
// one blob without end, and blobs of a few bytes counted a few bytes for
// three files each: a community could fill the store within any quota.
const ObjectCharge = 4096

// BlobCharge is what a community's sidecar of a blob of size bytes
// counts: the blob's bytes in whole ObjectCharge units, plus the sidecar.
func BlobCharge(size int64) int64 {
	return (size+ObjectCharge-1)/ObjectCharge*ObjectCharge + ObjectCharge
}

// Quota counts what each community stores. A blob counts once per
// community that references it (BlobCharge), from that community's first
// upload of it to the deletion of its last reference there; each upload
// record counts ObjectCharge while it exists.
type Quota interface {
	// Reserve adds size to community's bytes, or returns ErrQuotaExceeded
	// and changes nothing.
	Reserve(ctx context.Context, community uuid.UUID, size int64) error
	// Release gives size back.
	Release(ctx context.Context, community uuid.UUID, size int64) error
}

// CommunityQuota keeps the counts in PostgreSQL (media_usage), so every
// relay process sharing the database shares them: a reservation is one
// conditional upsert, exact under concurrent uploads anywhere.
type CommunityQuota struct {
	Limit int64 // bytes one community may store
	// Run runs the statements in a transaction: the relay's runs them under
	// the operation's serving-write lease (deletion.UnderLease), whose
	// guard lets them through the fence of a community whose deletion
	// began after the upload was admitted.
	Run func(ctx context.Context, fn func(q *db.Queries) error) error
}

func (q CommunityQuota) Reserve(ctx context.Context, community uuid.UUID, size int64) error {
	var reserved, used int64
	err := q.Run(ctx, func(dbq *db.Queries) error {
		var err error
		if reserved, err = dbq.MediaUsageReserve(ctx, db.MediaUsageReserveParams{CommunityID: community, Size: size, Quota: q.Limit}); err != nil || reserved == 1 {
			return err
		}
		if used, err = dbq.MediaUsageGet(ctx, community); dberr.IsNotFound(err) {
			err = nil
		}
		return err
	})
	if err != nil || reserved == 1 {
		// A fence (the community's deletion) is dberr.ErrCommunityWriteFenced.
		return dberr.Interpret(err)
	}
	return fmt.Errorf("%w: it stores %d of its %d bytes and this upload counts %d; delete blobs to make room",
		ErrQuotaExceeded, used, q.Limit, size)
}

func (q CommunityQuota) Release(ctx context.Context, community uuid.UUID, size int64) error {
	return dberr.Interpret(q.Run(ctx, func(dbq *db.Queries) error {
		return dbq.MediaUsageRelease(ctx, db.MediaUsageReleaseParams{CommunityID: community, Size: size})
	}))
}
