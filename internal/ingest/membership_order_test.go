package ingest_test

import (
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/buzzrelay/buzz/internal/access"
	"github.com/buzzrelay/buzz/internal/db"
	"github.com/buzzrelay/buzz/internal/fanout"
	"github.com/buzzrelay/buzz/internal/ingest"
	"github.com/buzzrelay/buzz/internal/nostr"
)

// liveRecorder is a live subscriber that keeps every message it is sent.
type liveRecorder struct {
	mu   sync.Mutex
	msgs []string
}

func (r *liveRecorder) Enqueue(msg []byte) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.msgs = append(r.msgs, string(msg))
	return true
}

func (r *liveRecorder) got(id string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, m := range r.msgs {
		if strings.Contains(m, id) {
			return true
		}
	}
	return false
}

// A membership change and a message committed after it in one group
// transaction: live delivery sees the change. A member removed by a 9001
// never receives the private channel's message committed after the
// removal, and a member added by a 9000 receives the one committed after
// the addition. Each event is fanned out on its own goroutine, and before,
// a group mate's message was checked against readers cached before the
// change: the removed member got it in 25 of 30 trials.
// Mutation killed: announcing a group's membership changes only as each
// event is answered (finish), not once before any of them is.
func TestGroupMembershipChangePrecedesItsGroupMatesDelivery(t *testing.T) {
	t.Parallel()
	f := newFixture(t, "membership-order.example", 0)
	hub := fanout.NewHub()
	readers := access.NewCache(db.New(f.pool), 10*time.Second, time.Now)
	hub.SetChannelReaders(readers.MayRead)
	f.p = ingest.New(f.pool, hub, ingest.Options{MaxFutureSkew: time.Minute, GroupWriters: 1})
	f.p.OnMembershipChange = readers.Invalidate
	owner, member := f.key(), f.key()
	ch := f.channel(owner, true)
	live := &liveRecorder{}
	hub.Subscribe(f.tenant.ID(), &fanout.Subscription{Receiver: live, ID: "s", Reader: member.PublicKeyHex(),
		Filters: nostr.Filters{{Kinds: []int{ingest.KindChat}, Tags: map[string][]string{"h": {ch}}}}})

	// changeThenMessage commits change and then a message of the owner's in
	// one group, after warming the readers cache with a message first.
	changeThenMessage := func(change *nostr.Event, round int) (message *nostr.Event) {
		f.store(f.sign(owner, ingest.KindChat, fmt.Sprint("warm ", round), nostr.Tags{{"h", ch}}, 0))
		g := f.holdWriter()
		message = f.sign(owner, ingest.KindChat, fmt.Sprint("after ", round), nostr.Tags{{"h", ch}}, 0)
		first := f.submitTogether([]*nostr.Event{change})
		waitQueued(t, f.p, 1)
		second := f.submitTogether([]*nostr.Event{message})
		waitQueued(t, f.p, 2)
		g.open(t)
		requireStored(t, append(first, second...), "the group")
		return message
	}
	for round := range 10 {
		add := f.sign(owner, ingest.KindPutUser, "", nostr.Tags{{"h", ch}, {"p", member.PublicKeyHex()}, {"round", fmt.Sprint(round)}}, 0)
		require.True(t, live.got(changeThenMessage(add, 2*round).ID), "round %d: the member added first gets the message", round)
		remove := f.sign(owner, ingest.KindRemoveUser, "", nostr.Tags{{"h", ch}, {"p", member.PublicKeyHex()}, {"round", fmt.Sprint(round)}}, 0)
		require.False(t, live.got(changeThenMessage(remove, 2*round+1).ID), "round %d: the member removed first does not get the message", round)
	}
}
