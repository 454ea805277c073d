package relay_test

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/buzzrelay/buzz/internal/nostr"
	"github.com/buzzrelay/buzz/internal/relaytest"
)

// Many publishers at once over WebSocket, so their events share groups:
// channel messages, replies to a parent that does not exist (refused by the
// thread rule after the event's row was written), messages into an unknown
// channel (refused before), the same event sent twice, and versions of each
// publisher's replaceable relay list. Every OK true event is stored and
// delivered live exactly once; no refused event is stored or delivered; each
// relay list keeps one version, the newest.
//
// Mutations killed: skipping the savepoint rollback of a refused event (a
// refused reply is stored); running the after-commit steps of a refused
// event (it is delivered live).
func TestManyPublishersShareGroupsAndKeepTheirOwnAnswers(t *testing.T) {
	t.Parallel()
	r := relaytest.Start(t)
	owner := r.Dial(t, "")
	owner.Auth(nil)
	ch := createChannel(t, owner, "busy", false)
	watcher := r.Dial(t, "")
	watcher.Auth(nil)
	watcher.Send("REQ", "live", map[string]any{"#h": []string{ch}, "limit": 0})
	require.Equal(t, "EOSE", watcher.NextReply().Verb)

	const publishers, rounds = 12, 4
	type sent struct {
		ev  *nostr.Event
		ok  bool
		msg string
	}
	var mu sync.Mutex
	var all []sent
	relayLists := map[string]*nostr.Event{} // newest per publisher
	var wg sync.WaitGroup
	clients := make([]*relaytest.Client, publishers)
	for i := range clients {
		clients[i] = r.Dial(t, "")
		clients[i].Auth(nil)
	}
	base := time.Now().Unix() - 100
	for i, c := range clients {
		var events []*nostr.Event
		for round := range rounds {
			msg := c.Sign(9, fmt.Sprintf("message %d/%d", i, round), nostr.Tags{{"h", ch}}, 0)
			events = append(events, msg, msg, // the second copy is a duplicate
				c.Sign(9, "reply to nothing", nostr.Tags{{"h", ch}, {"e", fmt.Sprintf("%064x", i*100+round), "", "reply"}}, 0),
				c.Sign(9, "nowhere", nostr.Tags{{"h", "00000000-0000-4000-8000-000000000000"}}, 0),
				c.Sign(10002, "", nostr.Tags{{"r", fmt.Sprintf("wss://%d.example", round)}}, base+int64((round*7)%rounds)))
		}
		newest := events[4]
		for _, ev := range events {
			if ev.Kind == 10002 && ev.CreatedAt > newest.CreatedAt {
				newest = ev
			}
		}
		relayLists[c.Key.PublicKeyHex()] = newest
		wg.Add(1)
		go func() {
			defer wg.Done()
			// Send all, then read the answers: the relay handles a
			// connection's events one at a time, across connections at once.
			for _, ev := range events {
				c.Send("EVENT", ev)
			}
			for _, ev := range events {
				reply := c.NextReply()
				mu.Lock()
				all = append(all, sent{ev: ev, ok: reply.OK, msg: reply.Msg})
				mu.Unlock()
				if reply.ID != ev.ID {
					t.Errorf("answer for %s arrived in place of %s", reply.ID, ev.ID)
				}
			}
		}()
	}
	wg.Wait()

	stored := map[string]bool{}
	for _, s := range all {
		switch {
		case s.ev.Content == "reply to nothing":
			require.False(t, s.ok)
			require.Equal(t, "invalid: reply parent not found", s.msg)
		case s.ev.Content == "nowhere":
			require.False(t, s.ok)
			require.Contains(t, s.msg, "restricted: ")
		default:
			require.True(t, s.ok, "%s: %s", s.ev.Content, s.msg)
			if s.ev.Kind == 9 && s.msg == "" {
				require.False(t, stored[s.ev.ID], "one of the two copies is the duplicate")
				stored[s.ev.ID] = true
			}
		}
	}
	require.Len(t, stored, publishers*rounds)

	history := owner.Req("history", map[string]any{"#h": []string{ch}, "kinds": []int{9}, "limit": 500})
	got := map[string]bool{}
	for _, ev := range history {
		require.NotEqual(t, "reply to nothing", ev.Content, "a refused reply was stored")
		got[ev.ID] = true
	}
	for id := range stored {
		require.True(t, got[id], "an accepted message is stored")
	}

	// Live: every stored message once, nothing refused; the owner's marker
	// comes after all of them.
	marker := owner.Sign(9, "marker", nostr.Tags{{"h", ch}}, 0)
	require.True(t, owner.Publish(marker).OK)
	delivered := map[string]int{}
	for {
		reply := watcher.NextReply()
		require.Equal(t, "EVENT", reply.Verb)
		if reply.Event.ID == marker.ID {
			break
		}
		require.NotEqual(t, "reply to nothing", reply.Event.Content, "a refused reply was delivered")
		delivered[reply.Event.ID]++
	}
	require.Len(t, delivered, len(stored))
	for id, n := range delivered {
		require.True(t, stored[id])
		require.Equal(t, 1, n)
	}

	for pubkey, newest := range relayLists {
		lists := owner.Req("lists", map[string]any{"kinds": []int{10002}, "authors": []string{pubkey}})
		require.Len(t, lists, 1)
		require.Equal(t, newest.ID, lists[0].ID)
	}
}
