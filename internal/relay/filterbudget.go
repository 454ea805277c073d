package relay

import "github.com/buzzrelay/buzz/internal/nostr"

// filterValues is what a subscription's filters weigh against the
// per-connection budget: every id, author, kind and tag value it holds (and
// a search term and an agent_owner count as one). The live index keeps all of them for as long
// as the subscription is open.
func filterValues(filters nostr.Filters) int {
	n := 0
	for i := range filters {
		f := &filters[i]
		n += len(f.IDs) + len(f.Authors) + len(f.Kinds)
		for _, vals := range f.Tags {
			n += len(vals)
		}
		if f.Search != "" {
			n++
		}
		if f.AgentOwner != "" {
			n++
		}
	}
	return n
}

// heldFilterValues sums the values of this connection's open subscriptions,
// except the one named except (which a REQ with its id replaces).
func (c *conn) heldFilterValues(except string) int {
	n := 0
	for id, v := range c.subs {
		if id != except {
			n += v
		}
	}
	return n
}
