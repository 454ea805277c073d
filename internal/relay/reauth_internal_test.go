package relay

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/buzzrelay/buzz/internal/community"
	"github.com/buzzrelay/buzz/internal/db"
	"github.com/buzzrelay/buzz/internal/nostr"
)

// A client may AUTH again and again on one connection; its logger names
// the current pubkey only, rather than growing by one attribute per AUTH
// (each AUTH then copying all the earlier ones: a socket re-sending AUTH
// spent ever more CPU and memory).
// Mutation killed: deriving the logger from the previous one.
func TestReAuthLogsOnlyTheCurrentPubkey(t *testing.T) {
	c, _ := acceptTestConn(t)
	var logged bytes.Buffer
	c.srv.log = slog.New(slog.NewTextHandler(&logged, nil))
	c.srv.now = time.Now
	c.tenant = community.FromRow(db.Community{ID: uuid.New(), Host: "relay.example"})
	c.challenge = "challenge"
	for range 3 {
		key, err := nostr.GenerateSecretKey()
		require.NoError(t, err)
		ev := &nostr.Event{Kind: nostr.KindAuth, CreatedAt: time.Now().Unix(), Tags: nostr.Tags{{"challenge", "challenge"}, {"relay", "wss://relay.example"}}}
		require.NoError(t, ev.Sign(key))
		c.onAuth(ev)
		require.Equal(t, ev.PubKey, c.pubkey)
	}
	c.log.Info("probe")
	line := logged.String()
	require.Equal(t, 1, strings.Count(line, "pubkey="), line)
	require.Contains(t, line, "pubkey="+c.pubkey)
	require.Contains(t, line, "community=relay.example")
}
