package presence_test

import (
	"context"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/buzzrelay/buzz/internal/nostr"
	"github.com/buzzrelay/buzz/internal/presence"
)

// The in-process store holds at most its bound: a new pubkey past it is
// not kept unless an expired announcement can be swept to make room, and
// re-announcing an already held pubkey always fits.
// Mutations killed: no bound (the third pubkey is kept); no sweep (the
// pubkey after expiry is refused).
func TestMemoryIsBounded(t *testing.T) {
	t.Parallel()
	m := presence.NewMemory(time.Minute, 2)
	community, channel := uuid.New(), uuid.New()
	now := time.Unix(1_000_000, 0)
	announce := func(pubkey string, at time.Time) {
		m.Remember(community, channel, &nostr.Event{ID: pubkey + "@" + at.String(), PubKey: pubkey, Kind: presence.Kind, CreatedAt: at.Unix()}, at)
	}
	announce("a", now)
	announce("b", now)
	announce("c", now)
	require.Len(t, m.Current(context.Background(), community, channel, now), 2, "the third pubkey is past the bound")
	announce("a", now.Add(time.Second))
	require.Len(t, m.Current(context.Background(), community, channel, now.Add(time.Second)), 2, "re-announcing fits")

	later := now.Add(time.Minute + 30*time.Second) // b expired, a (re-announced) too
	announce("c", later)
	got := m.Current(context.Background(), community, channel, later)
	require.Len(t, got, 1)
	require.Equal(t, "c", got[0].PubKey, "expired announcements were swept to make room")
}
