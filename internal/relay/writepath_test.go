package relay_test

import (
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/buzzrelay/buzz/internal/nostr"
	"github.com/buzzrelay/buzz/internal/relaytest"
)

// TestOutsiderCannotPlaceEventsInAPrivateChannel publishes, as a
// non-member, emoji sets and lists (kinds whose handler only validates)
// naming a private channel in an h tag, over WebSocket and POST /events.
// Both refuse them; a member's live #h feed and its history never show
// them. Mutation killed: the single-INSERT path skipping the channel check
// for validate-only kinds (the events were stored global and shown in #h).
func TestOutsiderCannotPlaceEventsInAPrivateChannel(t *testing.T) {
	t.Parallel()
	r := relaytest.Start(t)
	owner := r.Dial(t, "")
	owner.Auth(nil)
	ch := createChannel(t, owner, "inner", true)
	owner.Send("REQ", "live", map[string]any{"#h": []string{ch}, "limit": 0})
	require.Equal(t, "EOSE", owner.NextReply().Verb)

	outsiderKey := relaytest.NewKey(t)
	outsider := r.Dial(t, "")
	outsider.Auth(outsiderKey)
	var intruders []string
	for _, kind := range []int{30030, 10030} {
		ev := outsider.Sign(kind, "", nostr.Tags{{"h", ch}, {"d", "set"}, {"emoji", "x", "https://example.com/x.png"}}, 0)
		intruders = append(intruders, ev.ID)
		requireRejected(t, outsider.Publish(ev), "restricted: ")

		viaHTTP := relaytest.SignEvent(t, outsiderKey, kind, "", nostr.Tags{{"h", ch}, {"d", "http"}}, 0)
		intruders = append(intruders, viaHTTP.ID)
		got := post(t, r, outsiderKey, "/events", viaHTTP)
		require.Equal(t, http.StatusForbidden, got.Status, got.Raw)
		require.True(t, strings.HasPrefix(got.Msg, "restricted: "), got.Msg)
	}

	// The next live event the member sees is the member's own message.
	marker := owner.Sign(9, "after the attempts", nostr.Tags{{"h", ch}}, 0)
	owner.Send("EVENT", marker)
	sawEvent, sawOK := false, false
	for !sawEvent || !sawOK {
		reply := owner.NextReply()
		if reply.Verb == "OK" {
			require.True(t, reply.OK, reply.Msg)
			sawOK = true
			continue
		}
		require.Equal(t, "EVENT", reply.Verb)
		require.Equal(t, marker.ID, reply.Event.ID, "an outsider's event reached the channel's live feed")
		sawEvent = true
	}
	history := owner.Req("history", map[string]any{"#h": []string{ch}})
	for _, ev := range history {
		require.NotContains(t, intruders, ev.ID)
	}
}
