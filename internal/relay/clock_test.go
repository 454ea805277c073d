package relay_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/buzzrelay/buzz/internal/clock"
	"github.com/buzzrelay/buzz/internal/dbtest"
	"github.com/buzzrelay/buzz/internal/nostr"
	"github.com/buzzrelay/buzz/internal/relay"
	"github.com/buzzrelay/buzz/internal/relaytest"
)

// The clock given to the relay reaches the write spine: a member removed
// through a relay whose clock runs 30 s ahead is dated by that clock, not by
// the database's. Mutation killed: the server not handing its clock to the
// pipeline.
func TestRelayHandsItsClockToTheWriteSpine(t *testing.T) {
	t.Parallel()
	at := time.Now().Add(30 * time.Second).Truncate(time.Second)
	r := relaytest.StartWith(t, dbtest.Pool(t), []relay.Option{relay.WithClock(clock.Stub(func() time.Time { return at }))})
	owner := r.Dial(t, "")
	owner.Auth(nil)
	member := relaytest.NewKey(t)
	ch := createChannel(t, owner, "clocked", true)
	require.True(t, owner.Publish(owner.Sign(9000, "", nostr.Tags{{"h", ch}, {"p", member.PublicKeyHex()}}, 0)).OK)
	require.True(t, owner.Publish(owner.Sign(9001, "", nostr.Tags{{"h", ch}, {"p", member.PublicKeyHex()}}, 0)).OK)

	var removedAt time.Time
	require.NoError(t, r.Pool.QueryRow(context.Background(),
		`SELECT removed_at FROM channel_members WHERE removed_at IS NOT NULL`).Scan(&removedAt))
	require.True(t, at.Equal(removedAt), "removed_at %v, want the relay clock's %v", removedAt, at)
}
