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

// Quota counts the bytes each community stores. A blob counts once per
// community that references it, from that community's first upload of it
// to the deletion of its last reference there.
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
	return fmt.Errorf("%w: it stores %d of its %d bytes and this blob is %d; delete blobs to make room",
		ErrQuotaExceeded, used, q.Limit, size)
}

func (q CommunityQuota) Release(ctx context.Context, community uuid.UUID, size int64) error {
	return dberr.Interpret(q.Run(ctx, func(dbq *db.Queries) error {
		return dbq.MediaUsageRelease(ctx, db.MediaUsageReleaseParams{CommunityID: community, Size: size})
	}))
}
