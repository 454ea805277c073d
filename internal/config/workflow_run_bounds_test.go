package config

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// The workflow run bounds are read, default to the engine's documented
// values, and a bad value names its variable.
func TestWorkflowRunBounds(t *testing.T) {
	t.Parallel()
	d := Default()
	require.Equal(t, 1000, d.WorkflowMaxUnfinishedRuns)
	require.Equal(t, 20, d.WorkflowMaxPerChannel)
	require.Equal(t, 30*24*time.Hour, d.WorkflowRunRetention)
	require.Equal(t, 300*time.Second, d.WorkflowStepTimeout)
	require.Equal(t, 60*time.Second, d.WorkflowMinScheduleInterval)

	c, err := FromEnv(env(map[string]string{
		"BUZZ_WORKFLOW_MAX_UNFINISHED_RUNS":   "25",
		"BUZZ_WORKFLOW_STEP_TIMEOUT":          "90s",
		"BUZZ_WORKFLOW_MAX_PER_CHANNEL":       "5",
		"BUZZ_WORKFLOW_RUN_RETENTION":         "48h",
		"BUZZ_WORKFLOW_MIN_SCHEDULE_INTERVAL": "1s",
	}))
	require.NoError(t, err)
	require.Equal(t, 25, c.WorkflowMaxUnfinishedRuns)
	require.Equal(t, 90*time.Second, c.WorkflowStepTimeout)
	require.Equal(t, 5, c.WorkflowMaxPerChannel)
	require.Equal(t, 48*time.Hour, c.WorkflowRunRetention)
	require.Equal(t, time.Second, c.WorkflowMinScheduleInterval)

	for name, value := range map[string]string{
		"BUZZ_WORKFLOW_MAX_UNFINISHED_RUNS":   "0",
		"BUZZ_WORKFLOW_STEP_TIMEOUT":          "-1s",
		"BUZZ_WORKFLOW_MAX_PER_CHANNEL":       "0",
		"BUZZ_WORKFLOW_RUN_RETENTION":         "5m", // not longer than the catch-up window
		"BUZZ_WORKFLOW_MIN_SCHEDULE_INTERVAL": "0s",
	} {
		_, err := FromEnv(env(map[string]string{name: value}))
		require.ErrorContains(t, err, name, "%s=%q", name, value)
	}
}
