package media

import (
	"context"
	"sync"
)

// blobRemovalsInFlight bounds the blob removals running after deletes'
// answers in one process. Each holds a connection of the relay's pool and
// one of its read slots (the blob lock's) while it lists the communities
// and removes the blob: a few, so that events are still read meanwhile.
const blobRemovalsInFlight = 4

// blobRemovals runs work after a delete's answer: at most
// blobRemovalsInFlight at once, each on a context of its own that only
// wait abandons (the client's hang-up does not end it), bounded by
// abandonedBlobTimeout.
type blobRemovals struct {
	slots chan struct{}

	mu       sync.Mutex
	inFlight int
	waiting  int           // for a place
	settled  chan struct{} // closed and replaced whenever one ends
	ctx      context.Context
	abandon  context.CancelFunc
}

func newBlobRemovals() *blobRemovals {
	ctx, abandon := context.WithCancel(context.Background())
	return &blobRemovals{slots: make(chan struct{}, blobRemovalsInFlight), settled: make(chan struct{}), ctx: ctx, abandon: abandon}
}

// start runs fn in the background. With every place taken it first waits
// for one, whatever the client does meanwhile (left undone, the blob would
// stay in the store uncounted), so the request's answer waits on other
// removals, never on its own.
func (b *blobRemovals) start(fn func(ctx context.Context)) {
	b.mu.Lock()
	b.waiting++
	b.mu.Unlock()
	b.slots <- struct{}{}
	b.mu.Lock()
	b.waiting--
	b.inFlight++
	ctx, cancel := context.WithTimeout(b.ctx, abandonedBlobTimeout)
	b.mu.Unlock()
	go func() {
		defer func() {
			cancel()
			<-b.slots
			b.mu.Lock()
			b.inFlight--
			close(b.settled)
			b.settled = make(chan struct{})
			b.mu.Unlock()
		}()
		fn(ctx)
	}()
}

// wait returns once no removal runs or waits for a place, or abandons
// those running when ctx ends first (later ones start afresh). One waiting
// counts: a place a removal frees is taken by the one waiting before the
// first is counted out, so running ones alone could read 0 just then.
func (b *blobRemovals) wait(ctx context.Context) error {
	for {
		b.mu.Lock()
		n, settled := b.inFlight+b.waiting, b.settled
		b.mu.Unlock()
		if n == 0 {
			return nil
		}
		select {
		case <-settled:
		case <-ctx.Done():
			b.mu.Lock()
			b.abandon()
			b.ctx, b.abandon = context.WithCancel(context.Background())
			b.mu.Unlock()
			return ctx.Err()
		}
	}
}
