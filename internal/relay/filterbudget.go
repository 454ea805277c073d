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
			for _, v := range vals {
				n += tagValueWeight(v)
			}
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

// tagValueBytes is how many bytes of one #x value weigh as one value: a
// 64-hex id or pubkey, a hashtag or an a coordinate weighs one, a longer
// value one more for each further tagValueBytes. Counted by number alone,
// the budget let a connection hold 2,000 values of 1,024 bytes, over 2 MiB,
// where the budget is meant to keep it under 1 MB.
const tagValueBytes = 128

func tagValueWeight(v string) int {
	return max(1, (len(v)+tagValueBytes-1)/tagValueBytes)
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
