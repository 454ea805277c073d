package relay_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/buzzrelay/buzz/internal/outbox"
	"github.com/buzzrelay/buzz/internal/relaytest"
)

// A relay process that starts (a restart, a new pod) while the deployment's
// own community is being deleted (`deletions submit` targets it by
// default) still starts its listener delivery, which signs with that
// community's relay key: the key is read, not rewritten. Before, reading it
// was an UPDATE, which the community's lifecycle guard refuses from
// quiescing on, and serve failed at start-up for every community it serves.
// Mutation killed: relayKey calling CommunitySigningKeyEnsure without
// reading the key first.
func TestListenersStartWhileTheHomeCommunityIsBeingDeleted(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	home := relaytest.Start(t)
	cfg := outbox.Config{
		Listeners: outbox.Routes{relaytest.NewKey(t).PublicKeyHex(): "https://listener.example/wake"},
		Timeout:   time.Second,
	}
	// The home community's key exists once the relay has signed anything.
	require.NoError(t, home.Server.StartOperatorListeners(ctx, cfg, home.CommunityID))
	quiesceCommunity(t, home.Pool, home.Host)

	restarted := relaytest.StartOn(t, home.Pool)
	require.NoError(t, restarted.Server.StartOperatorListeners(ctx, cfg, home.CommunityID))
}
