package workflow_test

import (
	"bytes"
	"context"
	"errors"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/buzzrelay/buzz/internal/clock"
	"github.com/buzzrelay/buzz/internal/db"
	"github.com/buzzrelay/buzz/internal/dbtest"
	"github.com/buzzrelay/buzz/internal/ingest"
	"github.com/buzzrelay/buzz/internal/nostr"
	"github.com/buzzrelay/buzz/internal/workflow"
)

const twoSteps = "name: Two\ntrigger: {on: message_posted}\nsteps: [{id: one, action: send_message, text: first}, {id: two, action: send_message, text: second}]"

// twoStepRun saves the twoSteps workflow in a fresh channel and posts the
// message that triggers it: one pending run, returned by id.
func twoStepRun(t *testing.T) (*fixture, uuid.UUID) {
	t.Helper()
	f := newFixture(t)
	owner := f.key()
	ch := f.channel(owner)
	id := uuid.NewString()
	f.save(owner, ch, id, twoSteps)
	f.store(f.sign(owner, ingest.KindChat, "go", nostr.Tags{{"h", ch}}))
	return f, f.runIDs(id)[0]
}

// Two workers, each with its own engine, poll one database at once while
// runs arrive: every run completes, each of its two non-idempotent
// send_message steps is executed exactly once, and no run is claimed twice.
//
// Mutation killed: a claim without FOR UPDATE SKIP LOCKED lets both workers
// claim the same pending run (attempts 2, and a step's message sent by the
// loser is only saved by the fence); checked by the attempts == 1 and the
// exactly-two-messages assertions.
func TestTwoWorkersNeverExecuteAStepTwice(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	owner := f.key()
	ch := f.channel(owner)
	id := uuid.NewString()
	f.save(owner, ch, id, twoSteps)

	ctx, cancel := context.WithCancel(f.ctx)
	defer cancel()
	done := make(chan struct{}, 2)
	for range 2 {
		w := workflow.NewWorker(f.engine(time.Minute), workflow.WorkerOptions{MaxInFlight: 4, Poll: 5 * time.Millisecond})
		go func() { w.Run(ctx); done <- struct{}{} }()
	}
	const runs = 30
	for i := range runs {
		f.store(f.sign(owner, ingest.KindChat, "msg "+itoa(int64(i)), nostr.Tags{{"h", ch}}))
	}
	require.Eventually(t, func() bool {
		return f.count(`SELECT count(*) FROM workflow_runs WHERE status = 'completed'`) == runs
	}, time.Minute, 10*time.Millisecond)
	cancel()
	<-done
	<-done

	ids := f.runIDs(id)
	require.Len(t, ids, runs)
	for _, run := range ids {
		row := f.run(run)
		require.Equal(t, int32(1), row.Attempts, "claimed once")
		bells := f.doorbells(run)
		require.ElementsMatch(t, []string{"first", "second"}, contents(bells), "each step sent once")
	}
}

// A worker that claimed a run and died (no step executed) holds it only
// for its lease: until then nobody else may claim it; after it another
// worker resumes and completes the run, and the first worker's late
// transition is fenced: it changes nothing and sends nothing.
//
// Mutations killed: a claim that ignores lease_until (re-claims running
// runs at once) fails "held until the lease ends"; transitions fenced by id
// alone (no claim_id, status, current_step) let the late worker record its
// steps and send its messages, failing "late worker changes nothing"; a
// fence without claim_id makes the late Execute report success, failing
// require.False.
func TestLeaseExpiryResumesAndFencesTheLateWorker(t *testing.T) {
	t.Parallel()
	f, run := twoStepRun(t)

	const lease = 30 * time.Second
	dead, alive := f.engine(lease), f.engine(lease)
	claims, err := dead.ClaimDue(f.ctx, 10)
	require.NoError(t, err)
	require.Len(t, claims, 1)
	stale := claims[0]

	f.clock.Advance(lease - time.Second)
	none, err := alive.ClaimDue(f.ctx, 10)
	require.NoError(t, err)
	require.Empty(t, none, "held until the lease ends")

	f.clock.Advance(2 * time.Second)
	claims, err = alive.ClaimDue(f.ctx, 10)
	require.NoError(t, err)
	require.Len(t, claims, 1, "resumed after the lease")
	require.NotEqual(t, stale.ClaimID, claims[0].ClaimID)
	require.Equal(t, int32(2), claims[0].Run.Attempts)

	// The dead worker wakes up while the run is held by the new claim.
	require.False(t, dead.Execute(f.ctx, stale), "late worker lost its claim")
	require.Empty(t, f.doorbells(run), "late worker changes nothing")
	require.Equal(t, db.WorkflowRunStatusRunning, f.run(run).Status)
	require.Equal(t, int32(0), f.run(run).CurrentStep)

	require.True(t, alive.Execute(f.ctx, claims[0]))
	final := f.run(run)
	require.Equal(t, db.WorkflowRunStatusCompleted, final.Status)
	require.Len(t, f.doorbells(run), 2)

	// And once the run ended, the stale claim still changes nothing.
	require.False(t, dead.Execute(f.ctx, stale))
	require.Len(t, f.doorbells(run), 2)
}

