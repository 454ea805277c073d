package workflow

import (
	"github.com/google/uuid"

	"github.com/buzzrelay/buzz/internal/ingest"
	"github.com/buzzrelay/buzz/internal/nostr"
)

// Register wires workflows into the write spine: kind 30620 definitions,
// their deletion by coordinate, run creation from messages, reactions and
// diffs, the manual trigger command, approval grants and denials, and the
// refusal of relay-only lifecycle kinds from clients. offer receives the ids of runs a
// committed event created (a Worker's Offer); nil leaves them to the poll.
func Register(p *ingest.Pipeline, offer func(community uuid.UUID, ids []uuid.UUID)) {
	RegisterTriggers(p, &Triggers{Offer: offer})
}

// RegisterTriggers is Register with every trigger setting (the bound on
// unfinished runs, metrics); a nil Condition evaluates conditions with
// EvalCondition.
func RegisterTriggers(p *ingest.Pipeline, t *Triggers) {
	if t.Condition == nil {
		t.Condition = EvalCondition
	}
	p.Register(KindDefinition, t.definitionHandler())
	p.Register(KindManualTrigger, t.ManualTrigger())
	p.Register(KindApprovalGrant, t.ApprovalHandler(KindApprovalGrant))
	p.Register(KindApprovalDeny, t.ApprovalHandler(KindApprovalDeny))
	for _, kind := range relayOnlyKinds() {
		p.Register(kind, ingest.Handler{Validate: func(ev *nostr.Event) error {
			return ingest.Reject("restricted", "only the relay publishes kind %d", ev.Kind)
		}})
	}
	p.RegisterSideRows(t.DefinitionDeletion())
	p.RegisterSideRows(t.SideRows())
	p.RegisterSideRows(t.ChannelDeletion())
	p.RegisterSideRows(t.OwnerRemoval())
}
