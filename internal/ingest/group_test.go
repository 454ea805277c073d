package ingest_test

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/buzzrelay/buzz/internal/community"
	"github.com/buzzrelay/buzz/internal/db"
	"github.com/buzzrelay/buzz/internal/fanout"
	"github.com/buzzrelay/buzz/internal/ingest"
	"github.com/buzzrelay/buzz/internal/nostr"
)

// Group commit: concurrent events share one transaction, each under its own
// savepoint. These tests line events up into one group deterministically:
// a "gate" event holds the only writer inside its group (a side row that
// waits), the events under test queue behind it, and once all are queued
// the gate opens and the writer takes them as the next group.

// grouped gives f a pipeline with one group writer and opts.
func (f *fixture) grouped(opts ingest.Options) {
	opts.MaxFutureSkew = time.Minute
	if opts.GroupWriters == 0 {
		opts.GroupWriters = 1
	}
	f.p = ingest.New(f.pool, fanout.NewHub(), opts)
}

type gate struct {
	release chan struct{}
	once    sync.Once
	done    chan error
	reached chan struct{}
}

// holdWriter submits an event whose side row waits for the gate to open,
// and returns once the writer is held inside that event's group.
func (f *fixture) holdWriter() *gate {
	f.t.Helper()
	ev, g := f.gateEvent()
	go func() { _, err := f.submit(ev); g.done <- err }()
	g.waitReached(f.t)
	return g
}

// gateEvent signs an event whose side row, when its group writes it, waits
// for the returned gate to open. The caller submits it and sends the
// submission's error to g.done.
func (f *fixture) gateEvent() (*nostr.Event, *gate) {
	f.t.Helper()
	ev := f.sign(f.key(), 1, "gate", nostr.Tags{{"t", "gate"}}, 0)
	g := &gate{release: make(chan struct{}), done: make(chan error, 1), reached: make(chan struct{})}
	f.p.RegisterSideRows(ingest.SideRows{
		Needs: func(e *nostr.Event) bool { return e.ID == ev.ID },
		Apply: func(context.Context, *ingest.Write) error {
			close(g.reached)
			<-g.release
			return nil
		},
	})
	// A failing test must not leave the writer (and its connection) held.
	f.t.Cleanup(func() { g.once.Do(func() { close(g.release) }) })
	return ev, g
}

// waitReached returns once a writer is held inside the gate event's group.
func (g *gate) waitReached(t *testing.T) {
	t.Helper()
	select {
	case <-g.reached:
	case err := <-g.done:
		t.Fatalf("the gate event finished before its side row: %v", err)
	case <-time.After(30 * time.Second):
		t.Fatal("no writer reached the gate event")
	}
}

func (g *gate) open(t *testing.T) {
	g.once.Do(func() { close(g.release) })
	require.NoError(t, <-g.done)
}

// waitQueued waits until n events wait for a group writer.
func waitQueued(t *testing.T, p *ingest.Pipeline, n int) {
	t.Helper()
	require.Eventually(t, func() bool { return p.WaitingEvents() == n },
		30*time.Second, 2*time.Millisecond, "events never queued behind the gate")
}

type result struct {
	outcome ingest.Outcome
	err     error
}

// submitTogether submits every event concurrently and returns a channel per event.
func (f *fixture) submitTogether(events []*nostr.Event) []chan result {
	out := make([]chan result, len(events))
	for i, ev := range events {
		out[i] = make(chan result, 1)
		go func() {
			o, err := f.submit(ev)
			out[i] <- result{o, err}
		}()
	}
	return out
}

// requireUnanswered fails if any of results has its answer already.
func requireUnanswered(t *testing.T, results []chan result, while string) {
	t.Helper()
	for i, r := range results {
		select {
		case got := <-r:
			t.Fatalf("event %d was answered (%v, %v) %s", i, got.outcome, got.err, while)
		default:
		}
	}
}

// requireStored waits for every one of results and requires it stored;
// stillWaits says what a result that never comes means.
func requireStored(t *testing.T, results []chan result, stillWaits string) {
	t.Helper()
	for i, r := range results {
		select {
		case got := <-r:
			require.NoError(t, got.err, "event %d", i)
			require.Equal(t, ingest.Stored, got.outcome, "event %d", i)
		case <-time.After(30 * time.Second):
			t.Fatalf("event %d still waits: %s", i, stillWaits)
		}
	}
}

// recordTransactions makes the test database note, for every event row
// written, the top-level transaction that wrote it (a row written under a
// savepoint carries the subtransaction's id in xmin, so xmin cannot tell).
func (f *fixture) recordTransactions() {
	f.t.Helper()
	_, err := f.pool.Exec(f.ctx, `
		CREATE TABLE test_event_tx (id bytea, tx bigint);
		CREATE FUNCTION test_note_tx() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN INSERT INTO test_event_tx VALUES (NEW.id, txid_current()); RETURN NEW; END $$;
		CREATE TRIGGER test_note_tx AFTER INSERT ON events FOR EACH ROW EXECUTE FUNCTION test_note_tx();`)
	require.NoError(f.t, err)
}

