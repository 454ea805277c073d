package deletion

import (
	"context"
	"errors"
	"fmt"
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
	cancel context.CancelCauseFunc
	done   chan struct{}
}

// ErrServingLeaseLapsed: the operation's serving-write lease is no longer
// live (a renewal failed or found it expired, or the community's deletion
// fenced it): the operation must not make its effects visible. It is the
// cause of the operation's context once a renewal failed.
var ErrServingLeaseLapsed = errors.New("the serving-write lease lapsed")

// commitMargin is how long an operation may take to commit its effects
// after ConfirmServingLease renewed its lease: well inside the lease, so the deletion's
// fence, which waits for the lease to expire, cannot pass meanwhile.
const commitMargin = servingLeaseDuration / 2

// confirmTimeout bounds the renewal that confirms a lease before a commit;
// one that takes longer is taken for a lapse.
const confirmTimeout = servingLeaseRenew

// AcquireServingLease takes a lease for operation on community and keeps
// it renewed until Release. The returned context ends if a renewal fails
// (the operation must then stop; its cause is ErrServingLeaseLapsed). A
// renewal that hangs does not end it: an operation confirms its lease
// before it commits (ConfirmServingLease). A community that is being deleted
// refuses: the error wraps dberr.ErrCommunityWriteFenced.
func AcquireServingLease(ctx context.Context, pool *pgxpool.Pool, community uuid.UUID, operation string) (*ServingLease, context.Context, error) {
	id, err := db.New(pool).ServingLeaseAcquire(ctx, db.ServingLeaseAcquireParams{CommunityID: community, Operation: operation,
		Owner: DefaultExecutorID(), LeaseSeconds: servingLeaseDuration.Seconds()})
	if err != nil {
		return nil, ctx, dberr.Interpret(err)
	}
	opCtx, cancel := context.WithCancelCause(ctx)
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
				cancel(ErrServingLeaseLapsed)
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
		if l, ok := ctx.Value(leaseKey{}).(*ServingLease); ok && l != nil {
			if err := q.ServingLeaseGuard(ctx, l.id); err != nil {
				return err
			}
		}
		return fn(q)
	}))
}

// ConfirmServingLease renews the lease of the operation whose context is
// ctx right before the operation commits effects outside the database (an
// upload's sidecar), and returns the context to commit them under: it ends
// well before the renewed lease could expire. A renewal in the background
// may hang (a row lock, a pool with no free connection) while the lease
// expires and the community's deletion fences and lists its objects; an
// operation that went on writing then would leave objects the deletion
// never saw. The error is ErrServingLeaseLapsed when the lease is no
// longer live or could not be renewed within confirmTimeout. A context
// without a lease is returned as it is.
func ConfirmServingLease(ctx context.Context) (context.Context, context.CancelFunc, error) {
	l, ok := ctx.Value(leaseKey{}).(*ServingLease)
	if !ok || l == nil {
		return ctx, func() {}, nil
	}
	// Bounded: the caller holds the blob lock meanwhile, and its client
	// waits for an answer the HTTP write timeout (30 s) may cut off.
	renewCtx, cancelRenew := context.WithTimeout(ctx, confirmTimeout)
	renewed, err := db.New(l.pool).ServingLeaseRenew(renewCtx, db.ServingLeaseRenewParams{ID: l.id, LeaseSeconds: servingLeaseDuration.Seconds()})
	cancelRenew()
	if cause := context.Cause(ctx); errors.Is(cause, ErrServingLeaseLapsed) {
		return nil, nil, cause
	}
	if err != nil {
		// Not confirmed, whether the renewal timed out or failed: the lease
		// may be expiring under the operation.
		l.cancel(ErrServingLeaseLapsed)
		return nil, nil, fmt.Errorf("%w: its renewal did not get through within %s: %w", ErrServingLeaseLapsed, confirmTimeout, dberr.Interpret(err))
	}
	if !renewed {
		l.cancel(ErrServingLeaseLapsed)
		return nil, nil, ErrServingLeaseLapsed
	}
	commitCtx, cancel := context.WithTimeout(ctx, commitMargin)
	return commitCtx, cancel, nil
}

// WithoutServingLease is ctx without its operation's lease: statements run
// under it are fenced as any other (deletion.UnderLease does not present
// the lease). For a statement that must run even once the lease lapsed,
// such as giving back a quota reservation.
func WithoutServingLease(ctx context.Context) context.Context {
	return context.WithValue(ctx, leaseKey{}, (*ServingLease)(nil))
}

// releaseTimeout bounds deleting a lease: the operation's answer waits for
// it, and a lease left behind only holds a deletion's fence off until it
// expires (then the reaper deletes it).
const releaseTimeout = 5 * time.Second

// Release stops renewing and deletes the lease.
func (l *ServingLease) Release(ctx context.Context) {
	l.cancel(context.Canceled)
	<-l.done
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), releaseTimeout)
	defer cancel()
	_, _ = db.New(l.pool).ServingLeaseRelease(ctx, l.id)
}
