package eventstore

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/buzzrelay/buzz/internal/nostr"
)

func TestPageCapacity(t *testing.T) {
	t.Parallel()
	ids := nostr.Filter{IDs: []string{"a", "b"}}
	kinds := nostr.Filter{Kinds: []int{1}}
	filters := nostr.Filters{ids, kinds}
	require.Equal(t, 2, pageCapacity(filters, []pageBranch{{filter: 0, remaining: 500}}, 200), "a filter by ids matches at most its ids")
	require.Equal(t, 100, pageCapacity(filters, []pageBranch{{filter: 1, remaining: 100}}, 200))
	require.Equal(t, 200, pageCapacity(filters, []pageBranch{{filter: 1, remaining: 500}}, 200), "never more than a page")
	require.Equal(t, 52, pageCapacity(filters, []pageBranch{{filter: 0, remaining: 500}, {filter: 1, remaining: 50}}, 200))
	require.Equal(t, 1, pageCapacity(filters, []pageBranch{{filter: 0, remaining: 1}}, 200))
}
