package relay_test

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/buzzrelay/buzz/internal/config"
	"github.com/buzzrelay/buzz/internal/nostr"
	"github.com/buzzrelay/buzz/internal/relaytest"
)

// A channel at BUZZ_MAX_CHANNEL_MEMBERS answers a join and an owner's
// put-user over WebSocket with OK false and the limit's restricted:
// message, counted apart; the refused client is not in the members list.
// Mutation killed: the relay not reading the setting into the pipeline
// (the default limit lets both in).
func TestChannelAtItsMemberLimitRefusesAddsWithOKFalse(t *testing.T) {
	t.Parallel()
	r := relaytest.Start(t, func(c *config.Config) { c.MaxChannelMembers = 2 })
	owner, member, late := r.Dial(t, ""), r.Dial(t, ""), r.Dial(t, "")
	owner.Auth(nil)
	member.Auth(nil)
	late.Auth(nil)
	ch := createChannel(t, owner, "small", false)
	require.True(t, member.Publish(member.Sign(9021, "", nostr.Tags{{"h", ch}}, 0)).OK)

	const refusal = "restricted: the channel has reached its member limit (2)"
	ok := late.Publish(late.Sign(9021, "", nostr.Tags{{"h", ch}}, 0))
	require.False(t, ok.OK)
	require.Equal(t, refusal, ok.Msg)
	ok = owner.Publish(owner.Sign(9000, "", nostr.Tags{{"h", ch}, {"p", relaytest.NewKey(t).PublicKeyHex()}}, 0))
	require.False(t, ok.OK)
	require.Equal(t, refusal, ok.Msg)
	require.Equal(t, 2.0, testutil.ToFloat64(r.Server.Metrics().ChannelMemberLimitRefusals))

	members := owner.Req("members", map[string]any{"kinds": []int{39002}, "#d": []string{ch}})
	require.Len(t, members, 1)
	require.ElementsMatch(t, []string{owner.Key.PublicKeyHex(), member.Key.PublicKeyHex()}, members[0].Tags.Values("p"))
}
