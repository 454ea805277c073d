package relay

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/buzzrelay/buzz/internal/nostr"
)

// Every value a filter holds weighs on the connection budget, an owner
// constraint and a search term one each. Mutation killed: leaving
// agent_owner out of the weight.
func TestFilterValuesCountsEveryValue(t *testing.T) {
	t.Parallel()
	pk := strings.Repeat("ab", 32)
	require.Equal(t, 0, filterValues(nostr.Filters{{}}))
	require.Equal(t, 6, filterValues(nostr.Filters{
		{Authors: []string{pk}, Kinds: []int{0, 1}, AgentOwner: pk},
		{Tags: map[string][]string{"t": {"x"}}, Search: "honey"},
	}))
}
