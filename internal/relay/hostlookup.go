package relay

import (
	"context"
	"sync"
	"sync/atomic"

	"github.com/buzzrelay/buzz/internal/community"
	"github.com/buzzrelay/buzz/internal/eventstore"
)

// hostLookups finds the community of each HTTP request's Host, which every
// route does first (a request its address may not make now is refused
// even before: a WebSocket upgrade past the address's bounds, a bridge
// request or webhook call past its places), before any authentication and
// under no per-client cap: anyone may send them, as fast as the relay
// answers, and upgrades from one address that race each other may all be
// looked up before admit refuses all but what its bounds allow. So a lookup
// takes one of the read slots, like the statements of a REQ, and never one
// of the connections kept for the writers; and lookups of one host share
// their statement: while one runs, the requests that arrive wait for the
// next, which starts when it ends and answers them all. Each answer is
// therefore read after its request arrived (a community archived before
// the request is never served from an older answer), and a flood naming
// one host costs one statement at a time, not one per request.
type hostLookups struct {
	resolve func(ctx context.Context, host string) (community.Tenant, error)
	slots   *eventstore.ReadSlots

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

func newHostLookups(resolve func(context.Context, string) (community.Tenant, error), slots *eventstore.ReadSlots) *hostLookups {
	return &hostLookups{resolve: resolve, slots: slots, hosts: map[string]*hostLookupState{}}
}

// Resolve returns the serving community of rawHost, or
// community.ErrUnknownHost, errReadSlotsBusy or the database's error.
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
		go func() {
			// No request's context: bounded like a statement instead.
			ctx, cancel := context.WithTimeout(context.Background(), 2*readSlotWait)
			defer cancel()
			l.run(ctx, host, next)
		}()
	}
}

func (l *hostLookups) lookup(ctx context.Context, host string) (community.Tenant, error) {
	// Not the request's address's share of the slots: other addresses'
	// requests for the host wait for this lookup to end.
	release, err := takeReadSlot(eventstore.WithClient(ctx, ""), l.slots)
	if err != nil {
		return community.Tenant{}, err
	}
	defer release()
	return l.resolve(ctx, host)
}
