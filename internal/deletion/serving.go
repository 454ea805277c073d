package deletion

import (
	"context"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/buzzrelay/buzz/internal/db"
	"github.com/buzzrelay/buzz/internal/dberr"
)

// Serving-write lease timing: a lease lives a minute and is renewed every
// ten seconds while its operation runs.
const (
	servingLeaseDuration = 60 * time.Second
	servingLeaseRenew    = 10 * time.Second
)

// ServingLease is a serving process's proof that an operation with effects
// outside the database (an object upload, say) is in flight for a
// community. It is granted only while the community is active; a deletion
// fences the community only once no lease is live.
type ServingLease struct {
	id     uuid.UUID
	pool   *pgxpool.Pool
	cancel context.CancelFunc
	done   chan struct{}
}

// AcquireServingLease takes a lease for operation on community and keeps
// it renewed until Release. The returned context ends if a renewal fails
// (the operation must then stop). A community that is being deleted
// refuses: the error wraps dberr.ErrCommunityWriteFenced.
func AcquireServingLease(ctx context.Context, pool *pgxpool.Pool, community uuid.UUID, operation string) (*ServingLease, context.Context, error) {
	id, err := db.New(pool).ServingLeaseAcquire(ctx, db.ServingLeaseAcquireParams{CommunityID: community, Operation: operation,
		Owner: DefaultExecutorID(), LeaseSeconds: servingLeaseDuration.Seconds()})
	if err != nil {
		return nil, ctx, dberr.Interpret(err)
	}
	opCtx, cancel := context.WithCancel(ctx)
	l := &ServingLease{id: id, pool: pool, cancel: cancel, done: make(chan struct{})}
	opCtx = context.WithValue(opCtx, leaseKey{}, l)
	go func() {
		defer close(l.done)
		t := time.NewTicker(servingLeaseRenew)
		defer t.Stop()
		for {
			select {
			case <-opCtx.Done():
				return
			case <-t.C:
			}
			ok, err := db.New(pool).ServingLeaseRenew(opCtx, db.ServingLeaseRenewParams{ID: id, LeaseSeconds: servingLeaseDuration.Seconds()})
			if err != nil || !ok {
				cancel()
				return
			}
		}
	}()
	return l, opCtx, nil
}

type leaseKey struct{}

// UnderLease runs fn in one transaction on pool. When ctx is an operation's
// context from AcquireServingLease, the transaction first presents the
// lease (community_serving_write_leases_guard), so its writes pass the
// community's fence while the community quiesces: an operation admitted
// before a deletion began may finish its database writes, and the
// deletion's fence waits for it. Without a lease, the writes are fenced as
// any other.
func UnderLease(ctx context.Context, pool *pgxpool.Pool, fn func(q *db.Queries) error) error {
	return dberr.Interpret(pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		q := db.New(tx)
		if l, ok := ctx.Value(leaseKey{}).(*ServingLease); ok {
			if err := q.ServingLeaseGuard(ctx, l.id); err != nil {
				return err
			}
		}
		return fn(q)
	}))
}

// Release stops renewing and deletes the lease.
func (l *ServingLease) Release(ctx context.Context) {
	l.cancel()
	<-l.done
	_, _ = db.New(l.pool).ServingLeaseRelease(context.WithoutCancel(ctx), l.id)
}
