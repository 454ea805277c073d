package relay_test

import (
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/buzzrelay/buzz/internal/config"
	"github.com/buzzrelay/buzz/internal/nostr"
	"github.com/buzzrelay/buzz/internal/relaytest"
)

// A member removed while their history of a private channel streams in
// pages is sent nothing more of it: not what the channel stored after the
// removal, when a later page reaches it (a message dated before the page's
// position: its client's clock behind the relay's, or sent while the
// removal was in flight). The member reads through the HTTP bridge with
// net/http; between the first page and the second, the owner removes them
// and posts a message dated before every message the history has left.
// Both paged reads: by time, and a search's by relevance.
// Mutation killed: QueryJSON keeping the channels read when the request
// arrived for every page (scope.readAgain's answer dropped): the second
// page sends the message posted after the removal, in both reads; and
// querySearch not asking readAgain at all (the search fails: its pages
// never read the channels again).
func TestRemovedMemberIsSentNothingMoreOfAHistoryBeingStreamed(t *testing.T) {
	t.Parallel()
	for _, read := range []struct {
		name      string
		filter    map[string]any
		firstPage int // events the first page sends, newest first
	}{
		// A full page leaves its last row to the next.
		{"by time", map[string]any{"kinds": []int{9}}, 1},
		{"search", map[string]any{"kinds": []int{9}, "search": "removal"}, 2},
	} {
		t.Run(read.name, func(t *testing.T) {
			t.Parallel()
			r := relaytest.Start(t, func(c *config.Config) { c.ReqPageRows = 2 })
			owner := r.Dial(t, "")
			owner.Auth(nil)
			ch := createChannel(t, owner, "secret", true)
			member := relaytest.NewKey(t)
			require.True(t, owner.Publish(owner.Sign(9000, "", nostr.Tags{{"h", ch}, {"p", member.PublicKeyHex()}}, 0)).OK)
			now := time.Now().Unix()
			var newestFirst []string
			for i := range 4 {
				ev := owner.Sign(9, "before the removal", nostr.Tags{{"h", ch}}, now-100-int64(i))
				require.True(t, owner.Publish(ev).OK)
				newestFirst = append(newestFirst, ev.ID)
			}

			secret := owner.Sign(9, "after the removal", nostr.Tags{{"h", ch}}, now-1000)
			var removed atomic.Bool
			r.Server.SetBeforeLaterPage(func() {
				if removed.Swap(true) {
					return
				}
				got := owner.Publish(owner.Sign(9001, "", nostr.Tags{{"h", ch}, {"p", member.PublicKeyHex()}}, 0))
				require.True(t, got.OK, got.Msg)
				require.True(t, owner.Publish(secret).OK)
			})

			filter := map[string]any{"#h": []string{ch}}
			for k, v := range read.filter {
				filter[k] = v
			}
			got := post(t, r, member, "/query", query(filter))
			require.Equal(t, 200, got.Status, got.Raw)
			require.True(t, removed.Load(), "the history was read in one page: the removal never fell inside it")
			var sent []string
			for _, ev := range got.Events {
				sent = append(sent, ev.ID)
			}
			require.NotContains(t, sent, secret.ID, "a removed member was sent a message posted after the removal")
			// The first page was read while a member.
			require.Equal(t, newestFirst[:read.firstPage], sent)
		})
	}
}
