package relay_test

import (
	"net/http"
	"testing"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/buzzrelay/buzz/internal/nostr"
	"github.com/buzzrelay/buzz/internal/relaytest"
)

// A member probing channel ids with creates (9007) learns only that an id
// cannot be used, never what holds it: a private channel they cannot see
// answers exactly as a public one, a deleted one or one they own, over
// WebSocket and HTTP alike, and the answer never says a channel exists.
// A free id is still created (the control). Mutation killed: the old
// answer, "invalid: channel <id> already exists", which confirmed to an
// outsider that a private channel holds the id.
func TestChannelCreateDoesNotSayWhatHoldsATakenID(t *testing.T) {
	t.Parallel()
	r := relaytest.Start(t)
	owner := r.Dial(t, "")
	owner.Auth(nil)
	prober := r.Dial(t, "")
	proberKey := prober.Auth(nil)

	private := createChannel(t, owner, "secret", true)
	public := createChannel(t, owner, "lobby", false)
	deleted := createChannel(t, owner, "gone", false)
	require.True(t, owner.Publish(owner.Sign(9008, "", nostr.Tags{{"h", deleted}}, 0)).OK)
	own := createChannel(t, prober, "mine", true)

	create := func(id string) *nostr.Event {
		return prober.Sign(9007, "", nostr.Tags{{"h", id}, {"name", "probe"}}, 0)
	}
	taken := func(id string) string {
		return "invalid: channel id " + id + " is not available; create the channel under a new random id"
	}
	for name, id := range map[string]string{"private, unseen": private, "public": public, "deleted": deleted, "own": own} {
		got := prober.Publish(create(id))
		require.False(t, got.OK, name)
		require.Equal(t, taken(id), got.Msg, name)
		require.NotContains(t, got.Msg, "exist", name)

		over := post(t, r, proberKey, "/events", create(id))
		require.Equal(t, http.StatusBadRequest, over.Status, "%s: %s", name, over.Raw)
		require.Equal(t, taken(id), over.Msg, name)
	}
	require.True(t, prober.Publish(create(uuid.NewString())).OK, "a free id is created")
}
