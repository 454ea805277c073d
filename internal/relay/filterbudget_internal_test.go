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

// A long #x value weighs one value per started 128 bytes: counted by number
// alone, 2,000 values of 1,024 bytes pinned over 2 MiB on one connection.
// Mutation killed: weighing every tag value as one (the 1,024-byte value
// weighs 1, not 8).
func TestFilterValuesWeighLongTagValuesByTheirSize(t *testing.T) {
	t.Parallel()
	require.Equal(t, 1, filterValues(nostr.Filters{{Tags: map[string][]string{"t": {""}}}}))
	require.Equal(t, 1, filterValues(nostr.Filters{{Tags: map[string][]string{"a": {strings.Repeat("x", 128)}}}}))
	require.Equal(t, 2, filterValues(nostr.Filters{{Tags: map[string][]string{"a": {strings.Repeat("x", 129)}}}}))
	require.Equal(t, 9, filterValues(nostr.Filters{{Tags: map[string][]string{"t": {strings.Repeat("x", 1024), "short"}}}}))
}