// transactions reports how many committed transactions stored the events.
func (f *fixture) transactions(events ...*nostr.Event) int {
	ids := make([]string, len(events))
	for i, ev := range events {
		ids[i] = ev.ID
	}
	return f.count(`SELECT count(DISTINCT tx) FROM test_event_tx WHERE encode(id, 'hex') = ANY($1)`, ids)
}

// One group holds stored notes, a duplicate pair, an event refused by its
// side row after its row was written, an event refused by the database
// inside a run of plain inserts, and a channel event refused by Prepare.
// Each gets its own answer; the stored ones commit in one transaction and
// only the stored ones run their after-commit steps.
//
// Mutations killed: skipping ROLLBACK TO SAVEPOINT for a refused event (its
// row commits although the client was refused: "a refused event is not
// stored"); running after-commit steps for a refused event (the hook count);
// not running a refused event's rollback steps (OnRollback), or running a
// stored one's;
// a plain-insert run that fails as a whole instead of per event (the poison
// takes the stored notes with it: they run alone, and the "one transaction"
// assertion fails).
func TestGroupRefusalsStayWithTheirEvent(t *testing.T) {
	t.Parallel()
	f := newFixture(t, "group-refusals.example", 0)
	f.grouped(ingest.Options{})
	_, err := f.pool.Exec(f.ctx, `ALTER TABLE events ADD CONSTRAINT test_no_poison CHECK (content <> 'poison')`)
	require.NoError(t, err)
	f.recordTransactions()

	key := f.key()
	var notes []*nostr.Event
	for i := range 6 {
		notes = append(notes, f.sign(key, 1, fmt.Sprint("note ", i), nil, 0))
	}
	sideRefused := f.sign(key, 1, "refused by a side row", nostr.Tags{{"t", "refuse"}}, 0)
	unknownChannel := f.sign(key, 9, "into nowhere", nostr.Tags{{"h", "00000000-0000-4000-8000-000000000000"}}, 0)

	var afterCommit, onRollback sync.Map
	count := func(m *sync.Map, id string) func() {
		return func() {
			n, _ := m.LoadOrStore(id, new(atomic.Int32))
			n.(*atomic.Int32).Add(1)
		}
	}
	f.p.RegisterSideRows(ingest.SideRows{
		Needs: func(ev *nostr.Event) bool { return ev.Kind == 1 && ev.Content != "gate" },
		Apply: func(_ context.Context, w *ingest.Write) error {
			id := w.Event.ID
			w.AfterCommit(count(&afterCommit, id))
			w.OnRollback(count(&onRollback, id))
			if w.Event.Tags.First("t") != nil && w.Event.Tags.First("t")[1] == "refuse" {
				return ingest.Reject("invalid", "refused by a side row")
			}
			return nil
		},
	})

	g := f.holdWriter()
	// The kind-1 notes have a side row, so each takes a savepoint of its
	// own; the kind-1111 events are plain inserts sent as one run.
	var plain []*nostr.Event
	for i := range 4 {
		plain = append(plain, f.sign(key, 1111, fmt.Sprint("plain ", i), nil, 0))
	}
	plainPoison := f.sign(key, 1111, "poison", nil, 0)
	batch := append([]*nostr.Event{}, notes...)
	batch = append(batch, notes[0], sideRefused, plain[0], plain[1], plainPoison, plain[2], plain[3], unknownChannel)
	results := f.submitTogether(batch)
	waitQueued(t, f.p, len(batch))
	g.open(t)

	got := make([]result, len(batch))
	for i := range batch {
		got[i] = <-results[i]
	}
	stored := append(append([]*nostr.Event{}, notes...), plain...)
	for i, ev := range batch {
		switch {
		case ev == sideRefused:
			requireRejection(t, got[i].err, "invalid: refused by a side row")
		case ev == plainPoison:
			var rej *ingest.Rejection
			require.True(t, errors.As(got[i].err, &rej), "the poison is refused, got %v", got[i].err)
			require.Equal(t, "invalid", rej.Prefix)
		case ev == unknownChannel:
			requireRejection(t, got[i].err, "restricted: channel does not exist or is private to its members")
		default:
			require.NoError(t, got[i].err, "event %d", i)
			require.Contains(t, []ingest.Outcome{ingest.Stored, ingest.Duplicate}, got[i].outcome)
		}
	}
	for _, ev := range []*nostr.Event{sideRefused, plainPoison, unknownChannel} {
		require.Zero(t, f.count(`SELECT count(*) FROM events WHERE encode(id, 'hex') = $1`, ev.ID), "a refused event is not stored")
	}
	for _, ev := range stored {
		require.Equal(t, 1, f.count(`SELECT count(*) FROM events WHERE encode(id, 'hex') = $1`, ev.ID))
	}
	require.Equal(t, 1, f.transactions(stored...), "the group commits in one transaction")
	dupes := 0
	for i, ev := range batch {
		if ev == notes[0] && got[i].outcome == ingest.Duplicate {
			dupes++
		}
	}
	require.Equal(t, 1, dupes, "one of the two copies is the duplicate")
	for _, ev := range notes {
		n, ok := afterCommit.Load(ev.ID)
		require.True(t, ok)
		require.Equal(t, int32(1), n.(*atomic.Int32).Load(), "after-commit steps run once per stored event")
	}
	_, ran := afterCommit.Load(sideRefused.ID)
	require.False(t, ran, "a refused event runs no after-commit step")
	n, ok := onRollback.Load(sideRefused.ID)
	require.True(t, ok, "a refused event runs its rollback steps")
	require.Equal(t, int32(1), n.(*atomic.Int32).Load(), "once")
	for _, ev := range notes {
		_, ran := onRollback.Load(ev.ID)
		require.False(t, ran, "a stored event runs no rollback step")
	}
}

