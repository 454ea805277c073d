package replica

import (
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"
)

// A removal mark is kept per channel and per community, and forgotten once
// older than Staleness (no proof that old routes a read), so a relay
// running for months keeps only the last half minute's channels.
// A replaceable version's mark is kept for the community apart.
// Mutation killed: never pruning (the old channel's mark stays).
func TestRemovalMarksArePerChannelAndForgottenAfterStaleness(t *testing.T) {
	t.Parallel()
	var m removals
	community, other := uuid.New(), uuid.New()
	a, b := uuid.New(), uuid.New()
	t0 := time.Unix(1_700_000_000, 0)
	m.note(community, &a, false, t0, Staleness)
	require.Equal(t, t0, m.last(community, &a))
	require.True(t, m.last(community, &b).IsZero(), "another channel has no mark")
	require.Equal(t, t0, m.last(community, nil), "a read not pinned to channels waits for any of the community's")
	require.True(t, m.last(other, nil).IsZero(), "nor does another community")
	m.note(community, nil, false, t0.Add(time.Second), Staleness) // channel-less rows
	require.Equal(t, t0, m.last(community, &a))
	require.Equal(t, t0.Add(time.Second), m.last(community, nil))
	require.True(t, m.lastReplacement(community).IsZero(), "a deletion is no replacement")
	m.note(community, &a, true, t0.Add(2*time.Second), Staleness) // a replaceable version
	require.Equal(t, t0.Add(2*time.Second), m.lastReplacement(community), "its replaced version may lie in any channel")
	require.True(t, m.last(community, &b).IsZero(), "another channel's own mark is unchanged")

	later := t0.Add(Staleness + 3*time.Second)
	m.note(other, &b, false, later, Staleness)
	require.True(t, m.last(community, &a).IsZero(), "forgotten after Staleness")
	require.True(t, m.last(community, nil).IsZero())
	require.Len(t, m.channels, 1)
	require.Len(t, m.communities, 1)
	require.True(t, m.lastReplacement(community).IsZero())
}
