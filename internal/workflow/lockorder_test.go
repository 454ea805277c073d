package workflow_test

import (
	"context"
	"errors"
	"math/rand/v2"
	"sort"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/buzzrelay/buzz/internal/clock"
	"github.com/buzzrelay/buzz/internal/fanout"
	"github.com/buzzrelay/buzz/internal/ingest"
	"github.com/buzzrelay/buzz/internal/nostr"
	"github.com/buzzrelay/buzz/internal/workflow"
)

// deadlockCounter counts the statements PostgreSQL failed with 40P01
// (deadlock detected), whichever code path ran them.
type deadlockCounter struct{ n atomic.Int64 }

func (c *deadlockCounter) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	return ctx
}

func (c *deadlockCounter) TraceQueryEnd(_ context.Context, _ *pgx.Conn, data pgx.TraceQueryEndData) {
	var pgErr *pgconn.PgError
	if errors.As(data.Err, &pgErr) && pgErr.Code == "40P01" {
		c.n.Add(1)
	}
}

// Decisions and the events that trigger workflows, sent at once through
// two pipelines (two relay processes), each committing its events in
// groups: no deadlock. A message locks its channel's workflows in id order
// (WorkflowLockForRuns); a decision used to lock its approval's workflow
// too (FOR SHARE), and a group takes its events' locks in arrival order, so
// a group holding a decision of the second workflow's approval and then a
// decision (or a message) of the first deadlocked with a message locking
// the first and waiting for the second. A decision now locks only its
// approval, then its run, and no workflow row: it shares no lock with a
// trigger.
//
// The pipelines' connections detect deadlocks after 20 ms rather than 1 s,
// so that the detector, not a group's 250 ms lock timeout, breaks each
// cycle: with the defaults most cycles end as a lock wait cut short and the
// event written again alone, and only one whose waits began far enough
// apart fails with 40P01 (told to the client, "send it again", when the
// event was already alone).
//
// Mutation killed: the decision's workflow read FOR SHARE again (the
// former WorkflowLockForDecision): deadlocks are counted.
func TestDecisionsAndTriggersNeverDeadlock(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	owner, approver := f.key(), f.key()
	ch := f.channel(owner, approver)
	ids := []string{uuid.NewString(), uuid.NewString()}
	sort.Strings(ids)
	for _, id := range ids {
		f.save(owner, ch, id, approvalYAML("any"))
	}
	// Every message starts a run of each workflow; run to their approvals.
	const waiting = 60
	for i := 0; i < waiting; i++ {
		f.store(f.sign(owner, ingest.KindChat, "ship "+strconv.Itoa(i), nostr.Tags{{"h", ch}}))
	}
	f.drain(f.engine(time.Minute))
	var refs []string
	rows, err := f.pool.Query(f.ctx, `SELECT encode(token, 'hex') FROM workflow_approvals WHERE community_id = $1 AND status = 'pending'`, f.tenant.ID())
	require.NoError(t, err)
	for rows.Next() {
		var ref string
		require.NoError(t, rows.Scan(&ref))
		refs = append(refs, ref)
	}
	require.NoError(t, rows.Err())
	require.Len(t, refs, 2*waiting)
	rand.Shuffle(len(refs), func(i, j int) { refs[i], refs[j] = refs[j], refs[i] })

	cfg, err := pgxpool.ParseConfig(f.pool.Config().ConnString())
	require.NoError(t, err)
	cfg.MaxConns = 8
	cfg.ConnConfig.RuntimeParams["deadlock_timeout"] = "20ms"
	deadlocks := &deadlockCounter{}
	cfg.ConnConfig.Tracer = deadlocks
	pool, err := pgxpool.NewWithConfig(f.ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	var pipelines []*ingest.Pipeline
	for range 2 {
		p := ingest.New(pool, fanout.NewHub(), ingest.Options{MaxFutureSkew: time.Minute, Clock: clock.Stub(f.clock.Now)})
		workflow.RegisterTriggers(p, &workflow.Triggers{})
		pipelines = append(pipelines, p)
	}

	// Each sender sends, in turn, a decision and a message; the senders of
	// both pipelines go at once, so their events meet in groups in every
	// order.
	const senders = 8
	events := make(chan *nostr.Event)
	go func() {
		defer close(events)
		for i, ref := range refs {
			events <- f.sign(approver, workflow.KindApprovalGrant, "", nostr.Tags{{"d", ref}})
			events <- f.sign(owner, ingest.KindChat, "go "+strconv.Itoa(i), nostr.Tags{{"h", ch}})
		}
	}()
	var wg sync.WaitGroup
	var mu sync.Mutex
	var failures []error
	for s := range senders {
		p := pipelines[s%len(pipelines)]
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ev := range events {
				if _, _, err := p.SubmitReply(f.ctx, f.tenant, ev.PubKey, ev); err != nil {
					mu.Lock()
					failures = append(failures, err)
					mu.Unlock()
				}
			}
		}()
	}
	wg.Wait()
	t.Logf("deadlocks detected: %d; events refused: %d", deadlocks.n.Load(), len(failures))
	require.Zero(t, deadlocks.n.Load(), "PostgreSQL detected deadlocks")
	if len(failures) > 0 {
		require.Failf(t, "events refused", "%d, the first: %v", len(failures), failures[0])
	}
	require.Equal(t, 2*waiting, f.count(`SELECT count(*) FROM workflow_approvals WHERE community_id = $1 AND status = 'granted'`, f.tenant.ID()))
}

// A workflow save, registered by RegisterTriggers, locks its channel's row
// and so declares it (ingest.Handler.LocksChannelRow): it is a group of its
// own, waits only the short wait of such a group for the row, and is then
// handed on to run alone in its channel's line of changes. The row here is
// held by the test, as a large channel's list fold holds it; once the
// save's group has given up (a group that settled nothing), the row is
// released and the save stored.
// Mutation killed: LocksChannelRow dropped from the definition handler
// (the save waits in an ordinary group, gives up after the groups' lock
// timeout and runs alone outside the line: never handed on as a change).
func TestWorkflowSaveIsHandedOnAsAChangeOfItsChannel(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	var handedOn, settledNothing atomic.Int64
	f.p.OnChangeAlone = func() { handedOn.Add(1) }
	f.p.OnGroup = func(st ingest.GroupStats) {
		if st.Events == 0 {
			settledNothing.Add(1)
		}
	}
	owner := f.key()
	ch := f.channel(owner)
	f.save(owner, ch, uuid.NewString(), boundedYAML)
	require.Zero(t, handedOn.Load(), "a save whose row was free was handed on")

	fold, err := f.pool.Begin(f.ctx)
	require.NoError(t, err)
	defer func() { _ = fold.Rollback(f.ctx) }()
	_, err = fold.Exec(f.ctx, `SELECT 1 FROM channels WHERE id = $1 FOR NO KEY UPDATE`, ch)
	require.NoError(t, err)
	saved := make(chan error, 1)
	go func() {
		_, err := f.submit(f.sign(owner, workflow.KindDefinition, boundedYAML, nostr.Tags{{"d", uuid.NewString()}, {"h", ch}}))
		saved <- err
	}()
	require.Eventually(t, func() bool { return settledNothing.Load() == 1 }, 30*time.Second, 2*time.Millisecond,
		"the save's group never gave up its wait for the row")
	require.NoError(t, fold.Rollback(f.ctx))
	require.NoError(t, <-saved)
	require.EqualValues(t, 1, handedOn.Load(), "the save was not handed on as a change of its channel")
}