func requireRejection(t *testing.T, err error, want string) {
	t.Helper()
	var rej *ingest.Rejection
	require.True(t, errors.As(err, &rej), "want rejection %q, got %v", want, err)
	require.Equal(t, want, rej.Error())
}

// An event's answer waits for the commit of the group that holds it. Event
// a is first in a group whose second event, b, holds the group open until a
// has answered (or a second has passed): a must be readable from another
// session the moment it is answered.
//
// Mutation killed: answering the group's events before COMMIT (closing
// their done channels ahead of it): a is answered while b holds the group
// open, and is not yet visible.
func TestGroupAnswersOnlyAfterCommit(t *testing.T) {
	t.Parallel()
	f := newFixture(t, "group-commit-first.example", 0)
	f.grouped(ingest.Options{})
	key := f.key()
	a := f.sign(key, 1111, "first in the group", nil, 0)
	b := f.sign(key, 1, "holds the group open", nostr.Tags{{"t", "hold"}}, 0)
	aAnswered := make(chan struct{})
	f.p.RegisterSideRows(ingest.SideRows{
		Needs: func(ev *nostr.Event) bool { return ev.ID == b.ID },
		Apply: func(context.Context, *ingest.Write) error {
			select {
			case <-aAnswered:
			case <-time.After(time.Second):
			}
			return nil
		},
	})

	g := f.holdWriter()
	aResult := f.submitTogether([]*nostr.Event{a})[0]
	waitQueued(t, f.p, 1)
	bResult := f.submitTogether([]*nostr.Event{b})[0]
	waitQueued(t, f.p, 2)
	g.open(t)

	r := <-aResult
	visible := f.count(`SELECT count(*) FROM events WHERE encode(id, 'hex') = $1`, a.ID)
	close(aAnswered)
	require.NoError(t, r.err)
	require.Equal(t, ingest.Stored, r.outcome)
	require.Equal(t, 1, visible, "an answered event is committed")
	require.NoError(t, (<-bResult).err)
}

