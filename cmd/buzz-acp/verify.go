package main

import (
	"context"
	"time"

	"github.com/buzzrelay/buzz/internal/doorbell"
	"github.com/buzzrelay/buzz/internal/nostr"
)

// verifier decides whether a doorbell-shaped message is backed by signed
// artifacts. Anything it refuses (a *doorbell.Drop) is dropped, never handed
// to the agent as an ordinary message.
type verifier interface {
	Verify(ctx context.Context, ev *nostr.Event) (*doorbell.Wake, error)
}

// newVerifier builds the runtime's doorbell verifier: the definition, the
// cause and the member list are read back over the agent's own connection
// (q) and checked against their signatures; the prompt is rendered from
// them, never taken from the doorbell's prose.
// spent are the replay keys an earlier run spent (see journal).
func newVerifier(relayPubkey, agentPubkey string, q doorbell.Querier, spent map[string]time.Time) verifier {
	return doorbell.NewVerifier(doorbell.Options{RelayPubkey: relayPubkey, AgentPubkey: agentPubkey, Query: q, Now: time.Now, Spent: spent})
}

func hasTag(ev *nostr.Event, name, value string) bool {
	for _, tag := range ev.Tags {
		if len(tag) >= 2 && tag[0] == name && tag[1] == value {
			return true
		}
	}
	return false
}

func tagValue(ev *nostr.Event, name string) string {
	if tag := ev.Tags.First(name); len(tag) >= 2 {
		return tag[1]
	}
	return ""
}
