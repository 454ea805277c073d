package relay_test

import (
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/buzzrelay/buzz/internal/clock"
	"github.com/buzzrelay/buzz/internal/dbtest"
	"github.com/buzzrelay/buzz/internal/nostr"
	"github.com/buzzrelay/buzz/internal/relay"
	"github.com/buzzrelay/buzz/internal/relaytest"
)

// The purge deletes the rows of expired events (NIP-40) and counts them,
// and leaves the rest: events not expired yet, events without an
// expiration. Mutations killed: a purge that deletes nothing (rows stay,
// metric 0); one that ignores expires_at (the unexpired rows go).
func TestPurgeDeletesExpiredRowsOnly(t *testing.T) {
	t.Parallel()
	var now atomic.Int64
	start := time.Now().Truncate(time.Second)
	now.Store(start.Unix())
	stub := clock.Stub(func() time.Time { return time.Unix(now.Load(), 0) })
	r := relaytest.StartWith(t, dbtest.Pool(t), []relay.Option{relay.WithClock(stub)})
	c := r.Dial(t, "")
	c.Auth(nil)
	exp := func(d time.Duration) nostr.Tags {
		return nostr.Tags{{"expiration", strconv.FormatInt(start.Add(d).Unix(), 10)}}
	}
	hour := c.Sign(1, "an hour", exp(time.Hour), start.Unix())
	day := c.Sign(1, "a day", exp(24*time.Hour), start.Unix())
	forever := c.Sign(1, "forever", nil, start.Unix())
	for _, ev := range []*nostr.Event{hour, day, forever} {
		require.True(t, c.Publish(ev).OK)
	}
	stored := func() []string {
		rows, err := r.Pool.Query(t.Context(), `SELECT encode(id, 'hex') FROM events WHERE community_id = $1 AND kind = 1`, r.CommunityID)
		require.NoError(t, err)
		var ids []string
		for rows.Next() {
			var id string
			require.NoError(t, rows.Scan(&id))
			ids = append(ids, id)
		}
		require.NoError(t, rows.Err())
		return ids
	}

	require.Zero(t, r.Server.PurgeExpired(t.Context()))
	require.Len(t, stored(), 3)

	now.Store(start.Add(2 * time.Hour).Unix())
	require.EqualValues(t, 1, r.Server.PurgeExpired(t.Context()))
	require.ElementsMatch(t, []string{day.ID, forever.ID}, stored())
	require.Equal(t, 1.0, testutil.ToFloat64(r.Server.Metrics().EventsExpiredPurged))

	now.Store(start.Add(48 * time.Hour).Unix())
	require.EqualValues(t, 1, r.Server.PurgeExpired(t.Context()))
	require.Equal(t, []string{forever.ID}, stored())
	require.Equal(t, 2.0, testutil.ToFloat64(r.Server.Metrics().EventsExpiredPurged))
}