// An event that waits for a lock another session holds leaves its group
// after the group's lock timeout and runs in its own transaction: the rest
// of the group commits meanwhile, and the event's after-commit steps run
// once, from the attempt that committed.
//
// Its rollback steps (OnRollback) run once, for the attempt that rolled
// back, and never for the one that committed.
//
// Mutations killed: no lock_timeout in the group's transaction (the plain
// notes wait behind the lock); keeping the after-commit steps of the
// rolled-back attempt (neither the savepoint rollback nor the retry resets
// the Write: the hook runs twice); reset not running the rollback steps
// (they never run: the outbox hand-off's room would stay reserved).
func TestGroupDoesNotWaitForALockedEvent(t *testing.T) {
	t.Parallel()
	f := newFixture(t, "group-lock-wait.example", 0)
	f.grouped(ingest.Options{GroupLockTimeout: 50 * time.Millisecond})
	owner := f.key()
	channel := uuid.MustParse(f.channel(owner, false))
	locked := f.sign(owner, 1, "needs the channel row", nostr.Tags{{"t", "locked"}}, 0)
	var hooks, rollbacks atomic.Int32
	f.p.RegisterSideRows(ingest.SideRows{
		Needs: func(ev *nostr.Event) bool { return ev.ID == locked.ID },
		Apply: func(_ context.Context, w *ingest.Write) error {
			w.AfterCommit(func() { hooks.Add(1) })
			w.OnRollback(func() { rollbacks.Add(1) })
			return nil
		},
	})
	f.p.RegisterSideRows(ingest.SideRows{
		Needs: func(ev *nostr.Event) bool { return ev.ID == locked.ID },
		Apply: func(ctx context.Context, w *ingest.Write) error {
			_, err := w.Q.ChannelLockForChange(ctx, db.ChannelLockForChangeParams{CommunityID: w.Tenant.ID(), ID: channel})
			return err
		},
	})

	holder, err := f.pool.Begin(f.ctx)
	require.NoError(t, err)
	defer func() { _ = holder.Rollback(f.ctx) }()
	_, err = db.New(holder).ChannelLockForChange(f.ctx, db.ChannelLockForChangeParams{CommunityID: f.tenant.ID(), ID: channel})
	require.NoError(t, err)

	g := f.holdWriter()
	var plain []*nostr.Event
	for i := range 4 {
		plain = append(plain, f.sign(owner, 1111, fmt.Sprint("plain ", i), nil, 0))
	}
	batch := append([]*nostr.Event{locked}, plain...)
	results := f.submitTogether(batch)
	waitQueued(t, f.p, len(batch))
	g.open(t)

	for i := 1; i < len(batch); i++ {
		select {
		case r := <-results[i]:
			require.NoError(t, r.err)
			require.Equal(t, ingest.Stored, r.outcome)
		case <-time.After(30 * time.Second):
			t.Fatal("the rest of the group waited behind the locked event")
		}
	}
	select {
	case r := <-results[0]:
		t.Fatalf("the locked event was answered while the lock is held: %+v", r)
	default:
	}
	require.NoError(t, holder.Commit(f.ctx))
	r := <-results[0]
	require.NoError(t, r.err)
	require.Equal(t, ingest.Stored, r.outcome)
	require.Equal(t, int32(1), hooks.Load(), "the stored event's after-commit steps ran once")
	require.Equal(t, int32(1), rollbacks.Load(), "the rolled-back attempt's rollback steps ran, the committed one's did not")
}

// A full queue refuses at once with rate-limited: instead of making the
// publisher wait without bound.
//
// Mutation killed: a blocking send on the queue (the second event waits
// for the gate instead of being refused).
func TestGroupQueueFullIsRateLimited(t *testing.T) {
	t.Parallel()
	f := newFixture(t, "group-queue-full.example", 0)
	f.grouped(ingest.Options{GroupQueue: 1})
	key := f.key()
	queued := f.sign(key, 1111, "queued", nil, 0)
	refused := f.sign(key, 1111, "refused", nil, 0)

	g := f.holdWriter()
	queuedResult := f.submitTogether([]*nostr.Event{queued})[0]
	waitQueued(t, f.p, 1)
	refusedResult := f.submitTogether([]*nostr.Event{refused})[0]
	select {
	case r := <-refusedResult:
		var rej *ingest.Rejection
		require.True(t, errors.As(r.err, &rej), "want a refusal, got %+v", r)
		require.Equal(t, "rate-limited", rej.Prefix)
	case <-time.After(30 * time.Second):
		t.Fatal("a full queue made the publisher wait")
	}
	g.open(t)
	r := <-queuedResult
	require.NoError(t, r.err)
	require.Equal(t, ingest.Stored, r.outcome)
	require.Zero(t, f.count(`SELECT count(*) FROM events WHERE encode(id, 'hex') = $1`, refused.ID))
}