// A worker killed between two steps (its step 1 transaction never
// commits) leaves step 0 recorded once; the next worker resumes at step 1
// after the lease and does not repeat step 0.
//
// Mutation killed: resuming from step 0 instead of current_step (a claim
// that resets current_step, or Execute ignoring it) sends "first" twice.
func TestResumeAfterCrashContinuesAtCurrentStep(t *testing.T) {
	t.Parallel()
	f, run := twoStepRun(t)

	const lease = 30 * time.Second
	crashing := f.engine(lease)
	// The process dies inside step 1's transaction: a panic unwinds through
	// pgx.BeginFunc, which rolls the transaction back, as a dropped
	// connection would.
	crashing.SetBeforeCommit(func(_ uuid.UUID, step int) {
		if step == 1 {
			panic("killed")
		}
	})
	claims, err := crashing.ClaimDue(f.ctx, 1)
	require.NoError(t, err)
	require.Panics(t, func() { crashing.Execute(f.ctx, claims[0]) })
	mid := f.run(run)
	require.Equal(t, db.WorkflowRunStatusRunning, mid.Status)
	require.Equal(t, int32(1), mid.CurrentStep)
	require.Len(t, f.doorbells(run), 1)

	f.clock.Advance(lease + time.Second)
	f.drain(f.engine(lease))
	require.Equal(t, db.WorkflowRunStatusCompleted, f.run(run).Status)
	require.ElementsMatch(t, []string{"first", "second"}, contents(f.doorbells(run)))
}

func contents(evs []*nostr.Event) []string {
	out := make([]string, len(evs))
	for i, ev := range evs {
		out[i] = ev.Content
	}
	return out
}

// A step whose transaction loses its database connection (a failover, a
// proxy or pooler restart, an operator's pg_terminate_backend) is tried
// again, not ended as database_error: its writes rolled back with the
// transaction, and every step transition is fenced on the claim and the
// step, so a commit that did happen unseen cannot be recorded twice.
// Mutation killed: no retry (the run fails with database_error).
func TestStepTransactionThatLostItsConnectionIsTriedAgain(t *testing.T) {
	t.Parallel()
	f, run := twoStepRun(t)

	e := f.engine(30 * time.Second)
	terminated := 0
	e.SetBeforeCommit(func(_ uuid.UUID, step int) {
		if step != 0 || terminated > 0 {
			return
		}
		// The step's own transaction is the only one open in the database.
		require.NoError(t, f.pool.QueryRow(f.ctx, `SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
			WHERE datname = current_database() AND state = 'idle in transaction' AND pid <> pg_backend_pid()`).Scan(&terminated))
		require.Equal(t, 1, terminated)
	})
	f.drain(e)
	r := f.run(run)
	require.Equal(t, db.WorkflowRunStatusCompleted, r.Status, "error: %v %v", r.ErrorCode, r.ErrorMessage)
	require.ElementsMatch(t, []string{"first", "second"}, contents(f.doorbells(run)), "each step once")
}

// A step whose COMMIT happened but whose answer was lost is asked about
// (pg_xact_status) before it is run again: it committed, so it counts as
// done. Its doorbell reaches live subscribers like any other (published
// once, stored once), and the run goes on at once to the next step instead
// of finding its own commit, stopping, and waiting out its lease.
// Mutation killed: stepTransaction without the question (the retry finds
// step 0 done, errLostClaim, as before): "first" is never published and
// the run stays running at step 1 until its lease ends.
func TestStepCommittedUnseenRingsItsDoorbell(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	owner := f.key()
	ch := f.channel(owner)
	id := uuid.NewString()
	f.save(owner, ch, id, twoSteps)
	f.store(f.sign(owner, ingest.KindChat, "go", nostr.Tags{{"h", ch}}))
	run := f.runIDs(id)[0]

	var mu sync.Mutex
	var published []string
	f.p.OnPublish = func(_ uuid.UUID, ev *nostr.Event, _ *uuid.UUID, _ int64) {
		mu.Lock()
		defer mu.Unlock()
		published = append(published, ev.Content)
	}
	const lease = 30 * time.Second
	var cutAt atomic.Int32
	lossy := workflow.NewEngine(dbtest.PoolOn(t, f.pool.Config().ConnString(), 0, dbtest.LoseCommitAnswer(&cutAt)), f.p,
		workflow.EngineOptions{Lease: lease, Clock: clock.Stub(f.clock.Now)})
	claims, err := lossy.ClaimDue(f.ctx, 1)
	require.NoError(t, err)
	require.Len(t, claims, 1)
	cutAt.Store(1) // step 0's commit
	require.True(t, lossy.Execute(f.ctx, claims[0]))
	require.Zero(t, cutAt.Load(), "step 0's COMMIT went through the losing connection")

	r := f.run(run)
	require.Equal(t, db.WorkflowRunStatusCompleted, r.Status, "the run went on without waiting for its lease")
	require.Equal(t, int32(1), r.Attempts, "claimed once")
	require.ElementsMatch(t, []string{"first", "second"}, contents(f.doorbells(run)), "each step once")
	mu.Lock()
	defer mu.Unlock()
	require.Equal(t, []string{"first", "second"}, published, "both doorbells published to live subscribers")
}

