package workflow_test

import (
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/buzzrelay/buzz/internal/db"
	"github.com/buzzrelay/buzz/internal/workflow"
)

// dyingWorker claims the run with a fresh engine whose process dies inside
// the step transaction of step die (a panic unwinds through pgx.BeginFunc
// and rolls it back, as a killed process's dropped connection would), then
// lets the claim's lease expire. It returns the claim's expired_leases.
func dyingWorker(t *testing.T, f *fixture, lease time.Duration, die int) int32 {
	t.Helper()
	e := f.engine(lease)
	e.SetBeforeCommit(func(_ uuid.UUID, step int) {
		if step == die {
			panic("killed")
		}
	})
	claims, err := e.ClaimDue(f.ctx, 1)
	require.NoError(t, err)
	require.Len(t, claims, 1, "the run is resumed after the lease")
	require.Panics(t, func() { e.Execute(f.ctx, claims[0]) })
	f.clock.Advance(lease + time.Second)
	return claims[0].Run.ExpiredLeases
}

// A step that kills every worker taking it (a panic, memory, a process
// killed again and again) is tried MaxExpiredLeases times, then the claim
// that would resume it once more ends the run with step_abandoned, visible
// in run history and metrics. Unbounded, each process of the deployment
// took the run in turn, one crash per lease, for ever.
//
// Mutations killed: the engine ignoring expired_leases runs the step a
// fourth time (the run completes: "ended, not resumed again"); the claim
// not counting the expiry never reaches the bound (same failure); a step
// transition that does not reset the count ends the run below, where each
// step lost only two workers ("each step's count starts afresh").
func TestAStepThatKeepsKillingItsWorkerEndsTheRun(t *testing.T) {
	t.Parallel()
	const lease = 30 * time.Second

	t.Run("each step's count starts afresh", func(t *testing.T) {
		t.Parallel()
		f, run := twoStepRun(t)
		// Step 0 kills two workers, then its third records it and step 1
		// kills that one and the next: four expiries, two per step.
		require.EqualValues(t, 0, dyingWorker(t, f, lease, 0))
		require.EqualValues(t, 1, dyingWorker(t, f, lease, 0))
		require.EqualValues(t, 2, dyingWorker(t, f, lease, 1))
		require.Equal(t, int32(1), f.run(run).CurrentStep)
		require.EqualValues(t, 1, dyingWorker(t, f, lease, 1), "recording step 0 reset the count")
		f.drain(f.engine(lease))
		require.Equal(t, db.WorkflowRunStatusCompleted, f.run(run).Status)
		require.ElementsMatch(t, []string{"first", "second"}, contents(f.doorbells(run)))
	})

	t.Run("ended, not resumed again", func(t *testing.T) {
		t.Parallel()
		f, run := twoStepRun(t)
		for i := range workflow.MaxExpiredLeases {
			require.EqualValues(t, i, dyingWorker(t, f, lease, 1))
		}
		require.Equal(t, int32(1), f.run(run).CurrentStep, "step 0 was recorded once")

		survivor := f.engine(lease)
		ran := false
		survivor.SetBeforeCommit(func(uuid.UUID, int) { ran = true })
		claims, err := survivor.ClaimDue(f.ctx, 1)
		require.NoError(t, err)
		require.Len(t, claims, 1)
		require.True(t, survivor.Execute(f.ctx, claims[0]))
		require.False(t, ran, "the step is not tried a fourth time")
		f.failedWith(run, workflow.CodeStepAbandoned, "step 1:", "3 times")
		require.Equal(t, []string{"first"}, contents(f.doorbells(run)))
		require.EqualValues(t, 1, f.runsTotal("failed", string(workflow.CodeStepAbandoned)))

		none, err := survivor.ClaimDue(f.ctx, 1)
		require.NoError(t, err)
		require.Empty(t, none, "an ended run is claimed by nobody")
	})
}

// A step at work longer than the lease (a lock wait behind maintenance, a
// slow database) keeps its run: its worker renews the lease while the step
// runs, so no other worker resumes the run beside it. Before, with the
// default lease (30 s) shorter than the default step timeout (300 s), every
// lease another worker took the run and ran the step again alongside, the
// late one fenced out and its step_timeout never recorded; with the bound
// above, three such waits would end a live run as step_abandoned.
//
// Mutation killed: no lease renewal during the step (the lease is never
// seen renewed, and the second worker claims the run).
func TestAStepOutlastingTheLeaseKeepsItsRun(t *testing.T) {
	t.Parallel()
	f, run := twoStepRun(t)
	// Short in real time, so the renewals come quickly; the test clock
	// decides when a lease has expired.
	const lease = 300 * time.Millisecond
	slow := f.engine(lease)
	release := f.lockEvents() // step 0's doorbell waits for it
	claims, err := slow.ClaimDue(f.ctx, 1)
	require.NoError(t, err)
	require.Len(t, claims, 1)
	done := make(chan bool, 1)
	go func() { done <- slow.Execute(f.ctx, claims[0]) }()
	require.Eventually(t, func() bool {
		var waiting bool
		require.NoError(t, f.pool.QueryRow(f.ctx, `SELECT EXISTS (SELECT FROM pg_stat_activity
			WHERE datname = current_database() AND wait_event_type = 'Lock' AND query LIKE '%INSERT INTO events%')`).Scan(&waiting))
		return waiting
	}, 30*time.Second, 10*time.Millisecond, "step 0 waits to store its doorbell")

	for range 3 {
		f.clock.Advance(time.Second) // the claim's lease has expired by the clock
		require.Eventually(t, func() bool {
			var renewed bool
			require.NoError(t, f.pool.QueryRow(f.ctx, `SELECT lease_until > $2 FROM workflow_runs WHERE id = $1`, run, f.clock.Now()).Scan(&renewed))
			return renewed
		}, 30*time.Second, 10*time.Millisecond, "the worker at work renews its lease")
		other, err := f.engine(lease).ClaimDue(f.ctx, 1)
		require.NoError(t, err)
		require.Empty(t, other, "nobody resumes a run whose worker is at work")
	}
	release()
	require.True(t, <-done)
	final := f.run(run)
	require.Equal(t, db.WorkflowRunStatusCompleted, final.Status)
	require.Equal(t, int32(1), final.Attempts, "claimed once")
	require.ElementsMatch(t, []string{"first", "second"}, contents(f.doorbells(run)))
}