// Versions of one replaceable slot (plain inserts) and of one profile (a
// kind with its own Apply) race inside one group, in a known order, with a
// copy of one version: each gets the answer its place in the order gives it
// and exactly the newest version of each slot stays.
//
// Mutation killed: reading a run's insert results one place off (an event
// answered with its neighbour's outcome).
func TestGroupSlotRaceInsideOneGroup(t *testing.T) {
	t.Parallel()
	f := newFixture(t, "group-slots.example", 0)
	f.grouped(ingest.Options{GroupMax: 64})
	key := f.key()
	// created_at per position; ties go to the lowest id.
	ages := []int64{5, 9, 3, 9, 12, 1, 12, 7}
	var batch []*nostr.Event
	for _, kind := range []int{10002, 0} {
		for i, age := range ages {
			batch = append(batch, f.sign(key, kind, fmt.Sprintf(`{"name":"v%d"}`, i), nil, f.base+age))
		}
	}
	newest := batch[4] // of kind 10002: created_at +12, like batch[6]
	if batch[6].ID < newest.ID {
		newest = batch[6]
	}
	batch = append(batch, batch[2], newest) // copies: one replaced since, one the newest
	// Expected answers from the order alone.
	want := make([]ingest.Outcome, len(batch))
	heads := map[int]*nostr.Event{}
	seen := map[string]bool{}
	for i, ev := range batch {
		head := heads[ev.Kind]
		switch {
		case seen[ev.ID] && head == ev:
			want[i] = ingest.Duplicate
		case seen[ev.ID]: // replaced since: its row is gone
			want[i] = ingest.Superseded
		case head == nil || ev.CreatedAt > head.CreatedAt || (ev.CreatedAt == head.CreatedAt && ev.ID < head.ID):
			want[i] = ingest.Stored
			heads[ev.Kind] = ev
		default:
			want[i] = ingest.Superseded
		}
		seen[ev.ID] = true
	}

	g := f.holdWriter()
	results := make([]chan result, len(batch))
	for i, ev := range batch {
		results[i] = f.submitTogether([]*nostr.Event{ev})[0]
		waitQueued(t, f.p, i+1)
	}
	g.open(t)
	for i := range batch {
		r := <-results[i]
		require.NoError(t, r.err)
		require.Equal(t, want[i], r.outcome, "event %d (kind %d, created_at +%d)", i, batch[i].Kind, batch[i].CreatedAt-f.base)
	}
	for kind, head := range heads {
		var live []string
		rows, err := f.pool.Query(f.ctx, `SELECT encode(id, 'hex') FROM events WHERE community_id = $1 AND kind = $2 AND deleted_at IS NULL`, f.tenant.ID(), kind)
		require.NoError(t, err)
		for rows.Next() {
			var id string
			require.NoError(t, rows.Scan(&id))
			live = append(live, id)
		}
		require.NoError(t, rows.Err())
		require.Equal(t, []string{head.ID}, live, "kind %d keeps exactly its newest version", kind)
	}
}

// A group of plain events (the INSERT is all of each) is one round trip and
// one transaction. If one of them is refused, none of the group committed:
// the group is written again with a savepoint per event, so the others
// still commit together, stored and not "duplicate", and only the poison
// is refused.
//
// Mutations killed: sending the inserts with a Sync each, or in separate
// transactions (the group is not one transaction; with the poison, the
// inserts before it commit and their retry answers "duplicate"); reporting
// the group's failure to every event instead of writing it again; running
// every event alone after a refusal (five transactions, not one).
func TestGroupOfPlainEventsIsOneTransaction(t *testing.T) {
	t.Parallel()
	for _, poisoned := range []bool{false, true} {
		t.Run(fmt.Sprint("poisoned=", poisoned), func(t *testing.T) {
			t.Parallel()
			f := newFixture(t, "group-plain.example", 0)
			f.grouped(ingest.Options{})
			_, err := f.pool.Exec(f.ctx, `ALTER TABLE events ADD CONSTRAINT test_no_poison CHECK (content <> 'poison')`)
			require.NoError(t, err)
			f.recordTransactions()
			key := f.key()
			var plain []*nostr.Event
			for i := range 5 {
				plain = append(plain, f.sign(key, 1111, fmt.Sprint("plain ", i), nil, 0))
			}
			poison := f.sign(key, 1111, "poison", nil, 0)
			batch := append([]*nostr.Event{}, plain[:3]...)
			if poisoned {
				batch = append(batch, poison)
			}
			batch = append(batch, plain[3:]...)

			g := f.holdWriter()
			results := f.submitTogether(batch)
			waitQueued(t, f.p, len(batch))
			g.open(t)
			for i, ev := range batch {
				r := <-results[i]
				if ev == poison {
					var rej *ingest.Rejection
					require.True(t, errors.As(r.err, &rej), "the poison is refused, got %+v", r)
					require.Equal(t, "invalid", rej.Prefix)
					continue
				}
				require.NoError(t, r.err)
				require.Equal(t, ingest.Stored, r.outcome, "event %d", i)
			}
			require.Zero(t, f.count(`SELECT count(*) FROM events WHERE encode(id, 'hex') = $1`, poison.ID))
			require.Equal(t, 1, f.transactions(plain...), "the group's stored events commit in one transaction")
		})
	}
}

// A handler that panics inside a group fails its own event only: the
// process lives on, the group's other event is stored, and the writer keeps
// writing.
// Mutation killed: writeBody without the recover (the panic in the writer
// goroutine ends the test binary).
func TestGroupHandlerPanicFailsOnlyItsEvent(t *testing.T) {
	t.Parallel()
	f := newFixture(t, "group-panic.example", 0)
	f.grouped(ingest.Options{})
	key := f.key()
	boom := f.sign(key, 1, "boom", nil, 0)
	fine := f.sign(key, 1, "fine", nil, 0)
	f.p.RegisterSideRows(ingest.SideRows{
		Needs: func(ev *nostr.Event) bool { return ev.Kind == 1 },
		Apply: func(_ context.Context, w *ingest.Write) error {
			if w.Event.Content == "boom" {
				panic("a handler bug")
			}
			return nil
		},
	})
	g := f.holdWriter()
	results := f.submitTogether([]*nostr.Event{boom, fine})
	waitQueued(t, f.p, 2)
	g.open(t)
	require.Error(t, (<-results[0]).err, "the panicking event fails")
	r := <-results[1]
	require.NoError(t, r.err)
	require.Equal(t, ingest.Stored, r.outcome, "its group's other event is stored")
	require.Equal(t, ingest.Stored, must(f.submit(f.sign(key, 1, "after", nil, 0))), "the writer keeps writing")
	require.Zero(t, f.count(`SELECT count(*) FROM events WHERE content = 'boom'`))
}

