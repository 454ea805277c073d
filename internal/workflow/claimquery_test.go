package workflow_test

import (
	"os"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// The poll and the by-id claim come from one template and differ only in
// the by-id line, so a condition added to one is in the other. Mutation
// killed: editing one rendered query by hand (or a template branch that
// adds anything else to one of them) fails the comparison.
func TestRunClaimsDifferOnlyInTheByIDLine(t *testing.T) {
	t.Parallel()
	raw, err := os.ReadFile("../../queries/workflow_run_claim.gen.sql")
	require.NoError(t, err)
	parts := strings.Split(string(raw), "-- name: ")
	require.Len(t, parts, 3)
	sqlOf := func(part string) string {
		var lines []string
		for _, line := range strings.Split(part, "\n")[1:] {
			if !strings.HasPrefix(strings.TrimSpace(line), "--") {
				lines = append(lines, line)
			}
		}
		return strings.Join(lines, "\n")
	}
	due, byID := sqlOf(parts[1]), sqlOf(parts[2])
	require.True(t, strings.HasPrefix(parts[1], "WorkflowRunClaimDue "))
	require.True(t, strings.HasPrefix(parts[2], "WorkflowRunClaimByID "))
	require.Contains(t, due, "FOR UPDATE OF r SKIP LOCKED")
	require.Equal(t, strings.TrimSpace(due), strings.TrimSpace(strings.Replace(byID, "      AND r.id = ANY(@ids::uuid[])\n", "", 1)))
}
