package replica_test

import (
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/buzzrelay/buzz/internal/replica"
)

func TestRingOpensOnRecordAndClosesWhenStale(t *testing.T) {
	t.Parallel()
	r := replica.NewRing()
	now := time.Unix(1_700_000_000, 0)
	_, ok := r.Newest(now)
	require.False(t, ok, "a new ring is closed")
	require.True(t, replica.NewRing().Record(replica.Entry{Token: 0, Epoch: uuid.New()}), "a new ring takes any first token, 0 too")
	epoch := uuid.New()
	require.True(t, r.Record(replica.Entry{Token: 1, Epoch: epoch, CommittedAt: now}))
	_, ok = r.Newest(now.Add(replica.Staleness))
	require.True(t, ok, "the staleness boundary is inclusive")
	_, ok = r.Newest(now.Add(replica.Staleness + time.Millisecond))
	require.False(t, ok, "a stale newest entry reads closed")
	age, ok := r.HeartbeatAge(now.Add(time.Hour))
	require.True(t, ok, "the heartbeat age is reported however old")
	require.Equal(t, time.Hour, age)
}

func TestRingResolvesTheNewestEntryTheReaderReached(t *testing.T) {
	t.Parallel()
	r := replica.NewRing()
	epoch := uuid.New()
	for tok := int64(10); tok <= 14; tok += 2 { // 10, 12, 14
		require.True(t, r.Record(replica.Entry{Token: tok, Epoch: epoch}))
	}
	e, err := r.Resolve(13, epoch)
	require.NoError(t, err)
	require.EqualValues(t, 12, e.Token, "the greatest entry at or below the observed token")
	_, err = r.Resolve(9, epoch)
	require.ErrorIs(t, err, replica.ErrTokenBehind)
	_, err = r.Resolve(14, uuid.New())
	require.ErrorIs(t, err, replica.ErrEpochMismatch)
}

func TestRingEpochChangeResetsAndRegressionClears(t *testing.T) {
	t.Parallel()
	r := replica.NewRing()
	a, b := uuid.New(), uuid.New()
	require.True(t, r.Record(replica.Entry{Token: 5, Epoch: a}))
	require.True(t, r.Record(replica.Entry{Token: 6, Epoch: b}), "another epoch with a higher token is adopted")
	_, err := r.Resolve(5, a)
	require.ErrorIs(t, err, replica.ErrEpochMismatch)
	require.False(t, r.Record(replica.Entry{Token: 6, Epoch: b}), "the same token again is a regression")
	_, ok := r.Newest(time.Time{})
	require.False(t, ok, "a regression closes the ring")

	require.True(t, r.Record(replica.Entry{Token: 9, Epoch: b}))
	r.Clear() // a failed tick
	require.False(t, r.Record(replica.Entry{Token: 3, Epoch: b}), "a cleared ring still remembers the highest token")
	r.Adopt(replica.Entry{Token: 4, Epoch: b})
	require.False(t, r.Record(replica.Entry{Token: 2, Epoch: a}), "a lower token in another epoch (a backup from before a rotation) is a regression too")
}

func TestRingEvictsTheOldest(t *testing.T) {
	t.Parallel()
	r := replica.NewRing()
	epoch := uuid.New()
	for tok := int64(1); tok <= replica.RingCapacity+1; tok++ {
		require.True(t, r.Record(replica.Entry{Token: tok, Epoch: epoch}))
	}
	_, err := r.Resolve(1, epoch)
	require.ErrorIs(t, err, replica.ErrTokenBehind, "token 1 was evicted")
	e, err := r.Resolve(2, epoch)
	require.NoError(t, err)
	require.EqualValues(t, 2, e.Token)
}
