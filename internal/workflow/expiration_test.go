package workflow_test

import (
	"strconv"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/buzzrelay/buzz/internal/db"
	"github.com/buzzrelay/buzz/internal/ingest"
	"github.com/buzzrelay/buzz/internal/nostr"
	"github.com/buzzrelay/buzz/internal/workflow"
)

// A decision on an approval whose run executes a definition that expired
// (NIP-40) since it was asked for is refused, as one whose definition was
// deleted: granted, the run could only fail at its next step.
// Mutation killed: decidable without the event's expiry (the grant is
// accepted and the run made due).
func TestADecisionOnAnExpiredDefinitionsApprovalIsRefused(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	owner, approver := f.key(), f.key()
	ch := f.channel(owner, approver)
	id := uuid.NewString()
	expires := strconv.FormatInt(f.clock.Now().Add(30*time.Minute).Unix(), 10)
	f.store(f.sign(owner, workflow.KindDefinition, approvalYAML(pubHex(approver)), nostr.Tags{{"d", id}, {"h", ch}, {"expiration", expires}}))
	f.store(f.sign(owner, ingest.KindChat, "ship", nostr.Tags{{"h", ch}}))
	run := f.runIDs(id)[0]
	f.drain(f.engine(time.Minute))
	require.Equal(t, db.WorkflowRunStatusWaitingApproval, f.run(run).Status)
	var ref string
	require.NoError(t, f.pool.QueryRow(f.ctx, `SELECT encode(token, 'hex') FROM workflow_approvals WHERE run_id = $1`, run).Scan(&ref))

	f.clock.Advance(45 * time.Minute)
	f.rejected(f.sign(approver, workflow.KindApprovalGrant, "", nostr.Tags{{"d", ref}}),
		"invalid: the workflow's definition expired (NIP-40); its run cannot go on")
	require.Equal(t, db.WorkflowRunStatusWaitingApproval, f.run(run).Status)
}
