package relay

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sync/semaphore"

	"github.com/buzzrelay/buzz/internal/community"
)

// hostLookupBudget bounds one host lookup, its wait for a read slot
// included: a lookup is one indexed row, so this is only reached when
// every slot stays busy (a statement of a REQ holds one for at most
// BUZZ_QUERY_TIMEOUT, 10 s by default). Not that setting itself: a relay
// whose queries may take a millisecond must still resolve its hosts.
const hostLookupBudget = 10 * time.Second

// errHostLookupBusy: every read slot stayed taken for the query budget, so
// the request's Host was not looked up.
var errHostLookupBusy = errors.New("relay: every read slot stayed busy for the host lookup")

// hostLookups finds the community of each HTTP request's Host, which every
// route does first, before any authentication and under no per-client
// cap: anyone may send them, as fast as the relay answers. So a lookup
// takes one of the read slots, like the statements of a REQ, and never one
// of the connections kept for the writers; and lookups of one host share
// their statement: while one runs, the requests that arrive wait for the
// next, which starts when it ends and answers them all. Each answer is
// therefore read after its request arrived (a community archived before
// the request is never served from an older answer), and a flood naming
// one host costs one statement at a time, not one per request.
type hostLookups struct {
	resolve func(ctx context.Context, host string) (community.Tenant, error)
	slots   *semaphore.Weighted
	budget  time.Duration // for the slot and the statement together

	mu     sync.Mutex
	hosts  map[string]*hostLookupState // hosts with a lookup running
	joined atomic.Int64                // requests answered by a lookup shared with others
}

type hostLookupState struct {
	next *hostLookup // the lookup the requests since the running one wait for
}

type hostLookup struct {
	done   chan struct{}
	tenant community.Tenant
	err    error
}

func newHostLookups(resolve func(context.Context, string) (community.Tenant, error), slots *semaphore.Weighted, budget time.Duration) *hostLookups {
	return &hostLookups{resolve: resolve, slots: slots, budget: budget, hosts: map[string]*hostLookupState{}}
}

// Resolve returns the serving community of rawHost, or
// community.ErrUnknownHost, errHostLookupBusy or the database's error.
func (l *hostLookups) Resolve(ctx context.Context, rawHost string) (community.Tenant, error) {
	host := community.NormalizeHost(rawHost)
	if host == "" {
		return community.Tenant{}, community.ErrUnknownHost
	}
	l.mu.Lock()
	state, running := l.hosts[host]
	if !running {
		l.hosts[host] = &hostLookupState{}
		l.mu.Unlock()
		// Nobody else waits for this one: it runs on the request's context.
		lookup := &hostLookup{done: make(chan struct{})}
		l.run(ctx, host, lookup)
		return lookup.tenant, lookup.err
	}
	lookup := state.next
	if lookup == nil {
		lookup = &hostLookup{done: make(chan struct{})}
		state.next = lookup
	}
	l.mu.Unlock()
	l.joined.Add(1)
	select {
	case <-lookup.done:
		return lookup.tenant, lookup.err
	case <-ctx.Done():
		return community.Tenant{}, ctx.Err()
	}
}

// run answers lookup, then starts the host's next lookup if requests wait
// for one; it is shared, so it runs on a context of its own.
func (l *hostLookups) run(ctx context.Context, host string, lookup *hostLookup) {
	lookup.tenant, lookup.err = l.lookup(ctx, host)
	close(lookup.done)
	l.mu.Lock()
	state := l.hosts[host]
	next := state.next
	state.next = nil
	if next == nil {
		delete(l.hosts, host)
	}
	l.mu.Unlock()
	if next != nil {
		go l.run(context.Background(), host, next)
	}
}

func (l *hostLookups) lookup(ctx context.Context, host string) (community.Tenant, error) {
	ctx, cancel := context.WithTimeout(ctx, l.budget)
	defer cancel()
	if err := l.slots.Acquire(ctx, 1); err != nil {
		if errors.Is(context.Cause(ctx), context.DeadlineExceeded) {
			return community.Tenant{}, errHostLookupBusy
		}
		return community.Tenant{}, err
	}
	defer l.slots.Release(1)
	return l.resolve(ctx, host)
}
