package eventstore

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// One client holds at most its share of the slots, another client still
// gets one, a statement naming no client counts against All only, and an
// address is forgotten once nobody holds or waits for its share (a
// long-lived relay keeps only the addresses reading now).
// Mutations killed: the share not taken (the third slot of one client is
// granted); an address kept at zero (the map is not empty at the end).
func TestReadSlotsShareOfOneClient(t *testing.T) {
	t.Parallel()
	slots := NewReadSlots(4)
	require.Equal(t, 2, ClientShare(4))
	require.Equal(t, 1, ClientShare(1))
	a := WithClient(context.Background(), "192.0.2.1")
	var releases []func()
	for range 2 {
		release, err := slots.Acquire(a)
		require.NoError(t, err)
		releases = append(releases, release)
	}
	waiting, cancel := context.WithTimeout(a, 20*time.Millisecond)
	_, err := slots.Acquire(waiting)
	cancel()
	require.ErrorIs(t, err, context.DeadlineExceeded, "a third slot for one client")

	release, err := slots.Acquire(WithClient(context.Background(), "192.0.2.2"))
	require.NoError(t, err, "another client")
	releases = append(releases, release)
	release, err = slots.Acquire(context.Background())
	require.NoError(t, err, "no client")
	releases = append(releases, release)
	for _, release := range releases {
		release()
	}
	slots.mu.Lock()
	defer slots.mu.Unlock()
	require.Empty(t, slots.clients)
}
