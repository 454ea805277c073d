package workflow_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/buzzrelay/buzz/internal/clock"
	"github.com/buzzrelay/buzz/internal/community"
	"github.com/buzzrelay/buzz/internal/db"
	"github.com/buzzrelay/buzz/internal/ingest"
	"github.com/buzzrelay/buzz/internal/nostr"
	"github.com/buzzrelay/buzz/internal/workflow"
	"github.com/buzzrelay/buzz/internal/workflow/safehttp"
)

// One community's backlog of slow runs does not hold every worker slot of
// the process: with two slots, community A's three runs (older, each held
// by a webhook that does not answer) take one, and community B's run, last
// in line, takes the other and completes while A's calls still hang.
//
// Mutation killed: claiming oldest first without the per-community share
// (the worker calling ClaimDue as before) gives both slots to A, and B's
// run waits until A's calls end.
func TestOneCommunitysSlowRunsLeaveSlotsForOthers(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	srv, release, e := f.engineWithHangingHook()

	// Community A: three runs whose webhook hangs.
	owner := f.key()
	ch := f.channel(owner)
	slow := uuid.NewString()
	f.save(owner, ch, slow, "name: Slow\ntrigger: {on: message_posted}\nsteps: [{id: hang, action: call_webhook, url: '"+srv.URL+"/hang', body: x}]")
	for range 3 {
		f.store(f.sign(owner, ingest.KindChat, "slow "+uuid.NewString(), nostr.Tags{{"h", ch}}))
	}
	f.clock.Advance(time.Second) // B's run is the newest

	// Community B, in the same database: one quick run.
	row, err := db.New(f.pool).CommunityCreate(f.ctx, "wf-b-"+uuid.NewString()[:8]+".example")
	require.NoError(t, err)
	b := community.FromRow(row)
	storeB := func(ev *nostr.Event) {
		out, _, err := f.p.SubmitReply(f.ctx, b, ev.PubKey, ev)
		require.NoError(t, err)
		require.Equal(t, ingest.Stored, out)
	}
	bOwner, bChannel, quick := f.key(), uuid.NewString(), uuid.NewString()
	storeB(f.sign(bOwner, ingest.KindCreateGroup, "", nostr.Tags{{"h", bChannel}, {"name", "b"}}))
	storeB(f.sign(bOwner, workflow.KindDefinition, "name: Quick\ntrigger: {on: message_posted}\nsteps: [{id: say, action: send_message, text: hi}]", nostr.Tags{{"d", quick}, {"h", bChannel}}))
	storeB(f.sign(bOwner, ingest.KindChat, "go", nostr.Tags{{"h", bChannel}}))
	var bRun uuid.UUID
	require.NoError(t, f.pool.QueryRow(f.ctx, `SELECT id FROM workflow_runs WHERE community_id = $1 AND workflow_id = $2`, b.ID(), quick).Scan(&bRun))

	ctx, stop := context.WithCancel(context.Background())
	w := workflow.NewWorker(e, workflow.WorkerOptions{MaxInFlight: 2, Poll: 20 * time.Millisecond})
	done := make(chan struct{})
	go func() { defer close(done); w.Run(ctx) }()
	t.Cleanup(func() { close(release); stop(); <-done }) // the worker waits for its runs

	status := func() db.WorkflowRunStatus {
		r, err := db.New(f.pool).WorkflowRunGet(f.ctx, db.WorkflowRunGetParams{CommunityID: b.ID(), ID: bRun})
		require.NoError(t, err)
		return r.Status
	}
	require.Eventually(t, func() bool { return status() == db.WorkflowRunStatusCompleted }, 20*time.Second, 20*time.Millisecond,
		"community B's run waited behind community A's hanging runs")
	require.Zero(t, f.count(`SELECT count(*) FROM workflow_runs WHERE community_id = $1 AND workflow_id = $2 AND completed_at IS NOT NULL`, f.tenant.ID(), slow),
		"no run of A ended to make room: its calls still hang")
}

// A run handed to the worker while its community holds its share is not
// claimed by the hand-off (the shares decide that on the poll), so the poll
// runs at once for it: a process serving only this community fills its
// free slots with it, as the poll would, instead of after BUZZ_WORKFLOW_POLL
// (here an hour). Runs created on this process go to the worker at once.
//
// Mutation killed: the hand-off case without its poll.Reset(0) when it
// passed over runs while a community held its share (the run waits for
// the hour-long poll).
func TestHandedOffRunOfACommunityAtItsShareStartsAtOnce(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	srv, release, e := f.engineWithHangingHook()

	owner := f.key()
	slowCh, quickCh := f.channel(owner), f.channel(owner)
	slow, quick := uuid.NewString(), uuid.NewString()
	f.save(owner, slowCh, slow, "name: Slow\ntrigger: {on: message_posted}\nsteps: [{id: hang, action: call_webhook, url: '"+srv.URL+"/hang', body: x}]")
	f.save(owner, quickCh, quick, "name: Quick\ntrigger: {on: message_posted}\nsteps: [{id: say, action: send_message, text: hi}]")
	// Two hanging runs: the community's share of four slots.
	for range 2 {
		f.store(f.sign(owner, ingest.KindChat, "slow "+uuid.NewString(), nostr.Tags{{"h", slowCh}}))
		<-f.offers // claimed by the worker's first poll instead
	}

	ctx, stop := context.WithCancel(context.Background())
	w := workflow.NewWorker(e, workflow.WorkerOptions{MaxInFlight: 4, Poll: time.Hour})
	done := make(chan struct{})
	go func() { defer close(done); w.Run(ctx) }()
	t.Cleanup(func() { close(release); stop(); <-done })
	require.Eventually(t, func() bool {
		return f.count(`SELECT count(*) FROM workflow_runs WHERE community_id = $1 AND workflow_id = $2 AND status = 'running'`, f.tenant.ID(), slow) == 2
	}, 20*time.Second, 20*time.Millisecond, "the worker's first polls claim the hanging runs")

	f.store(f.sign(owner, ingest.KindChat, "quick", nostr.Tags{{"h", quickCh}}))
	w.Offer(f.tenant.ID(), <-f.offers)
	require.Eventually(t, func() bool {
		return f.count(`SELECT count(*) FROM workflow_runs WHERE community_id = $1 AND workflow_id = $2 AND status = 'completed'`, f.tenant.ID(), quick) == 1
	}, 20*time.Second, 20*time.Millisecond, "the handed-off run waited for the poll although two slots were free")
}