func must(o ingest.Outcome, err error) ingest.Outcome {
	if err != nil {
		panic(err)
	}
	return o
}

// goroutineID is the running goroutine's number, read from its stack header
// ("goroutine 123 [running]: ...").
func goroutineID() string {
	buf := make([]byte, 64)
	buf = buf[:runtime.Stack(buf, false)]
	return strings.Fields(string(buf))[1]
}

// A lone event is written at once on its submitter's own goroutine: no
// hand-off to a writer goroutine and back (each a wake-up that a busy
// machine makes the publisher wait for), and no wait for a group to fill.
// Each is its own group, so each commits in its own transaction.
//
// Mutation killed: handing every event to another goroutine to write, as
// the dedicated writer goroutines did (the side row runs elsewhere).
func TestLoneEventIsWrittenByItsSubmitter(t *testing.T) {
	t.Parallel()
	f := newFixture(t, "group-lone.example", 0)
	f.grouped(ingest.Options{GroupWriters: 2})
	f.recordTransactions()
	ranOn := make(chan string, 1)
	f.p.RegisterSideRows(ingest.SideRows{
		Needs: func(ev *nostr.Event) bool { return ev.Kind == 1 },
		Apply: func(context.Context, *ingest.Write) error {
			ranOn <- goroutineID()
			return nil
		},
	})
	key := f.key()
	var events []*nostr.Event
	for i := range 3 {
		ev := f.sign(key, 1, fmt.Sprint("alone ", i), nil, 0)
		submitter := goroutineID()
		f.store(ev)
		require.Equal(t, submitter, <-ranOn, "event %d was written by its submitter's goroutine", i)
		events = append(events, ev)
	}
	plain := f.store(f.sign(key, 1111, "plain and alone", nil, 0))
	require.Equal(t, 4, f.transactions(append(events, plain)...), "each lone event is its own group")
	require.Zero(t, f.p.WaitingEvents())
}

// While a group is being written, new events wait, even with a second
// writer free: the writer takes everything waiting (up to the group size)
// as its next group. A second writer starts only when a whole group waits,
// and writes that group while the first is still busy.
//
// Mutations killed: a free writer writing an event alone while another
// writer is busy, as before (one of the first three is answered at once
// instead of waiting); no second writer at all (the whole group waits for
// the held one); the second writer taking the group one event at a time
// (four transactions instead of one).
func TestASecondWriterStartsOnlyForAWholeGroup(t *testing.T) {
	t.Parallel()
	f := newFixture(t, "group-second-writer.example", 0)
	const groupMax = 4
	f.grouped(ingest.Options{GroupWriters: 2, GroupMax: groupMax})
	f.recordTransactions()
	held := f.holdWriter()
	key := f.key()
	var batch []*nostr.Event
	for i := range groupMax {
		batch = append(batch, f.sign(key, 1111, fmt.Sprint("waits ", i), nil, 0))
	}

	results := f.submitTogether(batch[:groupMax-1])
	waitQueued(t, f.p, groupMax-1)
	requireUnanswered(t, results, "while a group was being written and less than a group waited")

	results = append(results, f.submitTogether(batch[groupMax-1:])...)
	requireStored(t, results, "no second writer took the whole group")
	require.Equal(t, 1, f.transactions(batch...), "the second writer wrote the waiting events as one group")
	select {
	case err := <-held.done:
		t.Fatalf("the held group finished first (%v): the group was not written beside it", err)
	default:
	}

	held.open(t)
	require.Equal(t, ingest.Stored, must(f.submit(f.sign(key, 1111, "after", nil, 0))), "the writers are free again")
	require.Zero(t, f.p.WaitingEvents())
}

