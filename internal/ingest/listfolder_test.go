package ingest_test

import (
	"context"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/buzzrelay/buzz/internal/clock"
	"github.com/buzzrelay/buzz/internal/ingest"
	"github.com/buzzrelay/buzz/internal/nostr"
)

// The tests below run RunListFolder, the loop every relay process runs, on
// a real database: the tests in listfold_test.go call FoldChannelLists, one
// pass of it, directly.

// runningFolder is fp's RunListFolder, started by start and running until
// stop (or the test's end), counting its passes and keeping what it
// reported.
type runningFolder struct {
	fp     *foldProcess
	passes atomic.Int64
	mu     sync.Mutex
	errs   []error
	ctx    context.Context
	stop   context.CancelFunc
	done   chan struct{}
}

// folder prepares fp's loop. Hooks on fp's pipeline are set before start,
// as the loop reads them unsynchronised.
func (f *fixture) folder(fp *foldProcess) *runningFolder {
	r := &runningFolder{fp: fp, done: make(chan struct{})}
	ingest.OnListFoldPass(fp.p, func() { r.passes.Add(1) })
	r.ctx, r.stop = context.WithCancel(f.ctx)
	f.t.Cleanup(func() {
		r.stop()
		select {
		case <-r.done:
		case <-time.After(30 * time.Second):
		}
	})
	return r
}

func (r *runningFolder) start() *runningFolder {
	go func() {
		defer close(r.done)
		r.fp.p.RunListFolder(r.ctx, func(err error) {
			r.mu.Lock()
			r.errs = append(r.errs, err)
			r.mu.Unlock()
		})
	}()
	return r
}

func (r *runningFolder) reported() []error {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.errs)
}

// stopped stops the loop and requires it to return.
func (r *runningFolder) stopped(t *testing.T) {
	t.Helper()
	r.stop()
	select {
	case <-r.done:
	case <-time.After(30 * time.Second):
		t.Fatal("RunListFolder did not return once its context ended")
	}
}

// waitFor polls cond, generously bounded: a loaded 2-core box under -race
// may take seconds where an idle one takes milliseconds.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("gave up waiting: %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// passesAfter waits until r has completed n passes after now.
func (r *runningFolder) passesAfter(t *testing.T, n int64) {
	t.Helper()
	from := r.passes.Load()
	waitFor(t, "folder passes", func() bool { return r.passes.Load() >= from+n })
}

func listNames(lists []*nostr.Event, member string) bool {
	for _, l := range lists {
		if slices.Contains(listed(l), member) {
			return true
		}
	}
	return false
}

// Stopping the relay (its context ends) while the loop is in the middle of
// a fold returns the loop and reports nothing: the fold cut short is the
// shutdown, not a failure to log. The mark stays for the next process.
// Mutations killed: a loop that does not return when its context ends; a
// report of the cancelled fold's error.
func TestListFolderStopsWithItsContextAndReportsNothing(t *testing.T) {
	t.Parallel()
	f := newFixture(t, "folder-stop.example", 0)
	fp := f.foldProcess(2, time.Nanosecond)
	f.p = fp.p
	ch := f.channel(f.key(), false)
	f.store(f.sign(f.key(), ingest.KindJoinRequest, "", nostr.Tags{{"h", ch}}, 0))

	claimed := make(chan struct{})
	r := f.folder(fp)
	ingest.OnListClaimed(fp.p, func() {
		close(claimed)
		<-r.ctx.Done() // the relay stops while the fold is in flight
	})
	r.start()
	select {
	case <-claimed:
	case <-time.After(30 * time.Second):
		t.Fatal("the folder never claimed the due mark")
	}
	r.stopped(t)
	require.Empty(t, r.reported(), "a fold cut short by the shutdown is not reported")
	require.Equal(t, 1, f.count(`SELECT count(*) FROM channel_lists_due WHERE channel_id = $1`, ch), "the mark is left for the next process")
}

// A fold that fails (its backend terminated, as a lost connection would)
// is reported, and the loop goes on: a later pass writes the channel's
// lists. Mutations killed: a loop that returns on a failure (the lists are
// never written); a failure not reported (not logged by the relay).
func TestListFolderReportsAFailureAndWritesOnALaterPass(t *testing.T) {
	t.Parallel()
	f := newFixture(t, "folder-retry.example", 0)
	fp := f.foldProcess(2, time.Nanosecond)
	f.p = fp.p
	ch := f.channel(f.key(), false)
	joiner := f.key()
	f.store(f.sign(joiner, ingest.KindJoinRequest, "", nostr.Tags{{"h", ch}}, 0))

	var failed atomic.Bool
	ingest.OnListClaimed(fp.p, func() {
		if failed.Swap(true) {
			return
		}
		var killed int
		if err := f.pool.QueryRow(f.ctx, `SELECT count(pg_terminate_backend(pid)) FROM pg_locks
			WHERE relation = 'channel_lists_due'::regclass AND mode = 'RowShareLock' AND pid <> pg_backend_pid()
			  AND database = (SELECT oid FROM pg_database WHERE datname = current_database())`).Scan(&killed); err != nil || killed != 1 {
			t.Errorf("terminated %d backends: %v", killed, err)
		}
	})
	r := f.folder(fp).start()
	waitFor(t, "the members list naming the joiner", func() bool { return listNames(fp.published(), joiner.PublicKeyHex()) })
	r.stopped(t)
	require.Len(t, r.reported(), 1, "the failed pass is reported once")
	require.Equal(t, f.activeMembers(ch), listed(f.storedList(ch)))
	require.Zero(t, f.count(`SELECT count(*) FROM channel_lists_due`))
}

