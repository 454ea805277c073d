package workflow_test

import (
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/buzzrelay/buzz/internal/db"
	"github.com/buzzrelay/buzz/internal/ingest"
	"github.com/buzzrelay/buzz/internal/nostr"
)

// The steps of a run read their pinned definition parsed once by the
// engine (BenchmarkFiftyStepRun: parsing it every step cost a 50-step run
// 0.4 s of CPU), and the kept definition changes nothing of failing
// closed: a run whose pinned event was deleted fails, though the engine
// has its definition parsed.
// A save's transaction likewise reads back the definition its validation
// parsed before it.
// Mutations killed: loadPinned parsing the event itself; prepareDefinition
// parsing the event itself (ParseForSave).
func TestStepsReadTheirPinnedDefinitionParsedOnce(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	owner := f.key()
	ch := f.channel(owner)
	id := uuid.NewString()
	def, _ := f.save(owner, ch, id, twoSteps)
	e := f.engine(time.Minute)

	f.store(f.sign(owner, ingest.KindChat, "one", nostr.Tags{{"h", ch}}))
	f.drain(e)
	runs := f.runIDs(id)
	require.Len(t, runs, 1)
	require.Equal(t, db.WorkflowRunStatusCompleted, f.run(runs[0]).Status)
	require.Equal(t, 1, e.DefinitionsReadBack(), "two steps, one definition parsed")
	require.Equal(t, 1, f.triggers.SavesReadBack(), "the save's transaction read back what its validation parsed")

	f.store(f.sign(owner, ingest.KindChat, "two", nostr.Tags{{"h", ch}}))
	f.store(f.sign(owner, nostr.KindDeletion, "", nostr.Tags{{"e", def.ID}}))
	f.drain(e)
	for _, run := range f.runIDs(id) {
		if run == runs[0] {
			continue
		}
		r := f.run(run)
		require.Equal(t, db.WorkflowRunStatusFailed, r.Status)
		require.Equal(t, "workflow_disabled", *r.ErrorCode, "the deletion archived the workflow")
	}
	require.Len(t, f.runIDs(id), 2)
}
