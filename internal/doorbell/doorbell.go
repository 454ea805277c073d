// Package doorbell is the agent side of a workflow doorbell: it decides
// whether a relay-signed message that claims to wake this agent for a
// workflow step is backed by signed artifacts, and renders the prompt from
// those artifacts alone. The relay's own text is never authority: a
// doorbell-shaped message that fails any check is dropped with a reason,
// never handed on as an ordinary message.
package doorbell

import (
	"context"

	"github.com/buzzrelay/buzz/internal/nostr"
)

// Querier reads stored events from the relay the doorbell came from, with
// NIP-01 filter semantics (history only, up to EOSE). The agent runtime
// implements it over its authenticated connection.
type Querier interface {
	Query(ctx context.Context, filter map[string]any) ([]*nostr.Event, error)
}

// Wake is a verified doorbell: who asked for what, and the prompt rendered
// from the owner-signed definition and the verified cause.
type Wake struct {
	RunID        string // the workflow-run tag
	StepID       string
	ChannelID    string // the h tag (UUID)
	Owner        string // hex pubkey: the author of the signed definition
	DefinitionID string // hex id of the signed 30620 event
	WorkflowID   string // the definition's d tag (UUID)
	Cause        Cause
	// Prompt is rendered locally from the signed step text; webhook cargo
	// appears only in a fenced block labelled untrusted external input.
	Prompt string
	// ReplyTo is the event id an answer replies to in its thread, or "".
	ReplyTo string
	Message *nostr.Event // the doorbell itself
	// ReplayKey is what the replay memory recorded for this wake ("" for a
	// webhook, which has no signed cause). A runtime that keeps its replay
	// memory across restarts stores it and hands it back in Options.Spent.
	ReplayKey string
}

// TagAnswers marks an agent's answer to a doorbell: ["workflow-answers",
// <the workflow's coordinate>]. A doorbell of that workflow whose cause is
// such an answer wakes nobody (ReasonWorkflowLoop): with two agents a
// workflow rings on every message, each would otherwise answer the other's
// answers without end. Agents add it; the relay does not check it.
const TagAnswers = "workflow-answers"

// WorkflowCoordinate is a workflow's address, 30620:<owner>:<workflow id>.
func WorkflowCoordinate(owner, workflowID string) string {
	return "30620:" + owner + ":" + workflowID
}

// Coordinate is the address of the workflow that rang.
func (w *Wake) Coordinate() string { return WorkflowCoordinate(w.Owner, w.WorkflowID) }

// Cause is the doorbell's one typed cause.
type Cause struct {
	Kind  string // "event", "command", "schedule" or "webhook"
	Value string // event id hex, command id hex, slot (Unix seconds) or ""
}

// Drop is why a doorbell-shaped message was refused. Reason is a short
// stable word for a metric label; Detail is for the log.
type Drop struct {
	Reason string
	Detail string
}

// Temporary reports whether the drop says nothing about the doorbell
// itself: the relay could not be asked, so the same doorbell may be
// verified again later (a drop never records it as seen).
func (d *Drop) Temporary() bool { return d.Reason == ReasonUnavailable }

func (d *Drop) Error() string { return "doorbell dropped (" + d.Reason + "): " + d.Detail }
