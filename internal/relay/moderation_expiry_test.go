package relay_test

import (
	"net/http"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/buzzrelay/buzz/internal/nostr"
	"github.com/buzzrelay/buzz/internal/relaytest"
)

// A channel's moderation event carrying an expiration is refused alike
// over both ways in, a WebSocket EVENT and the HTTP bridge's POST /events:
// OK false and 400, each with the rule's own text, the removal neither
// stored nor applied (the member stays in the relay's members list), and
// the connection goes on.
// Mutation killed: events_moderation_never_expires without its entry in
// dberr's client texts (both answers become "invalid: the database
// refused the write (rule events_moderation_never_expires)").
func TestModerationEventWithAnExpirationRefusedOverWebSocketAndBridge(t *testing.T) {
	t.Parallel()
	r := relaytest.Start(t)
	owner := r.Dial(t, "")
	owner.Auth(nil)
	member := relaytest.NewKey(t)
	ch := createChannel(t, owner, "expiry", true)
	require.True(t, owner.Publish(owner.Sign(9000, "", nostr.Tags{{"h", ch}, {"p", member.PublicKeyHex()}}, 0)).OK)

	const refusal = "invalid: a channel's moderation events (9000-9002, 9005, 9007, 9008) are its lasting account of who did what: they cannot carry an expiration tag"
	expiration := nostr.Tag{"expiration", strconv.FormatInt(time.Now().Add(time.Hour).Unix(), 10)}
	removal := owner.Sign(9001, "", nostr.Tags{{"h", ch}, {"p", member.PublicKeyHex()}, expiration}, 0)
	got := owner.Publish(removal)
	require.False(t, got.OK)
	require.Equal(t, refusal, got.Msg)

	body := encodeBody(t, removal)
	posted := send(t, r, "", "/events", authHeader(nip98(t, owner.Key, "POST", r.HTTPURL+"/events", body, nil)), body)
	require.Equal(t, http.StatusBadRequest, posted.Status, posted.Raw)
	require.Equal(t, refusal, posted.Msg)

	require.Empty(t, owner.Req("removal", map[string]any{"ids": []string{removal.ID}}), "the refused removal is stored")
	members := owner.Req("members", map[string]any{"kinds": []int{39002}, "#d": []string{ch}})
	require.Len(t, members, 1)
	require.Contains(t, tagValues(members[0], "p"), member.PublicKeyHex(), "the refused removal was applied")
	require.True(t, owner.Publish(owner.Sign(9, "still here", nostr.Tags{{"h", ch}}, 0)).OK, "the connection goes on")
}
