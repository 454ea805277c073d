package eventstore

import (
	"context"
	"sync"

	"golang.org/x/sync/semaphore"
)

// ReadSlots bounds the read statements that run on the writer pool at once
// (All), and the share of them one client address may hold (ClientShare):
// a connection runs one statement at a time, but one address may hold
// dozens of connections, and without a share it could keep every slot busy
// while other clients' reads waited out their budget. A statement whose
// context names no client (WithClient) counts against All only.
type ReadSlots struct {
	all   *semaphore.Weighted
	share int64

	mu      sync.Mutex
	clients map[string]*clientSlots
}

// clientSlots is one address's share; forgotten when nobody holds or waits
// for it, so a long-lived relay keeps only the addresses reading now.
type clientSlots struct {
	share *semaphore.Weighted
	users int
}

// NewReadSlots returns n slots, of which one client address may hold at
// most ClientShare(n).
func NewReadSlots(n int) *ReadSlots {
	n = max(n, 1)
	return &ReadSlots{all: semaphore.NewWeighted(int64(n)), share: int64(ClientShare(n)), clients: map[string]*clientSlots{}}
}

// ClientShare is how many of n read slots one client address may hold at
// once: half, at least one, so that while one address holds its share a
// reader at any other address still finds a slot.
func ClientShare(n int) int { return max(1, n/2) }

// Share is how many slots one client address may hold at once.
func (r *ReadSlots) Share() int { return int(r.share) }

// All is the semaphore every slot is taken from (for tests that hold
// slots as statements stuck in the database would).
func (r *ReadSlots) All() *semaphore.Weighted { return r.all }

type clientKey struct{}

// WithClient marks ctx's read statements as client's (an address bucket):
// they wait for a slot of client's share before one of All.
func WithClient(ctx context.Context, client string) context.Context {
	return context.WithValue(ctx, clientKey{}, client)
}

// Acquire waits for a slot until ctx ends (its error then); release gives
// it back.
func (r *ReadSlots) Acquire(ctx context.Context) (release func(), err error) {
	client, _ := ctx.Value(clientKey{}).(string)
	if client == "" {
		if err := r.all.Acquire(ctx, 1); err != nil {
			return nil, err
		}
		return func() { r.all.Release(1) }, nil
	}
	cs := r.join(client)
	if err := cs.share.Acquire(ctx, 1); err != nil {
		r.leave(client, cs)
		return nil, err
	}
	if err := r.all.Acquire(ctx, 1); err != nil {
		cs.share.Release(1)
		r.leave(client, cs)
		return nil, err
	}
	return func() {
		r.all.Release(1)
		cs.share.Release(1)
		r.leave(client, cs)
	}, nil
}

func (r *ReadSlots) join(client string) *clientSlots {
	r.mu.Lock()
	defer r.mu.Unlock()
	cs := r.clients[client]
	if cs == nil {
		cs = &clientSlots{share: semaphore.NewWeighted(r.share)}
		r.clients[client] = cs
	}
	cs.users++
	return cs
}

func (r *ReadSlots) leave(client string, cs *clientSlots) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if cs.users--; cs.users == 0 {
		delete(r.clients, client)
	}
}
