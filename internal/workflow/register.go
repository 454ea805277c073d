package workflow

import (
	"github.com/google/uuid"

	"github.com/buzzrelay/buzz/internal/ingest"
)

// Register wires workflows into the write spine: kind 30620 definitions,
// their deletion by coordinate, run creation from messages, reactions and
// diffs, and the manual trigger command. offer receives the ids of runs a
// committed event created (a Worker's Offer); nil leaves them to the poll.
func Register(p *ingest.Pipeline, offer func(ids []uuid.UUID)) {
	t := &Triggers{Condition: EvalCondition, Offer: offer}
	p.Register(KindDefinition, DefinitionHandler)
	p.Register(KindManualTrigger, t.ManualTrigger())
	p.RegisterSideRows(DefinitionDeletion)
	p.RegisterSideRows(t.SideRows())
}
