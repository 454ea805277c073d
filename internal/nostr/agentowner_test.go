package nostr

import (
	"errors"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// agent_owner is one pubkey or null; every other value is refused with an
// error naming the field (and, in a list, the filter), never dropped.
// Mutation killed: accepting a malformed value as "no owner" (or skipping
// the key) makes the refusals pass through.
func TestAgentOwnerFilterParsing(t *testing.T) {
	t.Parallel()
	var f Filter
	require.NoError(t, f.UnmarshalJSON([]byte(`{"kinds":[0],"agent_owner":"`+hexA+`"}`)))
	require.Equal(t, Filter{Kinds: []int{0}, AgentOwner: hexA}, f)
	raw, err := f.MarshalJSON()
	require.NoError(t, err)
	require.Equal(t, `{"kinds":[0],"agent_owner":"`+hexA+`"}`, string(raw))

	f = Filter{}
	require.NoError(t, f.UnmarshalJSON([]byte(`{"agent_owner": null}`)))
	require.Equal(t, Filter{}, f, "null is no owner constraint")

	for _, bad := range []string{
		`"` + strings.ToUpper(hexA) + `"`, `"` + hexA[:63] + `"`, `"` + hexA + `0"`, `""`, `"me"`,
		`["` + hexA + `"]`, `1`, `true`, `{}`, `"npub1qqqq"`,
	} {
		var g Filter
		err := g.UnmarshalJSON([]byte(`{"agent_owner":` + bad + `}`))
		require.Error(t, err, bad)
		var fe *FilterFieldError
		require.True(t, errors.As(err, &fe), "%s: %v", bad, err)
		require.Equal(t, "agent_owner", fe.Field)
		require.Equal(t, -1, fe.Filter)
		require.True(t, strings.HasPrefix(err.Error(), "agent_owner must be a 64-char lowercase hex pubkey"), err.Error())
	}
	require.ErrorContains(t, f.UnmarshalJSON([]byte(`{"agent_owner":null,"agent_owner":"`+hexA+`"}`)), `duplicate filter field "agent_owner"`)

	// In a list, the error names the filter's position.
	_, err = ParseFilters([]byte(`[{"kinds":[0]},{"agent_owner":"nope"}]`), Limits{})
	var fe *FilterFieldError
	require.True(t, errors.As(err, &fe), "%v", err)
	require.Equal(t, 1, fe.Filter)
	require.Equal(t, "filter 1: agent_owner must be a 64-char lowercase hex pubkey (or null for no owner constraint)", err.Error())

	_, err = ParseClientMessage([]byte(`["REQ","s",{"agent_owner":"ABC"}]`), DefaultLimits())
	var pe *ParseError
	require.True(t, errors.As(err, &pe))
	require.Equal(t, "s", pe.SubID)
	require.Equal(t, "filter 0: agent_owner must be a 64-char lowercase hex pubkey (or null for no owner constraint)", pe.Msg)
}

// The owner weighs one value against MaxFilterValues, like an author.
// Mutation killed: not counting it lets a filter one value over the limit in.
func TestAgentOwnerCountsAsAFilterValue(t *testing.T) {
	t.Parallel()
	lim := Limits{MaxFilterValues: 2}
	_, err := ParseFilters([]byte(`[{"authors":["`+hexA+`"],"agent_owner":"`+hexB+`"}]`), lim)
	require.NoError(t, err)
	_, err = ParseFilters([]byte(`[{"authors":["`+hexA+`","`+hexC+`"],"agent_owner":"`+hexB+`"}]`), lim)
	require.ErrorContains(t, err, "too many values in filter (max 2)")
	_, err = ParseFilters([]byte(`[{"authors":["`+hexA+`","`+hexC+`"],"agent_owner":null}]`), lim)
	require.NoError(t, err, "null holds no value")
}

// An in-memory match cannot know who owns the author, so a filter with an
// owner matches nothing rather than everything the rest of it allows.
// Mutation killed: dropping the AgentOwner check in Matches.
func TestAgentOwnerNeverMatchesInMemory(t *testing.T) {
	t.Parallel()
	ev := &Event{PubKey: hexA, Kind: 0}
	require.True(t, (&Filter{Kinds: []int{0}}).Matches(ev))
	require.False(t, (&Filter{Kinds: []int{0}, AgentOwner: hexB}).Matches(ev))
	require.False(t, Filters{{AgentOwner: hexB}}.Matches(ev))
}
