package main

import (
	"context"
	"strings"

	"github.com/google/uuid"

	"github.com/buzzrelay/buzz/internal/doorbell"
	"github.com/buzzrelay/buzz/internal/nostr"
)

// verifier decides whether a doorbell-shaped message is backed by signed
// artifacts. Anything it refuses (a *doorbell.Drop) is dropped, never handed
// to the agent as an ordinary message.
type verifier interface {
	Verify(ctx context.Context, ev *nostr.Event) (*doorbell.Wake, error)
}

// newVerifier builds the runtime's doorbell verifier. It is the one place
// to change when the full verifier of package doorbell is wired in:
//
//	return doorbell.NewVerifier(doorbell.Options{RelayPubkey: relayPubkey, AgentPubkey: agentPubkey, Query: q, Now: time.Now})
//
// Until then it is envelopeVerifier, which checks only the envelope.
func newVerifier(relayPubkey, agentPubkey string, q doorbell.Querier) verifier {
	_ = q
	return &envelopeVerifier{relayPubkey: relayPubkey, agentPubkey: agentPubkey}
}

// isDoorbellShaped reports whether ev claims to be a workflow doorbell: it
// carries the workflow marker or any workflow-* tag. Such a message is only
// ever handled as a doorbell, so a forgery cannot slip through as a mention.
func isDoorbellShaped(ev *nostr.Event) bool {
	for _, tag := range ev.Tags {
		if len(tag) == 0 {
			continue
		}
		if tag[0] == "buzz:workflow" || strings.HasPrefix(tag[0], "workflow-") {
			return true
		}
	}
	return false
}

// envelopeVerifier checks what the doorbell itself proves: a kind 9 signed
// by the community's relay key, with the doorbell marker, a channel, the
// workflow tags, and this agent in a p tag. It refetches nothing, so the
// prompt it gives is the relay's rendered text.
type envelopeVerifier struct {
	relayPubkey string
	agentPubkey string
}

func (v *envelopeVerifier) Verify(_ context.Context, ev *nostr.Event) (*doorbell.Wake, error) {
	drop := func(reason, detail string) (*doorbell.Wake, error) {
		return nil, &doorbell.Drop{Reason: reason, Detail: detail}
	}
	if ev.Kind != 9 {
		return drop("kind", "a doorbell is a kind 9")
	}
	if err := ev.Verify(); err != nil {
		return drop("signature", err.Error())
	}
	if ev.PubKey != v.relayPubkey {
		return drop("not_relay_signed", "signed by "+ev.PubKey+", not the relay key")
	}
	if !hasTag(ev, "buzz:workflow", "doorbell-v1") {
		return drop("marker", "no [buzz:workflow, doorbell-v1] tag")
	}
	if !hasTag(ev, "p", v.agentPubkey) {
		return drop("not_addressed", "this agent is not in a p tag")
	}
	channel := tagValue(ev, "h")
	if _, err := uuid.Parse(channel); err != nil {
		return drop("channel", "h tag is not a channel id")
	}
	run, step, owner := tagValue(ev, "workflow-run"), tagValue(ev, "workflow-step"), tagValue(ev, "workflow-owner")
	def := ev.Tags.First("workflow-definition")
	cause := ev.Tags.First("workflow-cause")
	if run == "" || step == "" || !nostr.IsHex64(owner) || len(def) < 3 || !nostr.IsHex64(def[1]) || len(cause) < 2 {
		return drop("envelope", "missing or malformed workflow tags")
	}
	w := &doorbell.Wake{
		RunID: run, StepID: step, ChannelID: channel, Owner: owner, DefinitionID: def[1],
		Cause:   doorbell.Cause{Kind: cause[1]},
		Prompt:  ev.Content,
		Message: ev,
	}
	if len(cause) >= 3 {
		w.Cause.Value = cause[2]
	}
	if root, _ := threadOf(ev); root != "" {
		w.ReplyTo = ev.ID
	}
	return w, nil
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

// threadOf reads NIP-10 marked e tags: the thread root and the direct
// parent; one of them alone names both.
func threadOf(ev *nostr.Event) (root, parent string) {
	for _, tag := range ev.Tags {
		if len(tag) < 4 || tag[0] != "e" || !nostr.IsHex64(tag[1]) {
			continue
		}
		switch tag[3] {
		case "root":
			root = tag[1]
		case "reply":
			parent = tag[1]
		}
	}
	if root == "" {
		root = parent
	}
	if parent == "" {
		parent = root
	}
	return root, parent
}