// On the pipeline's clock, the loop leaves a change alone while its
// interval runs and writes it on the first whole pass after the interval
// is up. Mutations killed: a mark due at once (written before the
// interval); a loop that stops looking after its first pass, or claims on
// a clock other than the pipeline's (never written).
func TestListFolderWritesAChangeOnceItsIntervalIsUp(t *testing.T) {
	t.Parallel()
	f := newFixture(t, "folder-interval.example", 0)
	var now atomic.Int64
	now.Store(time.Now().UnixNano())
	fp := f.foldProcessWith(ingest.Options{
		MaxFutureSkew: 10 * time.Minute, ListFoldMembers: 2, ListFoldInterval: time.Minute,
		Clock: clock.Stub(func() time.Time { return time.Unix(0, now.Load()) }),
	})
	f.p = fp.p
	ch := f.channel(f.key(), false)
	r := f.folder(fp).start()
	joiner := f.key()
	f.store(f.sign(joiner, ingest.KindJoinRequest, "", nostr.Tags{{"h", ch}}, 0))

	r.passesAfter(t, 3)
	require.False(t, listNames(fp.published(), joiner.PublicKeyHex()), "written before its interval")
	now.Add(int64(time.Minute))
	// A pass under way when the clock moved may have claimed before it;
	// the one after it started on the new time.
	r.passesAfter(t, 2)
	require.True(t, listNames(fp.published(), joiner.PublicKeyHex()), "not written on the first whole pass after its interval")
	require.Equal(t, f.activeMembers(ch), listed(f.storedList(ch)))
}

// Two relay processes run the loop on one database while members join one
// large channel, one change after another, each through either process:
// each change is written exactly once, by one of them, in a list naming
// every member then (no lost update), dated after the list before it, and
// one members list is stored. Each claim is held until the other process
// has made two passes, so the other looks for due marks while the claim is
// open. Mutations killed: a claim without FOR UPDATE SKIP LOCKED (both
// processes claim the mark and both write that change's lists); a mark not
// deleted with its fold (its lists written again on every pass).
func TestTwoListFoldersWriteEachChangeOnce(t *testing.T) {
	t.Parallel()
	f := newFixture(t, "folder-two.example", 0)
	a, b := f.foldProcess(2, time.Nanosecond), f.foldProcess(2, time.Nanosecond)
	f.p = a.p
	ch := f.channel(f.key(), false)
	createdLists := len(a.published())

	ra, rb := f.folder(a), f.folder(b)
	holdUntilPassesOf := func(o *runningFolder) func() {
		return func() {
			from := o.passes.Load()
			// Bounded: if the other process claimed the same mark (the
			// mutation), it waits here too.
			deadline := time.Now().Add(10 * time.Second)
			for o.passes.Load() < from+2 && time.Now().Before(deadline) {
				time.Sleep(5 * time.Millisecond)
			}
		}
	}
	ingest.OnListClaimed(a.p, holdUntilPassesOf(rb))
	ingest.OnListClaimed(b.p, holdUntilPassesOf(ra))
	ra.start()
	rb.start()

	all := func() []*nostr.Event { return append(a.published()[createdLists:], b.published()...) }
	const changes = 4
	for i := range changes {
		via := []*foldProcess{a, b}[i%2]
		joiner := f.key()
		ev := f.sign(joiner, ingest.KindJoinRequest, "", nostr.Tags{{"h", ch}}, 0)
		out, err := via.p.Submit(f.ctx, f.tenant, ev.PubKey, ev)
		require.NoError(t, err)
		require.Equal(t, ingest.Stored, out)
		waitFor(t, "the list naming joiner "+joiner.PublicKeyHex(), func() bool { return listNames(all(), joiner.PublicKeyHex()) })
		lists := all()
		require.Len(t, lists, i+1, "change %d: each change is written once", i)
		naming := slices.IndexFunc(lists, func(l *nostr.Event) bool { return slices.Contains(listed(l), joiner.PublicKeyHex()) })
		require.Equal(t, f.activeMembers(ch), listed(lists[naming]), "change %d: the list names every member", i)
	}
	// A repeated write would come on a later pass of either process.
	ra.passesAfter(t, 2)
	rb.passesAfter(t, 2)
	ra.stopped(t)
	rb.stopped(t)
	lists := all()
	require.Len(t, lists, changes)
	slices.SortFunc(lists, func(x, y *nostr.Event) int { return int(x.CreatedAt - y.CreatedAt) })
	for i := 1; i < len(lists); i++ {
		require.Greater(t, lists[i].CreatedAt, lists[i-1].CreatedAt, "two lists share a date")
		require.Greater(t, len(listed(lists[i])), len(listed(lists[i-1])), "a list dated later names fewer members")
	}
	require.Equal(t, 1, f.count(`SELECT count(*) FROM events WHERE kind = $1 AND d_tag = $2`, ingest.KindGroupMembers, ch))
	require.Equal(t, lists[len(lists)-1].ID, f.storedList(ch).ID)
}
