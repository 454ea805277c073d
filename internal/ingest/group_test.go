package ingest_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

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
	done    chan error
}

// holdWriter submits an event whose side row waits for the gate to open,
// and returns once the writer is held inside that event's group.
func (f *fixture) holdWriter() *gate {
	f.t.Helper()
	ev := f.sign(f.key(), 1, "gate", nostr.Tags{{"t", "gate"}}, 0)
	g := &gate{release: make(chan struct{}), done: make(chan error, 1)}
	reached := make(chan struct{})
	f.p.RegisterSideRows(ingest.SideRows{
		Needs: func(e *nostr.Event) bool { return e.ID == ev.ID },
		Apply: func(context.Context, *ingest.Write) error {
			close(reached)
			<-g.release
			return nil
		},
	})
	go func() { _, err := f.submit(ev); g.done <- err }()
	select {
	case <-reached:
	case err := <-g.done:
		f.t.Fatalf("the gate event finished before its side row: %v", err)
	}
	return g
}

func (g *gate) open(t *testing.T) {
	close(g.release)
	require.NoError(t, <-g.done)
}

// waitQueued waits until n events wait for a group writer.
func waitQueued(t *testing.T, p *ingest.Pipeline, n int) {
	t.Helper()
	require.Eventually(t, func() bool { return ingest.QueuedEvents(p) == n },
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

	var afterCommit sync.Map
	f.p.RegisterSideRows(ingest.SideRows{
		Needs: func(ev *nostr.Event) bool { return ev.Kind == 1 && ev.Content != "gate" },
		Apply: func(_ context.Context, w *ingest.Write) error {
			id := w.Event.ID
			w.AfterCommit(func() {
				n, _ := afterCommit.LoadOrStore(id, new(atomic.Int32))
				n.(*atomic.Int32).Add(1)
			})
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
}

func requireRejection(t *testing.T, err error, want string) {
	t.Helper()
	var rej *ingest.Rejection
	require.True(t, errors.As(err, &rej), "want rejection %q, got %v", want, err)
	require.Equal(t, want, rej.Error())
}