// engineWithHangingHook is an engine whose webhook calls reach srv, a TLS
// hook on loopback that answers each call only once release is closed (the
// test closes it), with leases and timeouts of an hour, so a call hangs as
// long as the test needs.
func (f *fixture) engineWithHangingHook() (*httptest.Server, chan struct{}, *workflow.Engine) {
	release := make(chan struct{})
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.ReadAll(r.Body)
		select {
		case <-release:
		case <-r.Context().Done():
		}
		_, _ = io.WriteString(w, "ok")
	}))
	f.t.Cleanup(srv.Close)
	client := safehttp.New(safehttp.Options{
		AllowedNets: []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8"), netip.MustParsePrefix("::1/128")},
		RootCAs:     srv.Client().Transport.(*http.Transport).TLSClientConfig.RootCAs,
		Timeout:     time.Hour,
	})
	return srv, release, workflow.NewEngine(f.pool, f.p, workflow.EngineOptions{Lease: time.Hour, StepTimeout: time.Hour, Clock: clock.Stub(f.clock.Now), Webhooks: client})
}

// A run created by an event is claimed by the worker's hand-off, which
// looks it up by its community and id, without waiting for the poll (here
// an hour).
//
// Mutation killed: the triggers handing off the run's id with another
// community (uuid.Nil): the by-id claim finds no such run and the run
// waits for the poll.
func TestHandedOffRunIsClaimedWithoutThePoll(t *testing.T) {
	t.Parallel()
	var w *workflow.Worker
	f := newFixtureWith(t, ingest.Options{}, workflow.Triggers{Offer: func(c uuid.UUID, ids []uuid.UUID) { w.Offer(c, ids) }})
	owner := f.key()
	ch := f.channel(owner)
	id := uuid.NewString()
	f.save(owner, ch, id, twoSteps)
	// A first run, claimed by the worker's first polls: after it ended
	// the next poll is an hour away.
	f.store(f.sign(owner, ingest.KindChat, "first", nostr.Tags{{"h", ch}}))
	ctx, stop := context.WithCancel(context.Background())
	w = workflow.NewWorker(f.engine(time.Minute), workflow.WorkerOptions{MaxInFlight: 4, Poll: time.Hour})
	done := make(chan struct{})
	go func() { defer close(done); w.Run(ctx) }()
	t.Cleanup(func() { stop(); <-done })
	completed := func() int {
		return f.count(`SELECT count(*) FROM workflow_runs WHERE community_id = $1 AND workflow_id = $2 AND status = 'completed'`, f.tenant.ID(), id)
	}
	require.Eventually(t, func() bool { return completed() == 1 }, 20*time.Second, 20*time.Millisecond)

	f.store(f.sign(owner, ingest.KindChat, "second", nostr.Tags{{"h", ch}}))
	require.Eventually(t, func() bool { return completed() == 2 }, 20*time.Second, 20*time.Millisecond,
		"the handed-off run waited for the poll")
}

// A slot freed while a community's due runs wait for it (the community at
// its share, the others' reserve kept free) is filled when the run ends,
// not at the next poll: a poll that came back empty only because of the
// shares said nothing about the runs waiting. With the poll an hour away,
// one community's 60 quick runs all complete.
//
// Mutation killed: the worker not polling again when a run ends after such
// an empty poll (as before): the runs stop once the slots beyond the
// reserve are taken, and wait for the next poll, here an hour.
func TestSlotsFreedBehindACommunityAtItsShareAreRefilledAtOnce(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	owner := f.key()
	ch := f.channel(owner)
	id := uuid.NewString()
	f.save(owner, ch, id, "name: Quick\ntrigger: {on: message_posted}\nsteps: [{id: say, action: send_message, text: hi}]")
	const runs = 60
	for i := range runs {
		f.store(f.sign(owner, ingest.KindChat, fmt.Sprintf("go %d", i), nostr.Tags{{"h", ch}}))
	}

	ctx, stop := context.WithCancel(context.Background())
	// Ten slots: a community's share is five, one is the others' reserve.
	w := workflow.NewWorker(f.engine(time.Minute), workflow.WorkerOptions{MaxInFlight: 10, Poll: time.Hour})
	done := make(chan struct{})
	go func() { defer close(done); w.Run(ctx) }()
	t.Cleanup(func() { stop(); <-done })

	completed := func() int {
		return f.count(`SELECT count(*) FROM workflow_runs WHERE community_id = $1 AND workflow_id = $2 AND status = 'completed'`, f.tenant.ID(), id)
	}
	require.Eventually(t, func() bool { return completed() == runs }, 60*time.Second, 20*time.Millisecond,
		"runs due waited for the next poll while slots were free")
}
