package workflow_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/buzzrelay/buzz/internal/db"
	"github.com/buzzrelay/buzz/internal/ingest"
	"github.com/buzzrelay/buzz/internal/nostr"
	"github.com/buzzrelay/buzz/internal/workflow"
)

// A worker told to stop (serve's SIGTERM) finishes the step in flight and
// records it, but starts no further step of that run: `buzz-relay serve`
// waits for its workers within a 15 s budget, and a step started after the
// signal (here a second webhook call) can be cut off by that budget with
// its outcome unknown. The run is handed back, due at once, so another
// worker resumes it at its next step without waiting out the lease.
// Mutations killed: Execute running the rest of the run after the stop
// (two calls); returning without the hand-back (the run stays running,
// claimed, until its lease ends).
func TestStoppedWorkerStartsNoFurtherStep(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	owner := f.key()
	ch := f.channel(owner)
	var calls atomic.Int32
	first, release := make(chan struct{}), make(chan struct{})
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.ReadAll(r.Body)
		if calls.Add(1) == 1 {
			close(first)
			<-release
		}
		_, _ = io.WriteString(w, "ok")
	}))
	t.Cleanup(srv.Close)
	e := f.engineCalling(srv)
	id := uuid.NewString()
	f.save(owner, ch, id, "name: Two\ntrigger: {on: message_posted}\nsteps:\n"+
		"  - {id: one, action: call_webhook, url: '"+srv.URL+"/one', body: 'x'}\n"+
		"  - {id: two, action: call_webhook, url: '"+srv.URL+"/two', body: 'y'}\n")
	f.store(f.sign(owner, ingest.KindChat, "go", nostr.Tags{{"h", ch}}))

	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	w := workflow.NewWorker(e, workflow.WorkerOptions{MaxInFlight: 1, Poll: 50 * time.Millisecond})
	done := make(chan struct{})
	go func() { defer close(done); w.Run(ctx) }()
	select {
	case <-first:
	case <-time.After(30 * time.Second):
		t.Fatal("the first webhook was never called")
	}
	stop() // SIGTERM while step one's call is in flight
	close(release)
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("the worker did not return")
	}
	require.EqualValues(t, 1, calls.Load(), "a step was started after the worker was told to stop")
	runID := f.runIDs(id)[0]
	run := f.run(runID)
	require.EqualValues(t, 1, run.CurrentStep, "step one is recorded")
	require.Equal(t, db.WorkflowRunStatusPending, run.Status, "handed back")

	// Another worker resumes it now, at step two, on the clock that has
	// not moved: no lease to wait out.
	claims, err := f.engine(time.Minute).ClaimDue(f.ctx, 10)
	require.NoError(t, err)
	require.Len(t, claims, 1)
	require.Equal(t, runID, claims[0].Run.ID)
	require.EqualValues(t, 1, claims[0].Run.CurrentStep)
}