// A second writer that has written its whole group does not go on with less
// than a whole group while the first writer is still busy: it ends, and the
// busy writer takes what waits as its next group, so the two do not split
// the waiting events between two commits for as long as the load lasts.
//
// Mutation killed: the second writer taking whatever waits after its group
// (the old rule: the two later events are written at once, beside the held
// group, instead of waiting for it).
func TestASecondWriterEndsAfterItsWholeGroup(t *testing.T) {
	t.Parallel()
	f := newFixture(t, "group-second-writer-ends.example", 0)
	const groupMax = 4
	f.grouped(ingest.Options{GroupWriters: 2, GroupMax: groupMax})
	f.recordTransactions()
	first := f.holdWriter()

	// A whole group, its first event a second gate: the second writer
	// starts for it and is held inside it.
	secondGate, second := f.gateEvent()
	go func() { _, err := f.submit(secondGate); second.done <- err }()
	waitQueued(t, f.p, 1)
	key := f.key()
	var whole []*nostr.Event
	for i := range groupMax - 1 {
		whole = append(whole, f.sign(key, 1111, fmt.Sprint("whole group ", i), nil, 0))
	}
	wholeResults := f.submitTogether(whole)
	second.waitReached(t)

	later := []*nostr.Event{f.sign(key, 1111, "later 0", nil, 0), f.sign(key, 1111, "later 1", nil, 0)}
	laterResults := f.submitTogether(later)
	waitQueued(t, f.p, len(later))

	second.open(t)
	requireStored(t, wholeResults, "the second writer never wrote its whole group")
	require.Never(t, func() bool { return f.p.WaitingEvents() != len(later) }, 300*time.Millisecond, 5*time.Millisecond,
		"the second writer took less than a whole group while the first was busy")
	requireUnanswered(t, laterResults, "before the busy writer was free")

	first.open(t)
	requireStored(t, laterResults, "the first writer never took the later events")
	require.Equal(t, 1, f.transactions(later...), "the first writer took the later events as one group")
	require.Zero(t, f.p.WaitingEvents())
}

// A queue shorter than a group makes a full queue a whole group: the second
// writer starts for it rather than never.
//
// Mutation killed: a group's size not bounded by the queue (the full queue
// waits for the held writer: times out).
func TestASecondWriterStartsForAFullQueue(t *testing.T) {
	t.Parallel()
	f := newFixture(t, "group-full-queue.example", 0)
	f.grouped(ingest.Options{GroupWriters: 2, GroupMax: 4, GroupQueue: 2})
	f.recordTransactions()
	held := f.holdWriter()
	key := f.key()
	full := []*nostr.Event{f.sign(key, 1111, "full 0", nil, 0), f.sign(key, 1111, "full 1", nil, 0)}
	requireStored(t, f.submitTogether(full), "the full queue started no second writer")
	require.Equal(t, 1, f.transactions(full...))
	held.open(t)
}

// A panicking OnGroup on a submitter's goroutine reaches that submitter
// (as any panic there does), but the writer it held is freed: the next
// event is written, not queued behind a writer that never comes.
//
// Mutation killed: the submitter's writer freed only after write returns
// (the next event waits forever: times out).
func TestAPanickingGroupHookFreesItsWriter(t *testing.T) {
	t.Parallel()
	f := newFixture(t, "group-hook-panic.example", 0)
	f.grouped(ingest.Options{})
	var panics atomic.Int32
	panics.Store(1)
	f.p.OnGroup = func(ingest.GroupStats) {
		if panics.Add(-1) == 0 {
			panic("hook")
		}
	}
	key := f.key()
	func() {
		defer func() { require.Equal(t, "hook", recover()) }()
		_, _ = f.submit(f.sign(key, 1111, "hook panics", nil, 0))
	}()
	done := make(chan result, 1)
	go func() {
		o, err := f.submit(f.sign(key, 1111, "after the panic", nil, 0))
		done <- result{o, err}
	}()
	select {
	case got := <-done:
		require.NoError(t, got.err)
		require.Equal(t, ingest.Stored, got.outcome)
	case <-time.After(30 * time.Second):
		t.Fatal("the next event still waits: the panicking hook left its writer counted")
	}
	require.Zero(t, f.p.WaitingEvents())
}

