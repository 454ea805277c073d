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
	Q     *db.Queries
	Limit int64 // bytes one community may store
}

func (q CommunityQuota) Reserve(ctx context.Context, community uuid.UUID, size int64) error {
	n, err := q.Q.MediaUsageReserve(ctx, db.MediaUsageReserveParams{CommunityID: community, Size: size, Quota: q.Limit})
	if err != nil {
		// The community's deletion may have fenced it since the upload
		// began: dberr.ErrNotInPrerequisiteState.
		return dberr.Interpret(err)
	}
	if n == 1 {
		return nil
	}
	used, err := q.Q.MediaUsageGet(ctx, community)
	if err != nil && !dberr.IsNotFound(err) {
		return err
	}
	return fmt.Errorf("%w: it stores %d of its %d bytes and this blob is %d; delete blobs to make room",
		ErrQuotaExceeded, used, q.Limit, size)
}

func (q CommunityQuota) Release(ctx context.Context, community uuid.UUID, size int64) error {
	return dberr.Interpret(q.Q.MediaUsageRelease(ctx, db.MediaUsageReleaseParams{CommunityID: community, Size: size}))
}
