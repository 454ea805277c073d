package main

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/buzzrelay/buzz/internal/doorbell"
	"github.com/buzzrelay/buzz/internal/nostr"
	"github.com/buzzrelay/buzz/internal/relaytest"
)

// gatedRefusal holds every doorbell until gate is closed, then refuses it:
// a verifier slowed by its reads from the relay, while messages pile up.
type gatedRefusal struct{ gate chan struct{} }

func (v gatedRefusal) Verify(ctx context.Context, _ *nostr.Event) (*doorbell.Wake, error) {
	select {
	case <-v.gate:
	case <-ctx.Done():
	}
	return nil, &doorbell.Drop{Reason: "test_refused", Detail: "stand-in"}
}

// Eight member keys flood the agent with doorbell-shaped messages while the
// verifier is slow, far more than the waiting room holds; then a member
// writing at an ordinary pace mentions the agent three times, and the
// agent's owner twice. Every one of those five reaches the agent, the
// owner's first: the flood pushes out only its own.
//
// Mutation killed: one first-come queue (as before): the room is full of the
// flood when the five arrive, all five are dropped (overloaded), and the
// agent hears none of them.
func TestFloodFromManyKeysDoesNotDrownAMember(t *testing.T) {
	t.Parallel()
	ownerKey := relaytest.NewKey(t)
	gate := make(chan struct{})
	const room = 32
	w := newWorld(t, func(cfg *settings) {
		cfg.IncomingQueue = room
		cfg.Verifier = func(_, _ string, _ doorbell.Querier) verifier { return gatedRefusal{gate} }
		attestOwner(t, cfg, ownerKey, "")
	})
	const keys, each = 8, 40
	var flooders []*relaytest.Client
	for range keys {
		flooders = append(flooders, w.member(t, nil))
	}
	steady, owner := w.member(t, nil), w.member(t, ownerKey)
	for i := range each {
		for k, c := range flooders {
			c.Send("EVENT", c.Sign(9, fmt.Sprintf("fake %d/%d", k, i), nostr.Tags{
				{"h", w.channel}, {"p", w.agentKey.PublicKeyHex()}, {"buzz:workflow", "doorbell-v1"},
			}, 0))
		}
	}
	for _, c := range flooders {
		for range each {
			ok := c.Expect("OK")
			require.True(t, ok.OK, ok.Msg)
		}
	}
	// One is with the verifier, the room is full, the rest were dropped.
	require.Eventually(t, func() bool {
		return w.status.snapshot().Dropped["overloaded"] == keys*each-room-1
	}, waitLong, 5*time.Millisecond, "the flood fills the waiting room")

	var asked []string
	mention := func(c *relaytest.Client, text string) {
		ev := c.Sign(9, text, nostr.Tags{{"h", w.channel}, {"p", w.agentKey.PublicKeyHex()}}, 0)
		ok := c.Publish(ev)
		require.True(t, ok.OK, ok.Msg)
		asked = append(asked, ev.ID)
	}
	for i := range 3 {
		mention(steady, fmt.Sprintf("@Robby question %d", i))
	}
	for i := range 2 {
		mention(owner, fmt.Sprintf("@Robby owner's question %d", i))
	}
	require.Eventually(t, func() bool {
		return w.status.snapshot().Dropped["overloaded"] == int64(keys*each-room-1+len(asked))
	}, waitLong, 5*time.Millisecond, "each of the five finds the room full")
	close(gate)
	require.Eventually(t, func() bool {
		s := w.status.snapshot()
		return s.Dropped["overloaded"]+s.Dropped["test_refused"]+int64(len(w.prompts())) == int64(keys*each+len(asked))
	}, waitLong, 5*time.Millisecond, "every message is handled or dropped")

	heard := map[string]bool{}
	var order []string
	for _, p := range w.prompts() {
		heard[p.EventID] = true
		order = append(order, p.EventID)
	}
	got := 0
	for _, id := range asked {
		if heard[id] {
			got++
		}
	}
	t.Logf("mentions heard under a flood from %d keys: %d of %d", keys, got, len(asked))
	require.Equal(t, len(asked), got, "every mention of the member and the owner reaches the agent")
	require.Equal(t, asked[3:], order[:2], "the owner's are handled first")
}

// Doorbells are not held back by the per-author cap: the relay signs them
// for a workflow's step and bounds those by its own limits on runs, and a
// doorbell refused here would leave its step waiting out its timeout. The
// workflow's owner, at the cap with a held mention of their own, rings
// three doorbells that each hold their turn: all three are queued.
//
// Mutations killed: the cap applied to doorbells too (the check without
// its doorbell exemption): all three are refused (author_busy); doorbells
// counted and checked like mentions: the same three refusals.
func TestDoorbellsPassTheOwnersPerAuthorCap(t *testing.T) {
	t.Parallel()
	w := newWorld(t, func(cfg *settings) { cfg.MaxPerAuthor = 1 })
	// The workflow's step holds its turn, so the doorbells pile up in the
	// channel's session instead of each ending before the next arrives.
	w.workflow = uuid.NewString()
	ok := w.owner.Publish(w.owner.Sign(30620,
		"name: Held bell\ntrigger: {on: webhook}\nsteps: [{id: ping, action: send_message, text: '@Robby [hold] please look'}]",
		nostr.Tags{{"d", w.workflow}, {"h", w.channel}}, 0))
	require.True(t, ok.OK, ok.Msg)

	// The owner's own mention, in a thread of its own, takes the one turn
	// the cap allows them (the relay keeps the reply parent; buzz-acp keys
	// the session by the claimed root).
	parent := w.mention("@Robby threads start here")
	w.answerTo(parent.ID)
	thread := nostr.Tag{"e", strings.Repeat(uuid.NewString()[:8], 8), "", "root"}
	held := w.mention("@Robby [hold] mine", thread, nostr.Tag{"e", parent.ID, "", "reply"})
	require.Eventually(t, func() bool { _, ok := w.received.Load(held.ID); return ok }, waitLong, 5*time.Millisecond,
		"the owner's mention is queued")

	var bells []*nostr.Event
	for range 3 {
		bells = append(bells, w.ring())
	}
	require.Eventually(t, func() bool {
		n := 0
		for _, b := range bells {
			if _, ok := w.received.Load(b.ID); ok {
				n++
			}
		}
		return n+int(w.status.snapshot().Dropped["author_busy"]) == len(bells)
	}, waitLong, 5*time.Millisecond, "each doorbell is queued or refused")
	require.Empty(t, w.status.snapshot().Dropped, "no doorbell is refused, though its workflow's owner is at the cap")

	require.NoError(t, os.WriteFile(w.holdFile, nil, 0o600))
	for _, b := range bells {
		w.answerTo(b.ID)
	}
	w.answerTo(held.ID)
}