// A step whose connection is lost in the middle of its transaction, on a
// read of its own (here the workflow row, its first statement), is tried
// again like one that lost it at COMMIT: the read's failure is a
// database_error the step ends with, and its cause must stay tellable as
// transient. Mutation killed: runFailure without Unwrap (or loadPinned
// dropping the error): the run ends as database_error after one attempt.
func TestStepThatLostItsConnectionMidTransactionIsTriedAgain(t *testing.T) {
	t.Parallel()
	f, run := twoStepRun(t)

	var cutAt atomic.Int32
	lossy := workflow.NewEngine(dbtest.PoolOn(t, f.pool.Config().ConnString(), 0, dbtest.LoseAnswerTo("-- name: WorkflowGet ", &cutAt)), f.p,
		workflow.EngineOptions{Lease: 30 * time.Second, Clock: clock.Stub(f.clock.Now)})
	claims, err := lossy.ClaimDue(f.ctx, 1)
	require.NoError(t, err)
	require.Len(t, claims, 1)
	cutAt.Store(1) // step 0's first read
	lossy.Execute(f.ctx, claims[0])
	require.Zero(t, cutAt.Load(), "step 0's workflow row read went through the losing connection")
	r := f.run(run)
	require.Equal(t, db.WorkflowRunStatusCompleted, r.Status, "error: %v %v", r.ErrorCode, r.ErrorMessage)
	require.ElementsMatch(t, []string{"first", "second"}, contents(f.doorbells(run)), "each step once")
}

// When nobody can say whether a step's COMMIT went through (its answer was
// lost, and so is the connection that would ask), the step is run again,
// and the fence finds it done: its message is not sent twice, and the run
// resumes at the next step once the lease runs out.
// Mutation killed: a step transition not fenced on the step (dropping
// `AND current_step = @step` from WorkflowRunStepDone): the second attempt
// runs step 0 again and records it, and the run goes on at once (its
// second message is a duplicate here only because the test's clock
// stands still, which gives it the first one's id).
func TestStepRunAgainAfterAnUnseenCommitIsNotDoneTwice(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	owner := f.key()
	ch := f.channel(owner)
	id := uuid.NewString()
	f.save(owner, ch, id, twoSteps)
	f.store(f.sign(owner, ingest.KindChat, "go", nostr.Tags{{"h", ch}}))
	run := f.runIDs(id)[0]

	const lease = 30 * time.Second
	var cutAt atomic.Int32
	var refuseQuestion atomic.Bool
	// The connection that asks whether the COMMIT went through fails.
	refuse := func(cfg *pgxpool.Config) {
		dial := cfg.ConnConfig.DialFunc
		cfg.ConnConfig.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
			c, err := dial(ctx, network, addr)
			if err != nil {
				return nil, err
			}
			return &questionRefuser{Conn: c, refuse: &refuseQuestion}, nil
		}
	}
	lossy := workflow.NewEngine(dbtest.PoolOn(t, f.pool.Config().ConnString(), 0, dbtest.LoseCommitAnswer(&cutAt), refuse), f.p,
		workflow.EngineOptions{Lease: lease, Clock: clock.Stub(f.clock.Now)})
	claims, err := lossy.ClaimDue(f.ctx, 1)
	require.NoError(t, err)
	require.Len(t, claims, 1)
	refuseQuestion.Store(true)
	cutAt.Store(1) // step 0's commit
	lossy.Execute(f.ctx, claims[0])
	require.Zero(t, cutAt.Load(), "step 0's COMMIT went through the losing connection")
	require.False(t, refuseQuestion.Load(), "the question was refused")
	require.Equal(t, []string{"first"}, contents(f.doorbells(run)), "step 0 once, and the run stopped there")

	f.clock.Advance(lease + time.Second)
	f.drain(f.engine(lease))
	require.Equal(t, db.WorkflowRunStatusCompleted, f.run(run).Status)
	require.ElementsMatch(t, []string{"first", "second"}, contents(f.doorbells(run)))
}

// questionRefuser fails the connection that sends pg_xact_status while
// refuse is set (once).
type questionRefuser struct {
	net.Conn
	refuse *atomic.Bool
}

func (c *questionRefuser) Write(p []byte) (int, error) {
	if bytes.Contains(p, []byte("pg_xact_status")) && c.refuse.CompareAndSwap(true, false) {
		_ = c.Conn.Close()
		return 0, errors.New("refused by the test")
	}
	return c.Conn.Write(p)
}