// A group of plain events is one INSERT statement, whatever its size, with
// the events of two communities and two copies of one event in it: each
// event still gets its own answer (the same event is stored once in each
// community; of the two copies in one community, one is the duplicate).
//
// Mutations killed: one INSERT per event (the statement count); matching
// the returned rows by event id alone (the second community's copy is
// answered as a duplicate); marking every copy of a returned row stored
// (two answers "stored" for one row).
func TestPlainGroupIsOneStatement(t *testing.T) {
	t.Parallel()
	f := newFixture(t, "group-one-statement.example", 0)
	f.grouped(ingest.Options{})
	other := f.community("group-one-statement-other.example")
	_, err := f.pool.Exec(f.ctx, `
		CREATE TABLE test_event_statements (n int);
		CREATE FUNCTION test_note_statement() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN INSERT INTO test_event_statements VALUES (1); RETURN NULL; END $$;
		CREATE TRIGGER test_note_statement AFTER INSERT ON events FOR EACH STATEMENT EXECUTE FUNCTION test_note_statement();`)
	require.NoError(t, err)
	key := f.key()
	var plain []*nostr.Event
	for i := range 4 {
		plain = append(plain, f.sign(key, 1111, fmt.Sprint("plain ", i), nil, 0))
	}
	g := f.holdWriter()
	type submission struct {
		tenant community.Tenant
		ev     *nostr.Event
	}
	subs := []submission{{f.tenant, plain[0]}, {other, plain[0]}, {f.tenant, plain[1]}, {f.tenant, plain[0]}, {f.tenant, plain[2]}, {other, plain[3]}}
	results := make([]chan result, len(subs))
	for i, s := range subs {
		results[i] = make(chan result, 1)
		go func() {
			o, err := f.p.Submit(f.ctx, s.tenant, s.ev.PubKey, s.ev)
			results[i] <- result{o, err}
		}()
		waitQueued(t, f.p, i+1) // in this order
	}
	g.open(t)
	want := []ingest.Outcome{ingest.Stored, ingest.Stored, ingest.Stored, ingest.Duplicate, ingest.Stored, ingest.Stored}
	for i := range subs {
		r := <-results[i]
		require.NoError(t, r.err)
		require.Equal(t, want[i], r.outcome, "submission %d", i)
	}
	// Two statements: the gate's own INSERT and the group's.
	require.Equal(t, 2, f.count(`SELECT count(*) FROM test_event_statements`), "one INSERT for the whole group")
	require.Equal(t, 2, f.count(`SELECT count(*) FROM events WHERE encode(id, 'hex') = $1`, plain[0].ID), "stored once in each community")
}

// OnGroup sees every group a writer takes: a lone event as a group of one
// that waited for nobody, and the events that queued behind a busy writer
// as one group, with how long its oldest waited. A group whose commit fails
// (here a deferred trigger refuses one event at COMMIT) is reported failed;
// its events then run alone, where only the poisoned one is refused, and
// each of those transactions is seen as a group of one.
//
// Mutations killed: OnGroup not called for a lone event (one group seen,
// not two); Failed never set; Waited left zero, or taken from the submit
// rather than the queue; Took not measured (the held gate's group took at
// least the hold); events run alone not observed (two groups, not seven);
// the failed group still counting the events it handed on (each counted
// twice).
func TestGroupStatsDescribeEveryGroup(t *testing.T) {
	t.Parallel()
	f := newFixture(t, "group-stats.example", 0)
	f.grouped(ingest.Options{GroupWriters: 1})
	var mu sync.Mutex
	var groups []ingest.GroupStats
	f.p.OnGroup = func(st ingest.GroupStats) {
		mu.Lock()
		defer mu.Unlock()
		groups = append(groups, st)
	}
	_, err := f.pool.Exec(f.ctx, `
		CREATE FUNCTION test_poison_at_commit() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN RAISE EXCEPTION 'poisoned at commit'; END $$;
		CREATE CONSTRAINT TRIGGER test_poison_at_commit AFTER INSERT ON events
		DEFERRABLE INITIALLY DEFERRED FOR EACH ROW WHEN (NEW.content = 'poison')
		EXECUTE FUNCTION test_poison_at_commit();`)
	require.NoError(t, err)

	const hold = 30 * time.Millisecond
	gate := f.holdWriter()
	key := f.key()
	batch := []*nostr.Event{f.sign(key, 1111, "poison", nil, 0)}
	for i := range 4 {
		batch = append(batch, f.sign(key, 1111, fmt.Sprint("queued ", i), nil, 0))
	}
	results := f.submitTogether(batch)
	waitQueued(t, f.p, len(batch))
	time.Sleep(hold) // every event of batch now waits at least this long
	gate.open(t)
	require.Error(t, (<-results[0]).err, "the poisoned event is refused when it runs alone")
	for i := 1; i < len(batch); i++ {
		r := <-results[i]
		require.NoError(t, r.err)
		require.Equal(t, ingest.Stored, r.outcome, "event %d", i)
	}

	mu.Lock()
	defer mu.Unlock()
	require.Len(t, groups, 2+len(batch), "the gate's group, the queued events' group, and each of its events run alone")
	lone, queued := groups[0], groups[1]
	for _, alone := range groups[2:] {
		require.Equal(t, ingest.GroupStats{Events: 1, Took: alone.Took}, alone, "an event run alone is a group of one that waited for no writer")
		require.Positive(t, alone.Took)
	}
	require.Equal(t, 1, lone.Events)
	require.Zero(t, lone.Waited, "the gate was written by its submitter at once")
	require.GreaterOrEqual(t, lone.Took, hold, "the gate's group was held open")
	require.False(t, lone.Failed)
	require.Zero(t, queued.Events, "the failed group settled none of its events: each ran alone")
	require.GreaterOrEqual(t, queued.Waited, hold, "the oldest queued event waited behind the gate")
	require.True(t, queued.Failed, "the poisoned COMMIT failed the whole group")
}
